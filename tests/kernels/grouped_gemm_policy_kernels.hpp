// tests/kernels/grouped_gemm_policy_kernels.hpp — grouped GEMMs with hooks
// (compiled in grouped_gemm_policy_kernels.cu) for grouped_gemm_test.cpp.
// bf16 in/out, B [G, N, K]; ping_pong selects PingPong128x128, else
// Coop128x256.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/kernels/grouped_gemm.hpp"

namespace tessera::kernels::testk {

/// GroupedEpilogue with kEpiNotify: flags[group] (per_group) or flags[tile
/// position] += 1 after each tile is stored.
void grouped_notify(const GroupedGemmArgs& a, bool ping_pong, uint32_t* flags, bool per_group, cudaStream_t s);
/// FlagWait prologue over stacked A rows (one flag per rows_per_flag rows).
void grouped_flag_wait(const GroupedGemmArgs& a, bool ping_pong, const uint32_t* flags, int rows_per_flag,
                       uint32_t expected, uint64_t timeout_ns, cudaStream_t s);
/// On stream s: sleeps ~delay_ns, then flags[0 .. count) += value (release, .gpu).
void release_after(uint32_t* flags, int count, uint32_t value, uint64_t delay_ns, cudaStream_t s);

}  // namespace tessera::kernels::testk
