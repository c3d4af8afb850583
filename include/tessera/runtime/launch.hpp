// tessera/runtime/launch.hpp — who am I in the job: rank, world size, local
// rank and the rendezvous address, read from the launcher's environment.
//
// Conventions, in order of precedence (the innermost launcher wins, so
// `torchrun` or `tessera run` inside an `srun`/`mpirun` allocation works):
//
//  1. torchrun / `tessera run`: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//     MASTER_ADDR, MASTER_PORT. Detected when any of the first four is set.
//     RANK and WORLD_SIZE must both be set. LOCAL_RANK and LOCAL_WORLD_SIZE
//     come as a pair; when both are absent the job is taken to be on one node
//     (local_rank = rank, local_world = world).
//  2. Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE (all four
//     required once OMPI_COMM_WORLD_RANK or _SIZE is set).
//  3. SLURM: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (all required once
//     SLURM_PROCID is set); tasks on this node from SLURM_NTASKS_PER_NODE,
//     else SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE (format
//     "4(x2),3", indexed by SLURM_NODEID), else the whole job on one node.
//  4. None of them: a single process, rank 0 of 1 (source "single").
//
// Rendezvous when world > 1: MASTER_ADDR and MASTER_PORT if set (any
// convention). Fallbacks when they are not set:
//  - SLURM: address = 127.0.0.1 if the job has one node (SLURM_NNODES = 1 or
//    all tasks local), else the first host of SLURM_STEP_NODELIST /
//    SLURM_JOB_NODELIST / SLURM_NODELIST; port = 20000 + SLURM_JOB_ID % 20000.
//  - Open MPI: address = 127.0.0.1 if all ranks are local; port derived from
//    a hash of PMIX_NAMESPACE or OMPI_MCA_ess_base_jobid into [20000, 40000).
//  - torchrun: none; both are required.
// Job secret (authenticates the bootstrap's hello both ways; see
// runtime/bootstrap.hpp), when world > 1, in order:
//  - TESSERA_JOB_SECRET, if set: at least 16 characters (`tessera run` sets
//    64 hex digits from getrandom(), a fresh 256-bit secret per job). Under
//    torchrun / SLURM / mpirun, export one value to every rank yourself
//    (e.g. `export TESSERA_JOB_SECRET=$(openssl rand -hex 32)` in the job
//    script) to get real authentication.
//  - otherwise a value derived from what the job has: torchrun's
//    TORCHELASTIC_RUN_ID, SLURM_JOB_ID + SLURM_STEP_ID, or Open MPI's
//    PMIX_NAMESPACE / OMPI_MCA_ess_base_jobid, together with the rendezvous
//    address and world size. Such a value is NOT a secret (any local user can
//    read or guess it): it only keeps two jobs, or a stray tool, from talking
//    to each other by accident on a shared MASTER_PORT. It does not stop a
//    local attacker. secret_derived says which case applies.
// Anything inconsistent, partial or malformed (rank >= world, world <= 0,
// RANK without WORLD_SIZE, a port outside 1..65535, no rendezvous address
// when world > 1, ...) is a tessera::Error naming the variable and its value.
#pragma once

#include <string>

namespace tessera::runtime {

struct LaunchInfo {
  int rank = 0, world = 1, local_rank = 0, local_world = 1;
  std::string master_addr;  // rendezvous host (rank 0 listens there)
  int master_port = 0;
  std::string source;  // "torchrun" | "slurm" | "openmpi" | "single"
  /// Key of the bootstrap's challenge/response (see the file comment); empty
  /// for a single process. Bootstrap::connect replaces an empty key by
  /// TESSERA_JOB_SECRET if set, else by one derived from the rendezvous
  /// address (no protection beyond accidents).
  std::string job_secret;
  /// Where job_secret came from: "TESSERA_JOB_SECRET" or "derived from <vars>".
  std::string secret_source;
  /// True when job_secret was derived from job ids rather than given.
  bool secret_derived = false;
};

/// Reads the launch environment of this process (see the file comment).
/// Throws tessera::Error on an inconsistent or malformed environment.
LaunchInfo detect_launch_info();

}  // namespace tessera::runtime
