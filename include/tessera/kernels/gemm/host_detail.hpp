// tessera/kernels/gemm/host_detail.hpp — host helpers shared by the GEMM
// launch templates (launch.cuh) and src/kernels; not part of the stable API.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "tessera/kernels/gemm.hpp"

namespace tessera::kernels::detail {

/// Throws tessera::Error with `msg` (for CUDA translation units, which cannot
/// use TESSERA_CHECK's fmt format strings under nvcc).
[[noreturn]] void fail(const std::string& msg);
/// Throws tessera::Error naming `what` unless rc == cudaSuccess.
void cuda_check(cudaError_t rc, const char* what);
/// validate_inputs + the instantiation matches args (layout, input type) and
/// max_ctas >= 0.
void check_instantiation(const GemmArgs& a, BLayout layout, DType in, int max_ctas);
/// Validates A/B/shape only (not D): used when the epilogue owns the output.
void validate_inputs(const GemmArgs& a, const char* op);
/// TMA descriptors for A ([M, K], box 64 x bm) and B (box 64 x bn for NK,
/// 64 x 64 chunks for KN), 128-byte swizzle, zero fill out of bounds.
void make_tma_a(const GemmArgs& a, int bm, CUtensorMap* out);
void make_tma_b(const GemmArgs& a, int bn, CUtensorMap* out);
/// Whether the TMA-store epilogues may store a 16-bit [rows, cols] output
/// (row stride ldd, 16-byte aligned) through shared memory, and if so its
/// TMA descriptor in `out`: box box_cols x box_rows (the kernels'
/// kTmaStoreBoxCols x kTmaStoreBoxRows), 64-byte swizzle. Not where
/// cols % 8 != 0 (bulk stores wrote into the rows' padding past the last
/// column: TmaStoreEpilogue), rows == 0, or TESSERA_GEMM_TMA_STORE=0.
bool make_tma_store_map(void* d, DType t, int64_t rows, int64_t cols, int64_t ldd, int box_rows, int box_cols,
                        CUtensorMap* out);
/// Whether the TMA-store epilogues store through shared memory: on unless
/// TESSERA_GEMM_TMA_STORE=0 (read once per process; A/B in one build).
bool tma_store_enabled();
/// Multiprocessor count of the current device (cached per device).
int sm_count();
/// Raises the dynamic shared memory limit of the kernel whose host stub is
/// `kernel` to `smem` bytes on the current device, once per (stub, device):
/// a driver call per launch costs ~10 us of host time, which a GPU starting
/// a small problem idle waits for. Keyed by the stub's address, not by a
/// static of the launching template: a kernel instantiated in two modules
/// (the library and a test, say) has a stub, and a limit, in each, while a
/// template's static may be shared between them.
void set_max_dynamic_smem_once(const void* kernel, int smem, const char* what);

/// Whether the plain kernels are launched as programmatic dependents
/// (launch.cuh): on unless TESSERA_GEMM_PDL=0 (read once per process).
bool dependent_launch_enabled();
/// Throws tessera::Error naming `what` if the last launch failed.
void check_launch(const char* what);
/// Stream-ordered device memory for split-K partials, from a memory pool of
/// the current device that keeps its memory (no allocation cost in steady
/// state, safe across streams). Release with release_workspace on the same stream.
void* acquire_workspace(size_t bytes, cudaStream_t stream);
void release_workspace(void* p, cudaStream_t stream);

/// Stream-K's workspace of `stream` on the current device: `slot_bytes`
/// per SM (f32 partial tiles) followed by one uint64_t flag per SM, all
/// flags zero. Allocated on the stream's first stream-K call and kept for
/// the process, so a call pays no allocation and no memset: the kernel
/// leaves every flag zero again (each reducer clears the flags it waited
/// for). Like cuBLAS's workspace, it belongs to the stream: work captured
/// into a graph from `stream` uses it too, so such graphs must not run
/// concurrently with each other or with `stream`. Throws if `slot_bytes`
/// exceeds what the stream's buffer was made for (the largest tile's).
struct StreamKWorkspace {
  float* slots = nullptr;
  uint64_t* flags = nullptr;
};
StreamKWorkspace stream_k_workspace(cudaStream_t stream, size_t slot_bytes);

}  // namespace tessera::kernels::detail
