/* tessera/capi/tessera.h — a plain C interface to Tessera's tensor-parallel
 * operators, for callers that are not C++ (python/tessera_torch.py loads it
 * with ctypes; libtessera_c.so).
 *
 * A session is one rank's process group plus its TpContext. Every function
 * returns 0 on success or -1 on failure; tessera_last_error() then holds the
 * message (thread-local; the operators' tessera::Error text, which names the
 * offending argument). Nothing is launched when an argument is rejected.
 *
 * Streams: the operators run on tessera_session_stream(); a caller that works
 * on another stream orders itself against it (PyTorch: wrap it with
 * torch.cuda.ExternalStream and make it current).
 *
 * Rendezvous: rank 0 listens on master_addr:master_port (TCP). Under torchrun
 * pass a port other than MASTER_PORT, which torch's own store holds.
 */
#ifndef TESSERA_CAPI_TESSERA_H
#define TESSERA_CAPI_TESSERA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tessera_session tessera_session;

/* dtype codes */
enum { TESSERA_BF16 = 0, TESSERA_F16 = 1 };
/* strategy codes (ops::Strategy) */
enum {
  TESSERA_AUTOMATIC = 0,
  TESSERA_SEQUENTIAL = 1,
  TESSERA_DECOMPOSITION = 2,
  TESSERA_FUSED_CE = 3,
  TESSERA_FUSED_SM = 4,
  TESSERA_RING = 5
};

const char* tessera_last_error(void);

/* Collective over all ranks: connects, creates NCCL communicators and the
 * symmetric heap on `device` (-1: local_rank). */
int tessera_session_create(int rank, int world, int local_rank, int local_world, int device, const char* master_addr,
                           int master_port, tessera_session** out);
/* Collective (every rank must call it): waits for the device to finish its
 * queued work, then frees the session. */
void tessera_session_destroy(tessera_session* s);
/* cudaStream_t the operators are queued on. */
void* tessera_session_stream(tessera_session* s);
/* Whether `automatic` reads and writes the on-disk choice cache (default 1;
 * 0: tune afresh in this process, as the benchmarks do). */
void tessera_session_use_cache(tessera_session* s, int on);

/* D[M, N] = AllGather(A shard [m_local, K]) · B[N, K]ᵀ; swiglu: B holds gate
 * and up rows interleaved per ops::AgGemmArgs and D is [M, N/2]. Packed rows
 * when ld* is 0. */
int tessera_ag_gemm(tessera_session* s, const void* a, const void* b, void* d, int64_t m, int64_t m_local, int64_t n,
                    int64_t k, int64_t ldd, int dtype, int swiglu, int strategy);
/* D[m_local, N] = this rank's rows of ReduceScatter(A[M, K] · B[N, K]ᵀ). */
int tessera_gemm_rs(tessera_session* s, const void* a, const void* b, void* d, int64_t m, int64_t m_local, int64_t n,
                    int64_t k, int dtype, int strategy);
/* D[M, N] = AllReduce(A[M, K] · B[N, K]ᵀ): the full sum on every rank
 * (bitwise equal across ranks with fused_ce). Strategies: sequential,
 * fused_ce, automatic. */
int tessera_gemm_ar(tessera_session* s, const void* a, const void* b, void* d, int64_t m, int64_t n, int64_t k,
                    int dtype, int strategy);
/* The whole TP MLP layer: out[m_local, H] = this rank's rows of
 * ReduceScatter(SiLU(gate)·up(AllGather(x) · w_gate_up[2·I_local, H]ᵀ) ·
 * w_down[H, I_local]ᵀ); x is this rank's [m_local, H] token shard, m the
 * total tokens. Strategies per half (ag_strategy, rs_strategy). */
int tessera_mlp(tessera_session* s, const void* x, const void* w_gate_up, const void* w_down, void* out, int64_t m,
                int64_t m_local, int64_t h, int64_t i_local, int dtype, int ag_strategy, int rs_strategy);
/* The strategy `automatic` resolves to for this shape (tunes if needed;
 * collective). *out receives a strategy code. op: 0 ag_gemm, 1 gemm_rs. */
int tessera_resolve(tessera_session* s, int op, int64_t m, int64_t m_local, int64_t n, int64_t k, int dtype,
                    int swiglu, const void* a, const void* b, void* d, int* out);

#ifdef __cplusplus
}
#endif
#endif
