#include "common/align.hpp"

#include <nccl.h>

#include "tessera/runtime/error.hpp"

namespace tessera::bench {

void align_ranks(runtime::ProcessGroup& pg, cudaStream_t stream) {
  // One float per process, allocated at first use and kept (the value is
  // never read: only the all-reduce's completion matters).
  static float* token = [] {
    float* p = nullptr;
    TESSERA_CUDA_CHECK(cudaMalloc(&p, sizeof(float)));
    TESSERA_CUDA_CHECK(cudaMemset(p, 0, sizeof(float)));
    return p;
  }();
  TESSERA_NCCL_CHECK(ncclAllReduce(token, token, 1, ncclFloat, ncclSum, pg.nccl(), stream));
}

}  // namespace tessera::bench
