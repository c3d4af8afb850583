/* tessera/capi/tessera.h — a plain C interface to Tessera's tensor-,
 * sequence- and expert-parallel operators, for callers that are not C++ (the `tessera`
 * Python package loads it with ctypes; libtessera_c.so).
 *
 * A session is one rank's process group plus its TpContext (and, when every
 * rank is load/store reachable, its SpAttnContext). Every function returns 0
 * on success or -1 on failure; tessera_last_error() then holds the message (thread-local; the operators' tessera::Error
 * text, which names the offending argument). Nothing is launched when an argument is rejected.
 *
 * Streams: the *_ex operators take the caller's cudaStream_t (0 is the
 * legacy default stream, which is what PyTorch's default stream is) and are
 * ordered inside it: they start after the caller's work so far and the
 * caller's later work follows them (an event each way). The older entry
 * points run on tessera_session_stream(); a caller that works on another
 * stream orders itself against it.
 *
 * Sessions: tessera_session_create_from_id builds one from an NCCL unique id
 * the caller made with tessera_nccl_unique_id on one rank and handed to the
 * others (e.g. a torch.distributed broadcast over its process group): no
 * port is opened, and several sessions over several groups can live in one
 * process. tessera_session_create rendezvouses itself: rank 0 listens on
 * master_addr:master_port (TCP); under torchrun pass a port other than
 * MASTER_PORT, which torch's own store holds.
 */
#ifndef TESSERA_CAPI_TESSERA_H
#define TESSERA_CAPI_TESSERA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tessera_session tessera_session;

/* dtype codes (TESSERA_F32: the MoE router's logits only) */
enum { TESSERA_BF16 = 0, TESSERA_F16 = 1, TESSERA_F32 = 2 };
/* strategy codes (ops::Strategy) */
enum {
  TESSERA_AUTOMATIC = 0,
  TESSERA_SEQUENTIAL = 1,
  TESSERA_DECOMPOSITION = 2,
  TESSERA_FUSED_CE = 3,
  TESSERA_FUSED_SM = 4,
  TESSERA_RING = 5,
  TESSERA_ULYSSES = 6,
  TESSERA_PIPELINED = 7, /* the MoE layers only (ops 4 and 5) */
  TESSERA_TWO_LEVEL = 8  /* sp_attention only (op 3): Ulysses inside groups, ring across */
};

/* The strategy table (ops::strategy_table): the name of a strategy code, or
 * NULL for a code that names none; and whether an operator takes a strategy
 * (op: 0 ag_gemm, 1 gemm_rs, 2 gemm_ar, 3 sp_attention, 4 moe_tp, 5 moe_ep;
 * 1 yes, 0 no). */
const char* tessera_strategy_name(int code);
int tessera_strategy_accepts(int op, int code);

/* Size of an NCCL unique id (ncclUniqueId). */
#define TESSERA_UNIQUE_ID_BYTES 128

const char* tessera_last_error(void);
/* The library's version ("MAJOR.MINOR.PATCH", from the VERSION file). */
const char* tessera_version(void);
/* NCCL_VERSION_CODE of the header it was built with and ncclGetVersion() of
 * the library the loader picked (e.g. 22809 = 2.28.9). They must be equal. */
int tessera_nccl_versions(int* header, int* runtime);
/* Writes a fresh NCCL unique id (bytes == TESSERA_UNIQUE_ID_BYTES) to out. */
int tessera_nccl_unique_id(void* out, int bytes);
/* Collective over the `world` ranks that received the same id: creates the
 * NCCL communicator (blocking until all joined), the device communicator and
 * the operator context on `device`. Host-side exchanges (shape checks,
 * tuning) then run over NCCL, each bounded by timeout_ms (0: the default,
 * TESSERA_BOOTSTRAP_TIMEOUT_MS or 60 s). */
int tessera_session_create_from_id(int rank, int world, int device, const void* id, int id_bytes, int timeout_ms,
                                   tessera_session** out);

/* Collective over all ranks: connects, creates NCCL communicators and the
 * symmetric heap on `device` (-1: local_rank). */
int tessera_session_create(int rank, int world, int local_rank, int local_world, int device, const char* master_addr,
                           int master_port, tessera_session** out);
/* Collective (every rank must call it): waits for the device to finish its
 * queued work, then frees the session. */
