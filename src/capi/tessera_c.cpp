// The C interface (include/tessera/capi/tessera.h): a thin shell over
// runtime::ProcessGroup, ops::TpContext and the ops entry points. Every
// exception stops here and becomes -1 plus tessera_last_error().
#include "tessera/capi/tessera.h"

#include <iterator>
#include <optional>
#include <utility>
#include <cuda_runtime_api.h>

#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>

#include "tessera/kernels/elementwise.hpp"
#include "tessera/kernels/moe_routing.hpp"
#include "tessera/ops/moe.hpp"
#include "tessera/ops/moe_ep.hpp"
#include "tessera/ops/sp_attention.hpp"
#include "tessera/ops/tp_mlp.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/launch.hpp"
#include "tessera/runtime/nccl_bootstrap.hpp"
#include "tessera/runtime/process_group.hpp"

#ifndef TESSERA_VERSION_STRING
#define TESSERA_VERSION_STRING "unknown"
#endif

static_assert(sizeof(ncclUniqueId) == TESSERA_UNIQUE_ID_BYTES, "TESSERA_UNIQUE_ID_BYTES must match ncclUniqueId");

struct tessera_session {
  std::unique_ptr<tessera::runtime::ProcessGroup> pg;
  std::unique_ptr<tessera::ops::TpContext> ctx;
  /// sp_attention's context; created with the session (collectively) when
  /// every rank is load/store reachable, else null.
  std::unique_ptr<tessera::ops::SpAttnContext> sp;
  /// The MoE layers' contexts, created on each layer's first call (their
  /// construction is local; the collective set-up happens inside the calls).
  std::unique_ptr<tessera::ops::MoeContext> moe_tp;
  std::unique_ptr<tessera::ops::MoeEpContext> moe_ep;
  bool use_cache = true;
  bool tune_on_miss = true;
  std::uint64_t sp_workspace_limit = 0;  ///< bytes per rank; 0: none
  int sp_two_level_inner = 0;            ///< SpAttnOptions::two_level_inner
  // Fork/join with the caller's stream (the *_ex entry points).
  cudaEvent_t ev_in = nullptr;
  cudaEvent_t ev_out = nullptr;
};

namespace {

thread_local std::string g_error;

template <class F>
int guarded(const char* what, F&& f) {
  try {
    f();
    g_error.clear();
    return 0;
  } catch (const std::exception& e) {
    g_error = e.what();
  } catch (...) {
    g_error = std::string(what) + ": unknown exception";
  }
  return -1;
}

tessera::DType dtype_of(int code) {
  TESSERA_CHECK(code == TESSERA_BF16 || code == TESSERA_F16, "dtype code {} (TESSERA_BF16 = 0 or TESSERA_F16 = 1)",
                code);
  return code == TESSERA_F16 ? tessera::DType::f16 : tessera::DType::bf16;
}

tessera::ops::OpOptions options_of(const tessera_session* s, int strategy) {
  TESSERA_CHECK(strategy >= TESSERA_AUTOMATIC && strategy <= TESSERA_RING, "strategy code {} (0..5)", strategy);
  tessera::ops::OpOptions o;
  o.strategy = static_cast<tessera::ops::Strategy>(strategy);
  o.use_cache = s->use_cache;
  o.tune_on_miss = s->tune_on_miss;
  return o;
}

// Sizes are range-checked before the session is looked at (the operators
// check them again against the session's world and the data's layout).
void check_size(const char* fn, const char* name, int64_t v, int64_t lo) {
  TESSERA_CHECK(v >= lo && v < (int64_t{1} << 31), "{}: {} = {} out of range [{}, 2^31)", fn, name, v, lo);
}

/// Throws naming `fn`, the argument and its address unless p is a multiple
/// of `bytes` (checked here, before any launch: the operators' vector loads
/// and TMA descriptors need it).
void check_aligned(const char* fn, const char* name, const void* p, std::uintptr_t bytes) {
  TESSERA_CHECK(reinterpret_cast<std::uintptr_t>(p) % bytes == 0, "{}: {} = {} is not {}-byte aligned", fn, name, p,
                bytes);
}

void need(const tessera_session* s, const char* fn) {
  TESSERA_CHECK(s != nullptr && s->ctx != nullptr, "{}: null session", fn);
}

// A flags word (TESSERA_AG_SWIGLU, TESSERA_B_KN) with no bit outside `known`.
void check_flags(const char* fn, int flags, int known) {
  TESSERA_CHECK((flags & ~known) == 0, "{}: flags = {:#x} has unknown bits (this entry point takes {:#x})", fn, flags,
                known);
}

constexpr int kAgFlags = TESSERA_AG_SWIGLU | TESSERA_B_KN;
constexpr int kRsFlags = TESSERA_B_KN;

// `flags` checked by the caller (check_flags with kAgFlags).
tessera::ops::AgGemmArgs ag_args(const void* a, const void* b, void* d, int64_t m, int64_t m_local, int64_t n,
                                 int64_t k, int64_t ldd, int dtype, int flags) {
  return {.a = a,
          .b = b,
          .d = d,
          .m = m,
          .m_local = m_local,
          .n = n,
          .k = k,
          .ldd = ldd,
          .dtype = dtype_of(dtype),
          .swiglu = (flags & TESSERA_AG_SWIGLU) != 0,
          .b_kn = (flags & TESSERA_B_KN) != 0};
}

// `flags` checked by the caller (check_flags with kRsFlags).
tessera::ops::GemmRsArgs rs_args(const void* a, const void* b, void* d, int64_t m, int64_t m_local, int64_t n,
                                 int64_t k, int dtype, int flags) {
  return {.a = a,
          .b = b,
          .d = d,
          .m = m,
          .m_local = m_local,
          .n = n,
          .k = k,
          .dtype = dtype_of(dtype),
          .b_kn = (flags & TESSERA_B_KN) != 0};
}

// Makes the session's device current for the scope.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    TESSERA_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) TESSERA_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { (void)cudaSetDevice(prev_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
};

