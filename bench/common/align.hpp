// bench/common/align.hpp — start the ranks' timed work together.
//
// A host barrier releases the ranks tens of microseconds apart, and that
// skew lands in every timed figure whose work waits for another rank (NCCL,
// the fused operators) but not in the GEMM-alone figures. align_ranks
// enqueues a one-element all-reduce on `stream`: it completes on all ranks
// within a few microseconds of each other, so work enqueued after it (and a
// start event recorded after it) begins aligned across ranks.
#pragma once

#include <cuda_runtime_api.h>

#include "tessera/runtime/process_group.hpp"

namespace tessera::bench {

/// Collective (every rank, same order). Not timed itself: call it before
/// recording the start event.
void align_ranks(runtime::ProcessGroup& pg, cudaStream_t stream);

}  // namespace tessera::bench