void tessera_session_destroy(tessera_session* s);
/* Aborts the session's communicator (after a peer failed); destroy it then. */
void tessera_session_abort(tessera_session* s);
/* The session's rank, world size, CUDA device, and whether every rank is
 * load/store reachable (1) — -1 / 0 for a null session. */
int tessera_session_rank(const tessera_session* s);
int tessera_session_world(const tessera_session* s);
int tessera_session_device(const tessera_session* s);
int tessera_session_lsa_reachable(const tessera_session* s);
/* cudaStream_t the non-_ex operators are queued on. */
void* tessera_session_stream(tessera_session* s);
/* Whether `automatic` reads and writes the on-disk choice cache (default 1;
 * 0: tune afresh in this process, as the benchmarks do). */
void tessera_session_use_cache(tessera_session* s, int on);
/* What `automatic` does for a shape never measured (default 1): 1 measures
 * the candidates now (a collective pass inside the call); 0 reuses the
 * nearest measured shape's choice, or sequential (ops/tuner.hpp).
 * tessera_resolve always measures. */
void tessera_session_tune_on_miss(tessera_session* s, int on);
/* Workspace bytes per rank that sp_attention may use beyond its shards (0,
 * the default: no limit; SpAttnOptions::workspace_limit_bytes): automatic
 * chooses among the strategies that fit, and an explicit strategy over it
 * fails before launch. Every rank the same. */
void tessera_session_sp_workspace_limit(tessera_session* s, uint64_t bytes);
/* sp_attention's two_level Ulysses degree u (ranks per group; the ring runs
 * across R / u groups): a divisor of R dividing heads_q and heads_kv, checked
 * by the call; 0, the default, chooses (SpAttnOptions::two_level_inner).
 * Every rank the same. */
void tessera_session_sp_two_level_inner(tessera_session* s, int inner);

/* Operator flags (the ag_gemm entry points' `swiglu` word, tessera_gemm_rs_ex2's
 * and tessera_resolve's `swiglu`); a bit an entry point does not take is
 * rejected (-1, tessera_last_error names the flags), before any other use:
 *   TESSERA_AG_SWIGLU  ag_gemm only: B holds gate and up rows interleaved per
 *                      ops::AgGemmArgs and D is [M, N/2] (the value 1 the
 *                      `int swiglu` argument always had)
 *   TESSERA_B_KN       ag_gemm, gemm_rs: B is [K, N] row-major (packed, N a
 *                      multiple of 8) and the GEMM is A · B instead of A · Bᵀ
 *                      (not with TESSERA_AG_SWIGLU) */
#define TESSERA_AG_SWIGLU 1
#define TESSERA_B_KN 2

/* D[M, N] = AllGather(A shard [m_local, K]) · B[N, K]ᵀ; `swiglu` is a flags
 * word (TESSERA_AG_SWIGLU, TESSERA_B_KN; 0 or 1 as before). Packed rows when
 * ld* is 0. */
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
/* The same operators ordered inside the caller's `stream` (see Streams).
 * tessera_ag_gemm_ex: gathered_a (optional, NULL for none) receives the
 * gathered A [M, K], packed; `swiglu` is the flags word above.
 * tessera_gemm_rs_ex2: tessera_gemm_rs_ex with a flags word (TESSERA_B_KN:
 * B [K, N], D = RS(A · B)); tessera_gemm_rs_ex is it with flags 0. */
int tessera_ag_gemm_ex(tessera_session* s, void* stream, const void* a, const void* b, void* d, void* gathered_a,
                       int64_t m, int64_t m_local, int64_t n, int64_t k, int64_t ldd, int dtype, int swiglu,
                       int strategy);
int tessera_gemm_rs_ex(tessera_session* s, void* stream, const void* a, const void* b, void* d, int64_t m,
                       int64_t m_local, int64_t n, int64_t k, int dtype, int strategy);
int tessera_gemm_rs_ex2(tessera_session* s, void* stream, const void* a, const void* b, void* d, int64_t m,
                        int64_t m_local, int64_t n, int64_t k, int dtype, int strategy, int flags);
int tessera_gemm_ar_ex(tessera_session* s, void* stream, const void* a, const void* b, void* d, int64_t m, int64_t n,
                       int64_t k, int dtype, int strategy);
int tessera_mlp_ex(tessera_session* s, void* stream, const void* x, const void* w_gate_up, const void* w_down,
                   void* out, int64_t m, int64_t m_local, int64_t h, int64_t i_local, int dtype, int ag_strategy,
                   int rs_strategy);