void make_contexts(tessera_session* s) {
  s->ctx = std::make_unique<tessera::ops::TpContext>(*s->pg);
  if (s->pg->lsa_reachable()) s->sp = std::make_unique<tessera::ops::SpAttnContext>(*s->pg);
}

void make_events(tessera_session* s) {
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&s->ev_in, cudaEventDisableTiming));
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&s->ev_out, cudaEventDisableTiming));
}

// Runs `f` (which enqueues on the session's stream) ordered inside the
// caller's stream: the session's stream waits for the caller's work so far,
// and the caller's stream waits for the operator (whose side streams join the
// session's stream before it returns). Work enqueued later on the caller's
// stream — including the reuse of freed memory by a stream-ordered allocator
// such as PyTorch's caching allocator — therefore follows the operator.
template <class F>
void on_caller_stream(tessera_session* s, void* stream, F&& f) {
  DeviceScope dev(s->pg->device());
  const auto caller = static_cast<cudaStream_t>(stream);
  const cudaStream_t own = s->pg->stream();
  if (caller == own) {
    f();
    return;
  }
  TESSERA_CUDA_CHECK(cudaEventRecord(s->ev_in, caller));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(own, s->ev_in, 0));
  try {
    f();
  } catch (...) {
    // Join back even on failure: a stream forked from a capturing caller and
    // left unjoined would invalidate the caller's whole CUDA-graph capture.
    (void)cudaEventRecord(s->ev_out, own);
    (void)cudaStreamWaitEvent(caller, s->ev_out, 0);
    throw;
  }
  TESSERA_CUDA_CHECK(cudaEventRecord(s->ev_out, own));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(caller, s->ev_out, 0));
}

}  // namespace

