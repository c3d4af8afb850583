// Policy-instantiated grouped GEMMs and helper kernels for
// grouped_gemm_test.cpp (no fmt here: see grouped_launch.cuh). bf16, B [G, N, K].
#include "tessera/link/memory_order.cuh"
#include "grouped_gemm_policy_kernels.hpp"

#include "tessera/kernels/gemm/grouped_launch.cuh"

namespace tessera::kernels::testk {

namespace {
template <GroupedTile T, class Pro, class Epi>
void launch(const GroupedGemmArgs& a, const Pro& pro, const Epi& epi, cudaStream_t s) {
  grouped_gemm_with_tile<T, __nv_bfloat16, BLayout::NK>(a, GroupedGemmOptions{}, pro, epi, s);
}

__global__ void release_after_kernel(uint32_t* flags, int count, uint32_t value, uint64_t delay_ns) {
  const uint64_t start = tessera::link::mo::globaltimer_ns();
  while (tessera::link::mo::globaltimer_ns() - start < delay_ns) __nanosleep(1000);
  for (int i = threadIdx.x; i < count; i += blockDim.x) tessera::link::mo::red_add_release_gpu(flags + i, value);
}
}  // namespace

void grouped_notify(const GroupedGemmArgs& a, bool ping_pong, uint32_t* flags, bool per_group, cudaStream_t s) {
  engine::GroupedEpilogue<__nv_bfloat16, engine::kEpiNotify> epi;
  epi.store.d = static_cast<__nv_bfloat16*>(a.d);
  epi.store.ldd = a.ldd ? a.ldd : a.n;
  epi.flags = flags;
  epi.per_group = per_group;
  if (ping_pong)
    launch<GroupedTile::PingPong128x128>(a, engine::NoWait{}, epi, s);
  else
    launch<GroupedTile::Coop128x256>(a, engine::NoWait{}, epi, s);
}

void grouped_flag_wait(const GroupedGemmArgs& a, bool ping_pong, const uint32_t* flags, int rows_per_flag,
                       uint32_t expected, uint64_t timeout_ns, cudaStream_t s) {
  engine::FlagWait<uint32_t> pro;
  pro.flags = flags;
  pro.expected = expected;
  pro.rows_per_flag = rows_per_flag;
  pro.timeout_ns = timeout_ns;
  pro.diag = runtime::process_wait_diagnostics().device_record();
  engine::StdEpilogue<__nv_bfloat16> epi;
  epi.d = static_cast<__nv_bfloat16*>(a.d);
  epi.ldd = a.ldd ? a.ldd : a.n;
  if (ping_pong)
    launch<GroupedTile::PingPong128x128>(a, pro, epi, s);
  else
    launch<GroupedTile::Coop128x256>(a, pro, epi, s);
}

void release_after(uint32_t* flags, int count, uint32_t value, uint64_t delay_ns, cudaStream_t s) {
  release_after_kernel<<<1, 256, 0, s>>>(flags, count, value, delay_ns);
  detail::check_launch("release_after");
}

}  // namespace tessera::kernels::testk