/* SiLU·up of a gated MLP whose gate and up columns are interleaved (the
 * fused gate/up weight's layout), ordered on `stream`; no session needed:
 *   h[r, j] = SiLU(gu[r, 2j]) * gu[r, 2j + 1]   (gu [rows, 2·inter], h [rows, inter], packed)
 * tessera_swiglu_backward writes dgu [rows, 2·inter] from dh [rows, inter]
 * and, when h is not NULL, h again (the down projection's weight gradient
 * needs it). inter a multiple of 4, pointers 16-byte aligned. */
/* out [cols, rows] = in [rows, cols]ᵀ, packed 16-bit elements, on `stream`. */
int tessera_transpose(void* stream, const void* in, void* out, int64_t rows, int64_t cols, int dtype);
int tessera_swiglu_forward(void* stream, const void* gu, void* h, int64_t rows, int64_t inter, int dtype);
int tessera_swiglu_backward(void* stream, const void* gu, const void* dh, void* dgu, void* h, int64_t rows,
                            int64_t inter, int dtype);

/* Sequence-parallel attention (ops::sp_attention): AllGather-KV + attention
 * over zig-zag shards. The global sequence of `seq` tokens is cut into 2R
 * chunks of C = seq / (2R) tokens; this rank holds chunks r and 2R-1-r, in
 * that order. q and o are [batch, 2C, heads_q, head_dim], k and v [batch, 2C,
 * heads_kv, head_dim], packed, of `dtype`; lse (NULL for none) receives
 * float32 [batch, heads_q, 2C], natural log. causal: 0 or 1; softmax_scale
 * 0: 1/sqrt(head_dim). head_dim 64 or 128, heads_q a multiple of heads_kv,
 * seq a multiple of 2R. Strategies: TESSERA_SEQUENTIAL, TESSERA_FUSED_CE,
 * TESSERA_RING, TESSERA_ULYSSES (heads_q and heads_kv multiples of R),
 * TESSERA_TWO_LEVEL (heads_q and heads_kv multiples of the Ulysses degree,
 * tessera_session_sp_two_level_inner),
 * TESSERA_AUTOMATIC. Needs every rank load/store reachable (the session's
 * attention context is created with it; otherwise the call fails). */
int tessera_sp_attention(tessera_session* s, const void* q, const void* k, const void* v, void* o, float* lse,
                         int64_t batch, int64_t seq, int64_t heads_q, int64_t heads_kv, int64_t head_dim, int dtype,
                         int causal, float softmax_scale, int strategy);
int tessera_sp_attention_ex(tessera_session* s, void* stream, const void* q, const void* k, const void* v, void* o,
                            float* lse, int64_t batch, int64_t seq, int64_t heads_q, int64_t heads_kv, int64_t head_dim,
                            int dtype, int causal, float softmax_scale, int strategy);
/* The strategy TESSERA_AUTOMATIC resolves to for this sp_attention call
 * (measures if the shape was never measured, which runs the operator;
 * collective; whatever tessera_session_tune_on_miss says). *out receives a
 * strategy code. */
int tessera_sp_attention_resolve(tessera_session* s, const void* q, const void* k, const void* v, void* o,
                                 int64_t batch, int64_t seq, int64_t heads_q, int64_t heads_kv, int64_t head_dim,
                                 int dtype, int causal, int* out);

/* Mixture-of-Experts layers, bf16 (dtype TESSERA_BF16), ordered inside the
 * caller's `stream` (see Streams). Routing is the caller's: expert_ids
 * [tokens_local, topk] int32 (global expert ids in [0, experts)) and weights
 * [tokens_local, topk] float32 for this rank's tokens (from
 * tessera_moe_topk_gating or elsewhere). x_shard and out_shard are this
 * rank's [tokens_local, hidden] tokens; every matrix packed, 16-byte
 * aligned. Each expert's gated MLP is
 *   y = w_down · (SiLU(gate) · up),  [gate, up] = w_gate_up · x,
 * with w_gate_up's rows 2j / 2j + 1 holding gate / up column j (nn.Linear
 * layout per expert), and out = sum over the topk slots of weight · y.
 * The session creates each layer's context on its first call. Collective:
 * every rank calls with the same shapes and strategy. Nothing synchronizes
 * with the host inside a call, so the device-side checks (an expert id
 * outside [0, experts), a capacity overflow, a routing table the grouped
 * GEMM refused) are reported by the layer's *_check_status, which waits for
 * the session's stream and fails with a message naming the problem if the
 * last call met one (0 when there is nothing to report, or before a call).
 *
 * tessera_moe_tp_ex (ops::moe_tp, tensor parallel): every rank holds all
 * `experts`, sharded along the intermediate dimension: w_gate_up [experts,
 * 2 * inter_local, hidden], w_down [experts, hidden, inter_local]; the
 * layer all-gathers the tokens and routing, runs the experts on its shard
 * and reduce-scatters the sum back to the token shards. Strategies:
 * TESSERA_SEQUENTIAL, TESSERA_PIPELINED, TESSERA_AUTOMATIC (the ops tuner,
 * as tessera_session_use_cache / tune_on_miss say). */
