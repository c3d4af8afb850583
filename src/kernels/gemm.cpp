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

namespace {

// TESSERA_GEMM_TUNED=1: GemmPlanSource::Default means Tuned. Read once.
bool tuned_by_env() {
  static const bool on = [] {
    const std::optional<std::string> v = env::get("TESSERA_GEMM_TUNED");
    TESSERA_CHECK(!v || *v == "0" || *v == "1", "TESSERA_GEMM_TUNED = '{}' (0 or 1)", *v);
    return v && *v == "1";
  }();
  return on;
}

bool names_plan(const GemmOptions& o) {
  return o.tile != GemmTile::Auto || o.ping_pong || o.cluster_m != 0 || o.cluster_n != 0 || o.k_splits != 0 ||
         o.stream_k || o.swap_ab;
}

void gemm_impl(const GemmArgs& args, const GemmOptions& o, cudaStream_t stream);

}  // namespace

GemmOptions resolve_options(const GemmArgs& a, const GemmOptions& o) {
  TESSERA_CHECK(o.plan_source == GemmPlanSource::Default || o.plan_source == GemmPlanSource::Model ||
                    o.plan_source == GemmPlanSource::Tuned,
                "gemm: plan_source = {} (Default, Model or Tuned)", static_cast<int>(o.plan_source));
  GemmOptions r = o;
  r.plan_source = GemmPlanSource::Model;
  if (names_plan(o)) return r;
  const bool tuned =
      o.plan_source == GemmPlanSource::Tuned || (o.plan_source == GemmPlanSource::Default && tuned_by_env());
  if (!tuned) return r;
  const GemmPlanLookup lookup = gemm_plan_lookup();
  TESSERA_CHECK(lookup != nullptr,
                "gemm: a tuned plan was asked for (plan_source Tuned or TESSERA_GEMM_TUNED=1) but no tuned-plan "
                "source is installed (call tune::install_gemm_tuned_plans())");
  const std::optional<GemmPlan> p = lookup(a, plan_sm_count(o));
  // The source validates against the same candidates; checked again here
  // so that no source can make gemm() run a plan plan_gemm() could not.
  if (!p || !gemm_plan_valid(a, *p)) return r;
  return plan_options(*p, r);
}

void gemm(const GemmArgs& a, const GemmOptions& o, cudaStream_t stream) {
  validate(a, "gemm");
  gemm_impl(a, resolve_options(a, o), stream);
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
