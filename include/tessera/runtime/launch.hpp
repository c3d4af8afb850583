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
};

/// Reads the launch environment of this process (see the file comment).
/// Throws tessera::Error on an inconsistent or malformed environment.
LaunchInfo detect_launch_info();

}  // namespace tessera::runtime