extern "C" {

const char* tessera_version(void) { return TESSERA_VERSION_STRING; }

const char* tessera_strategy_name(int code) {
  const tessera::ops::StrategyInfo* i = tessera::ops::find_strategy(code);
  return i ? i->name.data() : nullptr;  // the table's names are string literals
}

int tessera_strategy_accepts(int op, int code) {
  using tessera::ops::OpKind;
  static constexpr OpKind kOps[] = {OpKind::ag_gemm,      OpKind::gemm_rs, OpKind::gemm_ar,
                                    OpKind::sp_attention, OpKind::moe_tp,  OpKind::moe_ep};
  const tessera::ops::StrategyInfo* i = tessera::ops::find_strategy(code);
  if (op < 0 || op >= static_cast<int>(std::size(kOps)) || i == nullptr) return 0;
  return tessera::ops::accepts(kOps[op], i->strategy) ? 1 : 0;
}

int tessera_nccl_versions(int* header, int* runtime) {
  return guarded("tessera_nccl_versions", [&] {
    TESSERA_CHECK(header != nullptr && runtime != nullptr, "tessera_nccl_versions: null output");
    *header = NCCL_VERSION_CODE;
    *runtime = 0;
    TESSERA_NCCL_CHECK(ncclGetVersion(runtime));
  });
}

int tessera_nccl_unique_id(void* out, int bytes) {
  return guarded("tessera_nccl_unique_id", [&] {
    TESSERA_CHECK(out != nullptr, "tessera_nccl_unique_id: out is null");
    TESSERA_CHECK(bytes == TESSERA_UNIQUE_ID_BYTES, "tessera_nccl_unique_id: bytes {} (must be {})", bytes,
                  TESSERA_UNIQUE_ID_BYTES);
    ncclUniqueId id{};
    TESSERA_NCCL_CHECK(ncclGetUniqueId(&id));
    std::memcpy(out, &id, sizeof(id));
  });
}

int tessera_session_create_from_id(int rank, int world, int device, const void* id, int id_bytes, int timeout_ms,
                                   tessera_session** out) {
  return guarded("tessera_session_create_from_id", [&] {
    TESSERA_CHECK(out != nullptr, "tessera_session_create_from_id: out is null");
    *out = nullptr;
    TESSERA_CHECK(world >= 1 && world <= 65536 && rank >= 0 && rank < world,
                  "tessera_session_create_from_id: rank {} of world {} (world in [1, 65536])", rank, world);
    TESSERA_CHECK(device >= 0, "tessera_session_create_from_id: device {} (must be >= 0)", device);
    TESSERA_CHECK(id != nullptr, "tessera_session_create_from_id: id is null");
    TESSERA_CHECK(id_bytes == TESSERA_UNIQUE_ID_BYTES, "tessera_session_create_from_id: id_bytes {} (must be {})",
                  id_bytes, TESSERA_UNIQUE_ID_BYTES);
    TESSERA_CHECK(timeout_ms >= 0, "tessera_session_create_from_id: timeout_ms {} (0: the default)", timeout_ms);
    ncclUniqueId uid{};
    std::memcpy(&uid, id, sizeof(uid));
    tessera::runtime::ProcessGroupOptions po;
    if (timeout_ms > 0) po.bootstrap_timeout = std::chrono::milliseconds(timeout_ms);
    auto s = std::make_unique<tessera_session>();
    s->pg = tessera::runtime::ProcessGroup::create_from_unique_id(rank, world, device, uid, po);
    make_contexts(s.get());
    make_events(s.get());
    *out = s.release();
  });
}

const char* tessera_last_error(void) { return g_error.c_str(); }

int tessera_session_create(int rank, int world, int local_rank, int local_world, int device, const char* master_addr,
                           int master_port, tessera_session** out) {
  return guarded("tessera_session_create", [&] {
    TESSERA_CHECK(out != nullptr, "tessera_session_create: out is null");
    *out = nullptr;
    TESSERA_CHECK(world >= 1 && world <= 65536 && rank >= 0 && rank < world,
                  "tessera_session_create: rank {} of world {} (world in [1, 65536])", rank, world);
    TESSERA_CHECK(local_world >= 1 && local_rank >= 0 && local_rank < local_world,
                  "tessera_session_create: local rank {} of {}", local_rank, local_world);
    TESSERA_CHECK(master_addr != nullptr && *master_addr, "tessera_session_create: master_addr is empty");
    TESSERA_CHECK(master_port > 0 && master_port < 65536, "tessera_session_create: master_port {}", master_port);
    tessera::runtime::LaunchInfo info;
    info.rank = rank;
    info.world = world;
    info.local_rank = local_rank;
    info.local_world = local_world;
    info.master_addr = master_addr;
    info.master_port = master_port;
    info.source = "capi";
    tessera::runtime::ProcessGroupOptions po;
    po.device = device;
    auto s = std::make_unique<tessera_session>();
    s->pg = tessera::runtime::ProcessGroup::create(info, po);
    make_contexts(s.get());
    make_events(s.get());
    *out = s.release();
  });
}

void tessera_session_destroy(tessera_session* s) {
  if (!s) return;
  guarded("tessera_session_destroy", [&] {
    // Work still queued on the session's streams may use the memory freed
    // below: finish it first (the caller may not have synchronized).
    if (s->pg) {
      // A host exchange that timed out leaves the communicator unusable:
      // abort it rather than wait in a collective finalize.
      auto* nb = dynamic_cast<tessera::runtime::NcclBootstrap*>(&s->pg->bootstrap());
      if (nb != nullptr && nb->broken()) s->pg->abort();
      DeviceScope dev(s->pg->device());
      // Bounded, not cudaDeviceSynchronize: a peer that died inside a
      // collective aborts the group (and is reported) instead of hanging here.
      if (!s->pg->aborted()) {
        try {
          s->pg->synchronize_all("tessera_session_destroy");
        } catch (const tessera::Error& e) {
          std::fprintf(stderr, "%s\n", e.what());
        }
      }
      if (s->ev_in) (void)cudaEventDestroy(s->ev_in);
      if (s->ev_out) (void)cudaEventDestroy(s->ev_out);
    }
    s->moe_ep.reset();  // the contexts before the process group they use
    s->moe_tp.reset();
    s->sp.reset();
    s->ctx.reset();
    s->pg.reset();
  });
  delete s;
}

void tessera_session_abort(tessera_session* s) {
  if (s && s->pg) s->pg->abort();
}

int tessera_session_rank(const tessera_session* s) { return s && s->pg ? s->pg->rank() : -1; }
int tessera_session_world(const tessera_session* s) { return s && s->pg ? s->pg->world() : -1; }
int tessera_session_device(const tessera_session* s) { return s && s->pg ? s->pg->device() : -1; }
int tessera_session_lsa_reachable(const tessera_session* s) { return s && s->pg && s->pg->lsa_reachable() ? 1 : 0; }

void* tessera_session_stream(tessera_session* s) { return s && s->pg ? static_cast<void*>(s->pg->stream()) : nullptr; }

void tessera_session_use_cache(tessera_session* s, int on) {
  if (s) s->use_cache = on != 0;
}

void tessera_session_tune_on_miss(tessera_session* s, int on) {
  if (s) s->tune_on_miss = on != 0;
}

void tessera_session_sp_workspace_limit(tessera_session* s, uint64_t bytes) {
  if (s) s->sp_workspace_limit = bytes;
}

void tessera_session_sp_two_level_inner(tessera_session* s, int inner) {
  if (s) s->sp_two_level_inner = inner;
}

}  // extern "C"

