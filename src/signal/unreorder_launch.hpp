// Internal: kernel launchers of unreorder.cu, called by unreorder.cpp after
// it has validated the arguments. They return the launch's cudaError_t: the
// .cu files include no fmt (nvcc + fmt 9 in C++20 mode do not compile).
// `sms`: SM count of the current device (sizes the grid).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/runtime/dtype.hpp"
#include "tessera/signal/a2a.hpp"
#include "tessera/signal/reorder.hpp"

namespace tessera::signal::detail {

template <class Map>
cudaError_t launch_unreorder(const Map& map, const void* recv, void* out, std::int64_t ld_out, DType dtype, int sms,
                             cudaStream_t stream);
template <class Map>
cudaError_t launch_rmsnorm_unreorder(const Map& map, const void* recv, const void* weight, void* out,
                                     std::int64_t ld_out, float eps, DType dtype, int sms, cudaStream_t stream);

}  // namespace tessera::signal::detail
