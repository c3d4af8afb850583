// tessera::kernels::gemm — dispatch of the policy-free GEMM to the kernels
// compiled per input type and B layout.
#include "tessera/kernels/gemm.hpp"

#include <cuda_runtime_api.h>

#include <optional>

#include "tessera/kernels/gemm/host_detail.hpp"
#include "tessera/kernels/gemm_plan.hpp"
#include "tessera/runtime/env.hpp"

#include "tessera/runtime/error.hpp"

namespace tessera::kernels {
namespace detail {
void gemm_plain_bf16_nk(const GemmArgs&, const GemmOptions&, cudaStream_t);
void gemm_plain_bf16_kn(const GemmArgs&, const GemmOptions&, cudaStream_t);
void gemm_plain_f16_nk(const GemmArgs&, const GemmOptions&, cudaStream_t);
void gemm_plain_f16_kn(const GemmArgs&, const GemmOptions&, cudaStream_t);
}  // namespace detail

GemmOptions tuned_options(const GemmArgs& a, const GemmOptions& o) {
  if (o.tile != GemmTile::Auto || o.ping_pong || o.cluster_m != 0 || o.k_splits != 0) return o;
  const GemmPlanLookup lookup = gemm_plan_lookup();
  TESSERA_CHECK(lookup != nullptr,
                "gemm: a tuned plan was asked for (gemm_tuned or TESSERA_GEMM_TUNED=1) but no tuned-plan source is "
                "installed (call tune::install_gemm_tuned_plans())");
  const std::optional<GemmPlan> p = lookup(a, plan_sm_count(o));
  // The source validates against the same candidates; checked again here
  // so that no source can make gemm() run a plan plan_gemm() could not.
  if (!p || !gemm_plan_valid(a, *p)) return o;
  return plan_options(*p, o);
}

bool gemm_tuned_by_env() {
  static const bool on = [] {
    const std::optional<std::string> v = env::get("TESSERA_GEMM_TUNED");
    TESSERA_CHECK(!v || *v == "0" || *v == "1", "TESSERA_GEMM_TUNED = '{}' (0 or 1)", *v);
    return v && *v == "1";
  }();
  return on;
}

namespace {

void gemm_impl(const GemmArgs& args, const GemmOptions& o, cudaStream_t stream);

}  // namespace

void gemm_tuned(const GemmArgs& a, const GemmOptions& o, cudaStream_t stream) {
  validate(a, "gemm");
  gemm_impl(a, tuned_options(a, o), stream);
}

void gemm(const GemmArgs& a, const GemmOptions& o, cudaStream_t stream) {
  validate(a, "gemm");
  gemm_impl(a, gemm_tuned_by_env() ? tuned_options(a, o) : o, stream);
}

namespace {

void gemm_impl(const GemmArgs& args, const GemmOptions& o, cudaStream_t stream) {
  GemmArgs a = args;
  void* staged = nullptr;
  if (!d_rows_aligned(args)) {
    // D rows that are not 16-byte multiples: compute into an aligned buffer,
    // then one 2-D copy (cuBLASLt runs these; the kernels store 16 bytes).
    a.ldd = (a.n + 7) / 8 * 8;
    staged = detail::acquire_workspace(static_cast<size_t>(a.m * a.ldd) * dtype_size(a.out), stream);
    a.d = staged;
  }
  const bool nk = a.b_layout == BLayout::NK;
  if (a.in == DType::bf16)
    nk ? detail::gemm_plain_bf16_nk(a, o, stream) : detail::gemm_plain_bf16_kn(a, o, stream);
  else
    nk ? detail::gemm_plain_f16_nk(a, o, stream) : detail::gemm_plain_f16_kn(a, o, stream);
  if (staged) {
    const size_t es = dtype_size(a.out);
    TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(args.d, args.ldd_or_packed() * es, staged, a.ldd * es, a.n * es, a.m,
                                         cudaMemcpyDeviceToDevice, stream));
    detail::release_workspace(staged, stream);
  }
}

}  // namespace

}  // namespace tessera::kernels
