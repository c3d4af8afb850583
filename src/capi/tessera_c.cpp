// The C interface (include/tessera/capi/tessera.h): a thin shell over
// runtime::ProcessGroup, ops::TpContext and the ops entry points. Every
// exception stops here and becomes -1 plus tessera_last_error().
#include "tessera/capi/tessera.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "tessera/ops/tp_mlp.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/launch.hpp"
#include "tessera/runtime/process_group.hpp"

struct tessera_session {
  std::unique_ptr<tessera::runtime::ProcessGroup> pg;
  std::unique_ptr<tessera::ops::TpContext> ctx;
  bool use_cache = true;
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
  return o;
}

void need(const tessera_session* s, const char* fn) {
  TESSERA_CHECK(s != nullptr && s->ctx != nullptr, "{}: null session", fn);
}

tessera::ops::AgGemmArgs ag_args(const void* a, const void* b, void* d, int64_t m, int64_t m_local, int64_t n,
                                 int64_t k, int64_t ldd, int dtype, int swiglu) {
  return {.a = a, .b = b, .d = d, .m = m, .m_local = m_local, .n = n, .k = k, .ldd = ldd, .dtype = dtype_of(dtype),
          .swiglu = swiglu != 0};
}

tessera::ops::GemmRsArgs rs_args(const void* a, const void* b, void* d, int64_t m, int64_t m_local, int64_t n,
                                 int64_t k, int dtype) {
  return {.a = a, .b = b, .d = d, .m = m, .m_local = m_local, .n = n, .k = k, .dtype = dtype_of(dtype)};
}

}  // namespace

extern "C" {

const char* tessera_last_error(void) { return g_error.c_str(); }

int tessera_session_create(int rank, int world, int local_rank, int local_world, int device, const char* master_addr,
                           int master_port, tessera_session** out) {
  return guarded("tessera_session_create", [&] {
    TESSERA_CHECK(out != nullptr, "tessera_session_create: out is null");
    *out = nullptr;
    TESSERA_CHECK(world >= 1 && rank >= 0 && rank < world, "tessera_session_create: rank {} of world {}", rank, world);
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
    s->ctx = std::make_unique<tessera::ops::TpContext>(*s->pg);
    *out = s.release();
  });
}

void tessera_session_destroy(tessera_session* s) {
  if (!s) return;
  guarded("tessera_session_destroy", [&] {
    // Work still queued on the session's streams may use the memory freed
    // below: finish it first (the caller may not have synchronized).
    if (s->pg) TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    s->ctx.reset();  // before the process group it uses
    s->pg.reset();
  });
  delete s;
}

void* tessera_session_stream(tessera_session* s) { return s && s->pg ? static_cast<void*>(s->pg->stream()) : nullptr; }

void tessera_session_use_cache(tessera_session* s, int on) {
  if (s) s->use_cache = on != 0;
}

int tessera_ag_gemm(tessera_session* s, const void* a, const void* b, void* d, int64_t m, int64_t m_local, int64_t n,
                    int64_t k, int64_t ldd, int dtype, int swiglu, int strategy) {
  return guarded("tessera_ag_gemm", [&] {
    need(s, "tessera_ag_gemm");
    tessera::ops::ag_gemm(*s->ctx, ag_args(a, b, d, m, m_local, n, k, ldd, dtype, swiglu), options_of(s, strategy));
  });
}

int tessera_gemm_rs(tessera_session* s, const void* a, const void* b, void* d, int64_t m, int64_t m_local, int64_t n,
                    int64_t k, int dtype, int strategy) {
  return guarded("tessera_gemm_rs", [&] {
    need(s, "tessera_gemm_rs");
    tessera::ops::gemm_rs(*s->ctx, rs_args(a, b, d, m, m_local, n, k, dtype), options_of(s, strategy));
  });
}

int tessera_gemm_ar(tessera_session* s, const void* a, const void* b, void* d, int64_t m, int64_t n, int64_t k,
                    int dtype, int strategy) {
  return guarded("tessera_gemm_ar", [&] {
    need(s, "tessera_gemm_ar");
    const tessera::ops::GemmArArgs g{.a = a, .b = b, .d = d, .m = m, .n = n, .k = k, .dtype = dtype_of(dtype)};
    tessera::ops::gemm_ar(*s->ctx, g, options_of(s, strategy));
  });
}

int tessera_mlp(tessera_session* s, const void* x, const void* w_gate_up, const void* w_down, void* out, int64_t m,
                int64_t m_local, int64_t h, int64_t i_local, int dtype, int ag_strategy, int rs_strategy) {
  return guarded("tessera_mlp", [&] {
    need(s, "tessera_mlp");
    const tessera::ops::MlpArgs a{.x = x, .w_gate_up = w_gate_up, .w_down = w_down, .out = out, .m = m,
                                  .m_local = m_local, .h = h, .i_local = i_local, .dtype = dtype_of(dtype)};
    tessera::ops::mlp(*s->ctx, a, options_of(s, ag_strategy), options_of(s, rs_strategy));
  });
}

int tessera_resolve(tessera_session* s, int op, int64_t m, int64_t m_local, int64_t n, int64_t k, int dtype,
                    int swiglu, const void* a, const void* b, void* d, int* out) {
  return guarded("tessera_resolve", [&] {
    need(s, "tessera_resolve");
    TESSERA_CHECK(out != nullptr, "tessera_resolve: out is null");
    TESSERA_CHECK(op == 0 || op == 1, "tessera_resolve: op {} (0 ag_gemm, 1 gemm_rs)", op);
    const auto o = options_of(s, TESSERA_AUTOMATIC);
    const auto chosen = op == 0 ? s->ctx->resolve(ag_args(a, b, d, m, m_local, n, k, 0, dtype, swiglu), o)
                                : s->ctx->resolve(rs_args(a, b, d, m, m_local, n, k, dtype), o);
    *out = static_cast<int>(chosen);
  });
}

}  // extern "C"
