// tools/launcher.hpp — `tessera run`: start N local ranks of a program with a
// torchrun-style environment and supervise them.
//
// Each rank r gets RANK=r, WORLD_SIZE=N, LOCAL_RANK=r, LOCAL_WORLD_SIZE=N,
// MASTER_ADDR, MASTER_PORT (a free port unless given), TESSERA_JOB_SECRET
// (the caller's if set, else 256 fresh random bits in hex: the bootstrap's
// authentication key, runtime/bootstrap.hpp), TESSERA_RUN_ID (fresh per run:
// marks the job's processes), and
// NCCL_NVLS_ENABLE=0, NVSHMEM_DISABLE_NVLS=1, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, CUDA_MODULE_LOADING=EAGER
// unless the caller already set them. stdin is /dev/null.
//
// No process outlives the job:
//  - each rank runs in its own process group; the launcher signals whole
//    groups (a rank and the children that stay in its group);
//  - the launcher is a child subreaper (PR_SET_CHILD_SUBREAPER): descendants
//    orphaned while it runs (a rank's children after the rank exits,
//    double-forked or setsid daemons) are re-parented to it; when the job
//    ends — success, failure or a forwarded signal — it SIGKILLs the ranks'
//    groups, every adopted descendant and every process whose environment
//    holds this run's TESSERA_RUN_ID, and reaps them (bounded: 2 s);
//  - each rank has PR_SET_PDEATHSIG = SIGKILL, so it dies with the launcher;
//    and a watchdog process (own process group, forked before the ranks)
//    notices a launcher killed by SIGKILL (its pipe closes) and SIGKILLs the
//    ranks' groups and every process carrying TESSERA_RUN_ID.
//  Not covered after a SIGKILL of the launcher: a descendant that left its
//  rank's process group AND started from a cleared environment (e.g.
//  `setsid env -i prog`), or one whose /proc/<pid>/environ the watchdog may
//  not read (another user). Also not covered: SIGKILL of the watchdog and
//  the launcher together (e.g. `kill -9` of both), which only a cgroup could
//  survive. run_local assumes the calling process starts no other children
//  while it runs (it is the `tessera run` command's body).
//
// Output: every line of a rank's stdout (stderr) goes to the launcher's
// stdout (stderr) as "[rank R] line", written whole, so lines of different
// ranks never mix within a line. A final line without newline gets one.
//
// Failure: when a rank exits non-zero or is killed by a signal, the launcher
// prints "tessera run: rank R exited with code C; stopping the other ranks",
// sends SIGTERM to the others, SIGKILL after a grace period
// (TESSERA_RUN_GRACE_MS, default 5000), and returns the failing rank's code
// (128 + signal number for a signal). SIGINT/SIGTERM/SIGHUP received by the
// launcher are forwarded to every rank (then SIGKILL after the grace period);
// it then returns 128 + that signal. All ranks exit 0 -> 0. A program that
// cannot be executed -> message and 127, with no rank left running.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace tessera::tools {

struct RunOptions {
  int nprocs = 0;  // >= 1
  std::string master_addr = "127.0.0.1";
  int master_port = 0;               // 0 = pick a free port
  std::vector<std::string> command;  // program (found through PATH) and its arguments
  std::chrono::milliseconds grace{5000};
};

/// Parses -n: a positive integer, or "auto" = visible GPUs (cudaGetDeviceCount;
/// 2 if that fails or finds fewer than 2). Throws tessera::Error otherwise.
int parse_nprocs(const std::string& text);

/// Starts and supervises the ranks; returns the launcher's exit code.
/// Throws tessera::Error for invalid options (before anything starts).
int run_local(const RunOptions& options);

}  // namespace tessera::tools
