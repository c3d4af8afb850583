// tessera/signal/unreorder.hpp — post-communication kernels: read the
// received, reordered buffer through a map's gather interface (reorder.hpp,
// a2a.hpp) and write the output in its natural order; optionally fused with
// RMSNorm (the elementwise kernel that follows the collective).
//
//   unreorder:          out[r, c] = recv[map.chunk_offset(r, c / BN) + c % BN]
//   rmsnorm_unreorder:  x = that row; out[r, :] = x * rsqrt(mean(x^2) + eps) * w
//
// Loads and stores are 16-byte vectors; math in fp32. Requirements (checked,
// tessera::Error before any launch): dtype bf16 or f16 (unreorder also f32);
// BN, N and ld_out multiples of 16 bytes' worth of elements; recv, out and
// weight 16-byte aligned device pointers; for A2aRecvMap, chunk_src in
// device memory. `ld_out` is the output row stride in elements.
// Stream-ordered; no synchronization inside.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/runtime/dtype.hpp"
#include "tessera/signal/a2a.hpp"
#include "tessera/signal/reorder.hpp"

namespace tessera::signal {

void unreorder(const ArMap& map, const void* recv, void* out, std::int64_t ld_out, DType dtype, cudaStream_t stream);
void unreorder(const RsShard& map, const void* recv, void* out, std::int64_t ld_out, DType dtype, cudaStream_t stream);
void unreorder(const A2aRecvMap& map, const void* recv, void* out, std::int64_t ld_out, DType dtype,
               cudaStream_t stream);
void unreorder(const RowMajorMap& map, const void* recv, void* out, std::int64_t ld_out, DType dtype,
               cudaStream_t stream);

void rmsnorm_unreorder(const ArMap& map, const void* recv, const void* weight, void* out, std::int64_t ld_out,
                       float eps, DType dtype, cudaStream_t stream);
void rmsnorm_unreorder(const RsShard& map, const void* recv, const void* weight, void* out, std::int64_t ld_out,
                       float eps, DType dtype, cudaStream_t stream);
void rmsnorm_unreorder(const A2aRecvMap& map, const void* recv, const void* weight, void* out, std::int64_t ld_out,
                       float eps, DType dtype, cudaStream_t stream);
/// Plain RMSNorm (RowMajorMap): the baseline the fused kernels are compared to.
void rmsnorm_unreorder(const RowMajorMap& map, const void* recv, const void* weight, void* out, std::int64_t ld_out,
                       float eps, DType dtype, cudaStream_t stream);

}  // namespace tessera::signal
