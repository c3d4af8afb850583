// tests/kernels/gemm_policy_kernels.hpp — policy-instantiated GEMMs and
// helper kernels for the GEMM tests, compiled in gemm_policy_kernels.cu (no
// fmt there: see tessera/kernels/gemm/launch.cuh). All bf16 inputs, bf16
// output, B as [N, K], unless stated.
//
// Tiles: T128x256 (also with cluster 2), T256x128 (cooperative kernels), or
// T128x128, which here selects the PING-PONG 128x128 kernel
// (GemmOptions::ping_pong): every policy is tested on it too.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/kernels/gemm.hpp"

namespace tessera::kernels::testk {

/// Explicit tile order: order[pos] = tile_m * tiles_n + tile_n.
void gemm_permuted(const GemmArgs& a, GemmTile t, const int* d_order, int max_ctas, cudaStream_t s);
/// FlagWait over A rows (rows_per_flag) at .gpu scope. cluster: 1, or 2
/// (2-CTA clusters, 128x256 tile only).
void gemm_flag_wait(const GemmArgs& a, GemmTile t, const uint32_t* flags, int rows_per_flag, uint32_t expected,
                    uint64_t timeout_ns, int max_ctas, cudaStream_t s, int cluster = 1);
/// StdEpilogue with kEpiNotify (.gpu); tile_to_flag may be null (per-tile flags).
void gemm_notify(const GemmArgs& a, GemmTile t, uint32_t* flags, const int* tile_to_flag, int max_ctas, cudaStream_t s,
                 int cluster = 1);
/// StdEpilogue with kEpiReorder: tile -> slot, dense bm x bn blocks in a.d.
void gemm_reorder(const GemmArgs& a, GemmTile t, const int* reorder, cudaStream_t s);
/// D = A·B + C (C bf16, row stride ldc).
void gemm_add_partial(const GemmArgs& a, GemmTile t, const void* c, int64_t ldc, cudaStream_t s);
/// D = A·B + bias (bias bf16 [N]).
void gemm_bias(const GemmArgs& a, GemmTile t, const void* bias, cudaStream_t s);
/// D[:, j] = SiLU(acc[:, 2j]) * acc[:, 2j+1]; a.d is [M, N/2] with row stride a.ldd.
void gemm_swiglu(const GemmArgs& a, GemmTile t, cudaStream_t s);
/// Peer store + .sys notify (the d pointer and flags may live on another GPU).
void gemm_peer_notify_sys(const GemmArgs& a, GemmTile t, uint32_t* flags, cudaStream_t s);

/// Loads the helper kernels' module now. With lazy loading (the CUDA 12+
/// default) a kernel's first launch loads its module, which waits for running
/// kernels: a helper launched first while the GEMM spins on it would deadlock.
void preload_helpers();

/// On stream s: sleeps ~delay_ns, then for each chunk c copies rows
/// [c*rows, (c+1)*rows) of src into dst (bf16, row length k, row stride ld)
/// and release-stores flags[c] = value (.gpu scope).
void release_chunks(const void* src, void* dst, int64_t m, int64_t k, int64_t ld, int rows, uint32_t* flags,
                    uint32_t value, uint64_t delay_ns, cudaStream_t s);
/// One thread block per tile slot group: for every tile t (linear id), spins
/// (acquire .gpu) until flags[t] >= expected, then copies tile t of d (bf16,
/// [m, n], row stride ldd, tile bm x bn) into copy. Times out after timeout_ns
/// and records failure in *status (0 ok, 1 timeout).
void observe_tiles(const uint32_t* flags, uint32_t expected, const void* d, void* copy, int64_t m, int64_t n,
                   int64_t ldd, int bm, int bn, uint64_t timeout_ns, int* status, int blocks, cudaStream_t s);

}  // namespace tessera::kernels::testk