namespace {

// One body per operator. The plain entry points queue on the session's
// stream (`stream` = nullopt), the _ex ones inside the caller's stream.
using CallerStream = std::optional<void*>;

template <class F>
void run_on(tessera_session* s, CallerStream stream, F&& f) {
  on_caller_stream(s, stream ? *stream : static_cast<void*>(s->pg->stream()), std::forward<F>(f));
}

int ag_gemm_call(const char* fn, tessera_session* s, CallerStream stream, const void* a, const void* b, void* d,
                 void* gathered_a, int64_t m, int64_t m_local, int64_t n, int64_t k, int64_t ldd, int dtype, int swiglu,
                 int strategy) {
  return guarded(fn, [&] {
    check_size(fn, "m", m, 1);
    check_size(fn, "m_local", m_local, 0);
    check_size(fn, "n", n, 1);
    check_size(fn, "k", k, 1);
    check_size(fn, "ldd", ldd, 0);
    check_flags(fn, swiglu, kAgFlags);
    need(s, fn);
    auto args = ag_args(a, b, d, m, m_local, n, k, ldd, dtype, swiglu);
    args.gathered_a = gathered_a;
    const auto o = options_of(s, strategy);
    run_on(s, stream, [&] { tessera::ops::ag_gemm(*s->ctx, args, o); });
  });
}

int gemm_rs_call(const char* fn, tessera_session* s, CallerStream stream, const void* a, const void* b, void* d,
                 int64_t m, int64_t m_local, int64_t n, int64_t k, int dtype, int strategy, int flags = 0) {
  return guarded(fn, [&] {
    check_size(fn, "m", m, 1);
    check_size(fn, "m_local", m_local, 0);
    check_size(fn, "n", n, 1);
    check_size(fn, "k", k, 1);
    check_flags(fn, flags, kRsFlags);
    need(s, fn);
    const auto args = rs_args(a, b, d, m, m_local, n, k, dtype, flags);
    const auto o = options_of(s, strategy);
    run_on(s, stream, [&] { tessera::ops::gemm_rs(*s->ctx, args, o); });
  });
}

int gemm_ar_call(const char* fn, tessera_session* s, CallerStream stream, const void* a, const void* b, void* d,
                 int64_t m, int64_t n, int64_t k, int dtype, int strategy) {
  return guarded(fn, [&] {
    check_size(fn, "m", m, 1);
    check_size(fn, "n", n, 1);
    check_size(fn, "k", k, 1);
    need(s, fn);
    const tessera::ops::GemmArArgs g{.a = a, .b = b, .d = d, .m = m, .n = n, .k = k, .dtype = dtype_of(dtype)};
    const auto o = options_of(s, strategy);
    run_on(s, stream, [&] { tessera::ops::gemm_ar(*s->ctx, g, o); });
  });
}

int mlp_call(const char* fn, tessera_session* s, CallerStream stream, const void* x, const void* w_gate_up,
             const void* w_down, void* out, int64_t m, int64_t m_local, int64_t h, int64_t i_local, int dtype,
             int ag_strategy, int rs_strategy) {
  return guarded(fn, [&] {
    check_size(fn, "m", m, 1);
    check_size(fn, "m_local", m_local, 0);
    check_size(fn, "h", h, 1);
    check_size(fn, "i_local", i_local, 1);
    need(s, fn);
    const tessera::ops::MlpArgs a{.x = x,
                                  .w_gate_up = w_gate_up,
                                  .w_down = w_down,
                                  .out = out,
                                  .m = m,
                                  .m_local = m_local,
                                  .h = h,
                                  .i_local = i_local,
                                  .dtype = dtype_of(dtype)};
    const auto ag = options_of(s, ag_strategy);
    const auto rs = options_of(s, rs_strategy);
    run_on(s, stream, [&] { tessera::ops::mlp(*s->ctx, a, ag, rs); });
  });
}

// sp_attention's arguments, checked before the session is looked at; the
// operator checks them again against the session's world.
tessera::ops::SpAttnArgs sp_args(const char* fn, const void* q, const void* k, const void* v, void* o, float* lse,
                                 int64_t batch, int64_t seq, int64_t heads_q, int64_t heads_kv, int64_t head_dim,
                                 int dtype, int causal, float softmax_scale) {
  check_size(fn, "batch", batch, 1);
  check_size(fn, "seq", seq, 2);
  check_size(fn, "heads_q", heads_q, 1);
  check_size(fn, "heads_kv", heads_kv, 1);
  TESSERA_CHECK(head_dim == 64 || head_dim == 128, "{}: head_dim = {} (64 or 128)", fn, head_dim);
  TESSERA_CHECK(heads_q % heads_kv == 0, "{}: heads_q = {} is not a multiple of heads_kv = {} (GQA)", fn, heads_q,
                heads_kv);
  TESSERA_CHECK(seq % 2 == 0, "{}: seq = {} must be even (two zig-zag chunks per rank)", fn, seq);
  TESSERA_CHECK(dtype == TESSERA_BF16 || dtype == TESSERA_F16,
                "{}: dtype code {} (TESSERA_BF16 = 0 or TESSERA_F16 = 1)", fn, dtype);
  TESSERA_CHECK(causal == 0 || causal == 1, "{}: causal = {} (0 or 1)", fn, causal);
  TESSERA_CHECK(std::isfinite(softmax_scale) && softmax_scale >= 0,
                "{}: softmax_scale = {} (finite, >= 0; 0: 1/sqrt(head_dim))", fn, softmax_scale);
  for (auto [name, p] :
       {std::pair{"q", q}, std::pair{"k", k}, std::pair{"v", v}, std::pair{"o", static_cast<const void*>(o)}}) {
    TESSERA_CHECK(p != nullptr, "{}: {} is null", fn, name);
    check_aligned(fn, name, p, 16);
  }
  check_aligned(fn, "lse", lse, alignof(float));
  tessera::ops::SpAttnArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  a.o = o;
  a.lse = lse;
  a.batch = batch;
  a.seq = seq;
  a.heads_q = heads_q;
  a.heads_kv = heads_kv;
  a.head_dim = head_dim;
  a.dtype = dtype_of(dtype);
  a.causal = causal != 0;
  a.softmax_scale = softmax_scale;
  return a;
}

tessera::ops::SpAttnOptions sp_options_of(const char* fn, const tessera_session* s, int strategy) {
  TESSERA_CHECK(
      tessera::ops::accepts(tessera::ops::OpKind::sp_attention, static_cast<tessera::ops::Strategy>(strategy)),
      "{}: strategy code {} (TESSERA_AUTOMATIC 0, TESSERA_SEQUENTIAL 1, TESSERA_FUSED_CE 3, TESSERA_RING 5, "
      "TESSERA_ULYSSES 6 or TESSERA_TWO_LEVEL 8)",
      fn, strategy);
  tessera::ops::SpAttnOptions o;
  o.strategy = static_cast<tessera::ops::SpStrategy>(strategy);
  o.use_cache = s == nullptr || s->use_cache;
  o.tune_on_miss = s == nullptr || s->tune_on_miss;
  o.workspace_limit_bytes = s == nullptr ? 0 : static_cast<std::size_t>(s->sp_workspace_limit);
  o.two_level_inner = s == nullptr ? 0 : s->sp_two_level_inner;
  return o;
}

tessera::ops::SpAttnContext& need_sp(const tessera_session* s, const char* fn) {
  need(s, fn);
  TESSERA_CHECK(s->sp != nullptr,
                "{}: not every rank of this session is load/store reachable ({} of {}), and sp_attention pushes into "
                "peers' memory",
                fn, s->pg->lsa_size(), s->pg->world());
  return *s->sp;
}

int sp_attention_call(const char* fn, tessera_session* s, CallerStream stream, const void* q, const void* k,
                      const void* v, void* o, float* lse, int64_t batch, int64_t seq, int64_t heads_q, int64_t heads_kv,
                      int64_t head_dim, int dtype, int causal, float softmax_scale, int strategy) {
  return guarded(fn, [&] {
    const auto a = sp_args(fn, q, k, v, o, lse, batch, seq, heads_q, heads_kv, head_dim, dtype, causal, softmax_scale);
    const auto opt = sp_options_of(fn, s, strategy);
    auto& sp = need_sp(s, fn);
    run_on(s, stream, [&] { tessera::ops::sp_attention(sp, a, opt); });
  });
}

}  // namespace