int tessera_moe_tp_ex(tessera_session* s, void* stream, const void* x_shard, const int32_t* expert_ids,
                      const float* weights, const void* w_gate_up, const void* w_down, void* out_shard,
                      int64_t tokens_local, int64_t hidden, int64_t inter_local, int experts, int topk, int dtype,
                      int strategy);
/* The strategy TESSERA_AUTOMATIC resolves to for this moe_tp call (measures
 * if the shape was never measured, which runs the layer; collective;
 * whatever tessera_session_tune_on_miss says). *out receives a strategy
 * code. */
int tessera_moe_tp_resolve(tessera_session* s, const void* x_shard, const int32_t* expert_ids, const float* weights,
                           const void* w_gate_up, const void* w_down, void* out_shard, int64_t tokens_local,
                           int64_t hidden, int64_t inter_local, int experts, int topk, int dtype, int* out);
int tessera_moe_tp_check_status(tessera_session* s);
/* tessera_moe_ep_ex (ops::moe_ep, expert parallel): rank r owns experts
 * [r * experts / R, (r + 1) * experts / R) whole: w_gate_up [experts / R,
 * 2 * inter, hidden], w_down [experts / R, hidden, inter]; experts a
 * multiple of R. Rows travel in fixed slabs of `capacity` rows per
 * destination rank (0: tokens_local * topk, which cannot overflow and needs
 * the same tokens_local on every rank); rows over a smaller capacity are
 * left out of the output and reported by tessera_moe_ep_check_status.
 * Strategies: TESSERA_SEQUENTIAL, TESSERA_PIPELINED, TESSERA_AUTOMATIC
 * (pipelined when R > 1). */
int tessera_moe_ep_ex(tessera_session* s, void* stream, const void* x_shard, const int32_t* expert_ids,
                      const float* weights, const void* w_gate_up, const void* w_down, void* out_shard,
                      int64_t tokens_local, int64_t hidden, int64_t inter, int experts, int topk, int64_t capacity,
                      int dtype, int strategy);
int tessera_moe_ep_check_status(tessera_session* s);
/* The top-k router (kernels::moe::topk_gating), on `stream`, no session:
 * softmax over the experts of logits [tokens, experts] (row stride
 * ld_logits elements, 0: experts; dtype TESSERA_F32, TESSERA_BF16 or
 * TESSERA_F16) in float32, then the k largest (ties to the lower id), slots
 * in descending weight: expert_ids [tokens, k] int32, weights [tokens, k]
 * float32; renormalize 1 divides a token's k weights by their sum.
 * experts <= 1024, k <= min(16, experts). */
int tessera_moe_topk_gating(void* stream, const void* logits, int32_t* expert_ids, float* weights, int64_t tokens,
                            int experts, int k, int64_t ld_logits, int logits_dtype, int renormalize);

/* Environment queries (python -m tessera.env). tessera_lsa_probe creates an
 * NCCL communicator over devices 0..ndev-1 in this process and reports how
 * many of them are in one load/store-accessible team. */
int tessera_device_count(int* out);
int tessera_can_access_peer(int device, int peer, int* out);
int tessera_lsa_probe(int ndev, int* lsa_size);

/* The strategy `automatic` resolves to for this shape (tunes if needed;
 * collective). *out receives a strategy code. op: 0 ag_gemm, 1 gemm_rs;
 * `swiglu` is the op's flags word (ag_gemm: TESSERA_AG_SWIGLU, TESSERA_B_KN;
 * gemm_rs: TESSERA_B_KN). */
int tessera_resolve(tessera_session* s, int op, int64_t m, int64_t m_local, int64_t n, int64_t k, int dtype, int swiglu,
                    const void* a, const void* b, void* d, int* out);

#ifdef __cplusplus
}
#endif
#endif