extern "C" {

int tessera_sp_attention(tessera_session* s, const void* q, const void* k, const void* v, void* o, float* lse,
                         int64_t batch, int64_t seq, int64_t heads_q, int64_t heads_kv, int64_t head_dim, int dtype,
                         int causal, float softmax_scale, int strategy) {
  return sp_attention_call("tessera_sp_attention", s, std::nullopt, q, k, v, o, lse, batch, seq, heads_q, heads_kv,
                           head_dim, dtype, causal, softmax_scale, strategy);
}

int tessera_sp_attention_ex(tessera_session* s, void* stream, const void* q, const void* k, const void* v, void* o,
                            float* lse, int64_t batch, int64_t seq, int64_t heads_q, int64_t heads_kv, int64_t head_dim,
                            int dtype, int causal, float softmax_scale, int strategy) {
  return sp_attention_call("tessera_sp_attention_ex", s, stream, q, k, v, o, lse, batch, seq, heads_q, heads_kv,
                           head_dim, dtype, causal, softmax_scale, strategy);
}

int tessera_sp_attention_resolve(tessera_session* s, const void* q, const void* k, const void* v, void* o,
                                 int64_t batch, int64_t seq, int64_t heads_q, int64_t heads_kv, int64_t head_dim,
                                 int dtype, int causal, int* out) {
  const char* fn = "tessera_sp_attention_resolve";
  return guarded(fn, [&] {
    const auto a = sp_args(fn, q, k, v, o, nullptr, batch, seq, heads_q, heads_kv, head_dim, dtype, causal, 0.f);
    TESSERA_CHECK(out != nullptr, "{}: out is null", fn);
    auto opt = sp_options_of(fn, s, TESSERA_AUTOMATIC);
    opt.tune_on_miss = true;  // resolving is the place to measure
    auto& sp = need_sp(s, fn);
    tessera::ops::SpStrategy chosen{};
    run_on(s, std::nullopt, [&] { chosen = tessera::ops::resolve_sp_attention(sp, a, opt); });
    *out = static_cast<int>(chosen);
  });
}

int tessera_ag_gemm(tessera_session* s, const void* a, const void* b, void* d, int64_t m, int64_t m_local, int64_t n,
                    int64_t k, int64_t ldd, int dtype, int swiglu, int strategy) {
  return ag_gemm_call("tessera_ag_gemm", s, std::nullopt, a, b, d, nullptr, m, m_local, n, k, ldd, dtype, swiglu,
                      strategy);
}

int tessera_gemm_rs(tessera_session* s, const void* a, const void* b, void* d, int64_t m, int64_t m_local, int64_t n,
                    int64_t k, int dtype, int strategy) {
  return gemm_rs_call("tessera_gemm_rs", s, std::nullopt, a, b, d, m, m_local, n, k, dtype, strategy);
}

int tessera_gemm_ar(tessera_session* s, const void* a, const void* b, void* d, int64_t m, int64_t n, int64_t k,
                    int dtype, int strategy) {
  return gemm_ar_call("tessera_gemm_ar", s, std::nullopt, a, b, d, m, n, k, dtype, strategy);
}

int tessera_mlp(tessera_session* s, const void* x, const void* w_gate_up, const void* w_down, void* out, int64_t m,
                int64_t m_local, int64_t h, int64_t i_local, int dtype, int ag_strategy, int rs_strategy) {
  return mlp_call("tessera_mlp", s, std::nullopt, x, w_gate_up, w_down, out, m, m_local, h, i_local, dtype, ag_strategy,
                  rs_strategy);
}

int tessera_ag_gemm_ex(tessera_session* s, void* stream, const void* a, const void* b, void* d, void* gathered_a,
                       int64_t m, int64_t m_local, int64_t n, int64_t k, int64_t ldd, int dtype, int swiglu,
                       int strategy) {
  return ag_gemm_call("tessera_ag_gemm_ex", s, stream, a, b, d, gathered_a, m, m_local, n, k, ldd, dtype, swiglu,
                      strategy);
}

int tessera_gemm_rs_ex(tessera_session* s, void* stream, const void* a, const void* b, void* d, int64_t m,
                       int64_t m_local, int64_t n, int64_t k, int dtype, int strategy) {
  return gemm_rs_call("tessera_gemm_rs_ex", s, stream, a, b, d, m, m_local, n, k, dtype, strategy);
}

int tessera_gemm_rs_ex2(tessera_session* s, void* stream, const void* a, const void* b, void* d, int64_t m,
                        int64_t m_local, int64_t n, int64_t k, int dtype, int strategy, int flags) {
  return gemm_rs_call("tessera_gemm_rs_ex2", s, stream, a, b, d, m, m_local, n, k, dtype, strategy, flags);
}

int tessera_gemm_ar_ex(tessera_session* s, void* stream, const void* a, const void* b, void* d, int64_t m, int64_t n,
                       int64_t k, int dtype, int strategy) {
  return gemm_ar_call("tessera_gemm_ar_ex", s, stream, a, b, d, m, n, k, dtype, strategy);
}

int tessera_mlp_ex(tessera_session* s, void* stream, const void* x, const void* w_gate_up, const void* w_down,
                   void* out, int64_t m, int64_t m_local, int64_t h, int64_t i_local, int dtype, int ag_strategy,
                   int rs_strategy) {
  return mlp_call("tessera_mlp_ex", s, stream, x, w_gate_up, w_down, out, m, m_local, h, i_local, dtype, ag_strategy,
                  rs_strategy);
}

namespace {
int swiglu_call(const char* what, void* stream, const void* gu, const void* dh, void* dgu, void* h, int64_t rows,
                int64_t inter, int dtype, bool backward) {
  return guarded(what, [&] {
    TESSERA_CHECK(rows >= 0 && inter >= 0, "{}: rows = {} and inter = {} must be >= 0", what, rows, inter);
    tessera::kernels::SwigluArgs a;
    a.gu = gu;
    a.h = h;
    a.dh = dh;
    a.dgu = dgu;
    a.rows = rows;
    a.inter = inter;
    a.dtype = dtype_of(dtype);
    if (backward)
      tessera::kernels::swiglu_backward(a, static_cast<cudaStream_t>(stream));
    else
      tessera::kernels::swiglu_forward(a, static_cast<cudaStream_t>(stream));
  });
}
}  // namespace

int tessera_transpose(void* stream, const void* in, void* out, int64_t rows, int64_t cols, int dtype) {
  return guarded("tessera_transpose", [&] {
    TESSERA_CHECK(rows >= 0 && cols >= 0, "tessera_transpose: rows = {} and cols = {} must be >= 0", rows, cols);
    tessera::kernels::transpose_2d(in, out, rows, cols, dtype_of(dtype), static_cast<cudaStream_t>(stream));
  });
}

int tessera_swiglu_forward(void* stream, const void* gu, void* h, int64_t rows, int64_t inter, int dtype) {
  return swiglu_call("tessera_swiglu_forward", stream, gu, nullptr, nullptr, h, rows, inter, dtype, false);
}

int tessera_swiglu_backward(void* stream, const void* gu, const void* dh, void* dgu, void* h, int64_t rows,
                            int64_t inter, int dtype) {
  return swiglu_call("tessera_swiglu_backward", stream, gu, dh, dgu, h, rows, inter, dtype, true);
}

namespace {

// The MoE layers' arguments, checked before the session is looked at (the
// layers check them again against the session's world and the pointers'
// alignment).
void check_moe(const char* fn, const void* x_shard, const int32_t* expert_ids, const float* weights,
               const void* w_gate_up, const void* w_down, const void* out_shard, int64_t tokens_local, int64_t hidden,
               const char* inter_name, int64_t inter, int experts, int topk, int dtype) {
  using tessera::kernels::moe::kMaxExperts;
  using tessera::kernels::moe::kMaxTopK;
  check_size(fn, "tokens_local", tokens_local, 0);
  check_size(fn, "hidden", hidden, 1);
  check_size(fn, inter_name, inter, 1);
  TESSERA_CHECK(experts >= 1 && experts <= kMaxExperts, "{}: experts = {} out of range [1, {}]", fn, experts,
                kMaxExperts);
  TESSERA_CHECK(topk >= 1 && topk <= kMaxTopK && topk <= experts,
                "{}: topk = {} out of range [1, min({}, experts = {})]", fn, topk, kMaxTopK, experts);
  TESSERA_CHECK(dtype == TESSERA_BF16, "{}: dtype code {} (the MoE layers take TESSERA_BF16 = 0 only)", fn, dtype);
  for (auto [name, p] : {std::pair{"x_shard", x_shard}, std::pair{"expert_ids", static_cast<const void*>(expert_ids)},
                         std::pair{"weights", static_cast<const void*>(weights)}, std::pair{"w_gate_up", w_gate_up},
                         std::pair{"w_down", w_down}, std::pair{"out_shard", out_shard}})
    TESSERA_CHECK(p != nullptr, "{}: {} is null", fn, name);
  for (auto [name, p] : {std::pair{"x_shard", x_shard}, std::pair{"w_gate_up", w_gate_up}, std::pair{"w_down", w_down},
                         std::pair{"out_shard", out_shard}})
    check_aligned(fn, name, p, 16);
  check_aligned(fn, "expert_ids", expert_ids, alignof(int32_t));
  check_aligned(fn, "weights", weights, alignof(float));
}

// A MoE layer's strategy code, from the strategy table.
tessera::ops::Strategy moe_strategy_of(const char* fn, tessera::ops::OpKind op, int strategy) {
  const auto st = static_cast<tessera::ops::Strategy>(strategy);
  TESSERA_CHECK(tessera::ops::accepts(op, st),
                "{}: strategy code {} (TESSERA_AUTOMATIC 0, TESSERA_SEQUENTIAL 1 or TESSERA_PIPELINED 7)", fn,
                strategy);
  return st;
}

/// The fields MoeTpArgs and MoeEpArgs share, checked (check_moe) and set;
/// the caller sets the layer's own (inter_local / inter, capacity). C++
/// linkage: this block sits inside the file's extern "C" section.
extern "C++" template <class Args>
Args moe_args(const char* fn, const void* x_shard, const int32_t* expert_ids, const float* weights,
              const void* w_gate_up, const void* w_down, void* out_shard, int64_t tokens_local, int64_t hidden,
              const char* inter_name, int64_t inter, int experts, int topk, int dtype) {
  check_moe(fn, x_shard, expert_ids, weights, w_gate_up, w_down, out_shard, tokens_local, hidden, inter_name, inter,
            experts, topk, dtype);
  Args a;
  a.x_shard = x_shard;
  a.expert_ids = expert_ids;
  a.weights = weights;
  a.w_gate_up = w_gate_up;
  a.w_down = w_down;
  a.out_shard = out_shard;
  a.tokens_local = tokens_local;
  a.hidden = hidden;
  a.experts = experts;
  a.topk = topk;
  a.dtype = dtype_of(dtype);
  return a;
}

tessera::ops::MoeTpArgs moe_tp_args(const char* fn, const void* x_shard, const int32_t* expert_ids,
                                    const float* weights, const void* w_gate_up, const void* w_down, void* out_shard,
                                    int64_t tokens_local, int64_t hidden, int64_t inter_local, int experts, int topk,
                                    int dtype) {
  auto a = moe_args<tessera::ops::MoeTpArgs>(fn, x_shard, expert_ids, weights, w_gate_up, w_down, out_shard,
                                             tokens_local, hidden, "inter_local", inter_local, experts, topk, dtype);
  a.inter_local = inter_local;
  return a;
}

tessera::ops::MoeTpOptions moe_tp_options_of(const char* fn, const tessera_session* s, int strategy) {
  tessera::ops::MoeTpOptions o;
  o.strategy = moe_strategy_of(fn, tessera::ops::OpKind::moe_tp, strategy);
  o.use_cache = s == nullptr || s->use_cache;
  o.tune_on_miss = s == nullptr || s->tune_on_miss;
  return o;
}

tessera::ops::MoeContext& need_moe_tp(tessera_session* s, const char* fn) {
  need(s, fn);
  if (!s->moe_tp) s->moe_tp = std::make_unique<tessera::ops::MoeContext>(*s->pg);
  return *s->moe_tp;
}

tessera::ops::MoeEpContext& need_moe_ep(tessera_session* s, const char* fn) {
  need(s, fn);
  if (!s->moe_ep) s->moe_ep = std::make_unique<tessera::ops::MoeEpContext>(*s->pg);
  return *s->moe_ep;
}

}  // namespace

int tessera_moe_tp_ex(tessera_session* s, void* stream, const void* x_shard, const int32_t* expert_ids,
                      const float* weights, const void* w_gate_up, const void* w_down, void* out_shard,
                      int64_t tokens_local, int64_t hidden, int64_t inter_local, int experts, int topk, int dtype,
                      int strategy) {
  const char* fn = "tessera_moe_tp_ex";
  return guarded(fn, [&] {
    const auto a = moe_tp_args(fn, x_shard, expert_ids, weights, w_gate_up, w_down, out_shard, tokens_local, hidden,
                               inter_local, experts, topk, dtype);
    const auto o = moe_tp_options_of(fn, s, strategy);
    auto& ctx = need_moe_tp(s, fn);
    run_on(s, stream, [&] { tessera::ops::moe_tp(ctx, a, o); });
  });
}

int tessera_moe_tp_resolve(tessera_session* s, const void* x_shard, const int32_t* expert_ids, const float* weights,
                           const void* w_gate_up, const void* w_down, void* out_shard, int64_t tokens_local,
                           int64_t hidden, int64_t inter_local, int experts, int topk, int dtype, int* out) {
  const char* fn = "tessera_moe_tp_resolve";
  return guarded(fn, [&] {
    const auto a = moe_tp_args(fn, x_shard, expert_ids, weights, w_gate_up, w_down, out_shard, tokens_local, hidden,
                               inter_local, experts, topk, dtype);
    TESSERA_CHECK(out != nullptr, "{}: out is null", fn);
    auto o = moe_tp_options_of(fn, s, TESSERA_AUTOMATIC);
    o.tune_on_miss = true;  // resolving is the place to measure
    auto& ctx = need_moe_tp(s, fn);
    tessera::ops::Strategy chosen{};
    run_on(s, std::nullopt, [&] { chosen = tessera::ops::resolve_moe_tp(ctx, a, o); });
    *out = static_cast<int>(chosen);
  });
}

int tessera_moe_tp_check_status(tessera_session* s) {
  const char* fn = "tessera_moe_tp_check_status";
  return guarded(fn, [&] {
    need(s, fn);
    if (s->moe_tp) run_on(s, std::nullopt, [&] { s->moe_tp->check_status(); });
  });
}

int tessera_moe_ep_ex(tessera_session* s, void* stream, const void* x_shard, const int32_t* expert_ids,
                      const float* weights, const void* w_gate_up, const void* w_down, void* out_shard,
                      int64_t tokens_local, int64_t hidden, int64_t inter, int experts, int topk, int64_t capacity,
                      int dtype, int strategy) {
  const char* fn = "tessera_moe_ep_ex";
  return guarded(fn, [&] {
    auto a = moe_args<tessera::ops::MoeEpArgs>(fn, x_shard, expert_ids, weights, w_gate_up, w_down, out_shard,
                                               tokens_local, hidden, "inter", inter, experts, topk, dtype);
    check_size(fn, "capacity", capacity, 0);
    a.inter = inter;
    a.capacity = capacity;
    tessera::ops::MoeEpOptions o;
    o.strategy = moe_strategy_of(fn, tessera::ops::OpKind::moe_ep, strategy);
    auto& ctx = need_moe_ep(s, fn);
    run_on(s, stream, [&] { tessera::ops::moe_ep(ctx, a, o); });
  });
}

int tessera_moe_ep_check_status(tessera_session* s) {
  const char* fn = "tessera_moe_ep_check_status";
  return guarded(fn, [&] {
    need(s, fn);
    if (s->moe_ep) run_on(s, std::nullopt, [&] { s->moe_ep->check_status(); });
  });
}

int tessera_moe_topk_gating(void* stream, const void* logits, int32_t* expert_ids, float* weights, int64_t tokens,
                            int experts, int k, int64_t ld_logits, int logits_dtype, int renormalize) {
  const char* fn = "tessera_moe_topk_gating";
  return guarded(fn, [&] {
    using tessera::kernels::moe::kMaxExperts;
    using tessera::kernels::moe::kMaxTopK;
    check_size(fn, "tokens", tokens, 0);
    TESSERA_CHECK(experts >= 1 && experts <= kMaxExperts, "{}: experts = {} out of range [1, {}]", fn, experts,
                  kMaxExperts);
    TESSERA_CHECK(k >= 1 && k <= kMaxTopK && k <= experts, "{}: k = {} out of range [1, min({}, experts = {})]", fn, k,
                  kMaxTopK, experts);
    TESSERA_CHECK(ld_logits == 0 || (ld_logits >= experts && ld_logits < (int64_t{1} << 31)),
                  "{}: ld_logits = {} (0: experts, else >= experts = {})", fn, ld_logits, experts);
    TESSERA_CHECK(logits_dtype == TESSERA_F32 || logits_dtype == TESSERA_BF16 || logits_dtype == TESSERA_F16,
                  "{}: logits dtype code {} (TESSERA_BF16 = 0, TESSERA_F16 = 1 or TESSERA_F32 = 2)", fn, logits_dtype);
    TESSERA_CHECK(renormalize == 0 || renormalize == 1, "{}: renormalize = {} (0 or 1)", fn, renormalize);
    for (auto [name, p] : {std::pair{"logits", logits}, std::pair{"expert_ids", static_cast<const void*>(expert_ids)},
                           std::pair{"weights", static_cast<const void*>(weights)}})
      TESSERA_CHECK(p != nullptr, "{}: {} is null", fn, name);
    tessera::kernels::moe::TopKArgs a;
    a.logits = logits;
    a.logits_dtype = logits_dtype == TESSERA_F32 ? tessera::DType::f32 : dtype_of(logits_dtype);
    a.ld_logits = ld_logits;
    a.tokens = tokens;
    a.experts = experts;
    a.k = k;
    a.renormalize = renormalize != 0;
    a.expert_ids = expert_ids;
    a.weights = weights;
    tessera::kernels::moe::topk_gating(a, static_cast<cudaStream_t>(stream));
  });
}

int tessera_device_count(int* out) {
  return guarded("tessera_device_count", [&] {
    TESSERA_CHECK(out != nullptr, "tessera_device_count: out is null");
    *out = 0;
    const cudaError_t e = cudaGetDeviceCount(out);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      *out = 0;
      TESSERA_FAIL("cudaGetDeviceCount: {}", cudaGetErrorString(e));
    }
  });
}

int tessera_can_access_peer(int device, int peer, int* out) {
  return guarded("tessera_can_access_peer", [&] {
    TESSERA_CHECK(out != nullptr, "tessera_can_access_peer: out is null");
    *out = 0;
    TESSERA_CUDA_CHECK(cudaDeviceCanAccessPeer(out, device, peer));
  });
}

int tessera_lsa_probe(int ndev, int* lsa_size) {
  return guarded("tessera_lsa_probe", [&] {
    TESSERA_CHECK(lsa_size != nullptr, "tessera_lsa_probe: lsa_size is null");
    TESSERA_CHECK(ndev >= 1 && ndev <= 64, "tessera_lsa_probe: ndev {} (1..64)", ndev);
    *lsa_size = 0;
    ncclComm_t comms[64] = {};
    TESSERA_NCCL_CHECK(ncclCommInitAll(comms, ndev, nullptr));
    *lsa_size = ncclTeamLsa(comms[0]).nRanks;
    for (int i = 0; i < ndev; ++i) (void)ncclCommDestroy(comms[i]);
  });
}

int tessera_resolve(tessera_session* s, int op, int64_t m, int64_t m_local, int64_t n, int64_t k, int dtype, int swiglu,
                    const void* a, const void* b, void* d, int* out) {
  return guarded("tessera_resolve", [&] {
    for (auto [name, v, lo] :
         {std::tuple{"m", m, 1}, std::tuple{"m_local", m_local, 0}, std::tuple{"n", n, 1}, std::tuple{"k", k, 1}})
      check_size("tessera_resolve", name, v, lo);
    TESSERA_CHECK(op == 0 || op == 1, "tessera_resolve: op {} (0 ag_gemm, 1 gemm_rs)", op);
    check_flags("tessera_resolve", swiglu, op == 0 ? kAgFlags : kRsFlags);
    need(s, "tessera_resolve");
    TESSERA_CHECK(out != nullptr, "tessera_resolve: out is null");
    auto o = options_of(s, TESSERA_AUTOMATIC);
    o.tune_on_miss = true;  // resolving is the place to measure
    const auto chosen = op == 0 ? s->ctx->resolve(ag_args(a, b, d, m, m_local, n, k, 0, dtype, swiglu), o)
                                : s->ctx->resolve(rs_args(a, b, d, m, m_local, n, k, dtype, swiglu), o);
    *out = static_cast<int>(chosen);
  });
}

}  // extern "C"
