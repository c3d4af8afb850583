#include "tessera/runtime/process_group.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tessera/runtime/env.hpp"
#include "tessera/runtime/signals.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"
#include "tessera/runtime/nccl_bootstrap.hpp"

namespace tessera::runtime {

int nccl_runtime_version() {
  int v = 0;
  TESSERA_NCCL_CHECK(ncclGetVersion(&v));
  return v;
}

namespace {

// The header and the loaded library must be the same NCCL: the device API's
// structs (ncclDevComm, ncclDevCommRequirements) changed between 2.28
// patch releases, and GPU machines carry several copies.
void check_nccl_version() {
  const int lib = nccl_runtime_version();
  TESSERA_CHECK(lib == NCCL_VERSION_CODE,
                "NCCL library version {} differs from the header Tessera was built with ({}); "
                "make the loader pick the same copy (RPATH, LD_LIBRARY_PATH) or rebuild with TESSERA_NCCL_ROOT",
                lib, NCCL_VERSION_CODE);
}

/// TESSERA_NO_LSA=1 or TESSERA_TOPOLOGY=net: behave as if no peer were
/// load/store reachable (a multi-node job, or a test of that path on one node).
bool lsa_disabled() {
  if (env::get_int("TESSERA_NO_LSA", 0, 0, 1) != 0) return true;
  const auto topo = env::get("TESSERA_TOPOLOGY");
  return topo && *topo == "net";
}

// Every live ProcessGroup of the process (order_after_all_groups). Never
// destroyed: a group torn down during static destruction still finds them.
std::mutex& group_registry_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<ProcessGroup*>& group_registry() {
  static auto* groups = new std::vector<ProcessGroup*>;
  return *groups;
}

}  // namespace

void ProcessGroup::order_after_all_groups(cudaStream_t stream, int device) {
  std::lock_guard lock(group_registry_mutex());
  for (const ProcessGroup* g : group_registry()) {
    if (g->device_ != device) continue;
    std::vector<cudaStream_t> streams = g->comm_streams_;
    if (g->stream_) streams.push_back(g->stream_);
    for (cudaStream_t s : streams) {
      if (s == stream || stream_capturing(s)) continue;
      cudaEvent_t tail = nullptr;
      TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&tail, cudaEventDisableTiming));
      const cudaError_t rec = cudaEventRecord(tail, s);
      const cudaError_t wait = rec == cudaSuccess ? cudaStreamWaitEvent(stream, tail, 0) : rec;
      (void)cudaEventDestroy(tail);  // released once the recorded work completes
      TESSERA_CUDA_CHECK(wait);
    }
  }
}

void ProcessGroup::register_group() {
  std::lock_guard lock(group_registry_mutex());
  group_registry().push_back(this);
}

void ProcessGroup::unregister_group() {
  std::lock_guard lock(group_registry_mutex());
  auto& groups = group_registry();
  groups.erase(std::remove(groups.begin(), groups.end(), this), groups.end());
}

std::unique_ptr<ProcessGroup> ProcessGroup::from_environment(ProcessGroupOptions opts) {
  return create(detect_launch_info(), opts);
}

std::unique_ptr<ProcessGroup> ProcessGroup::create(const LaunchInfo& info, ProcessGroupOptions opts) {
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup());
  pg->info_ = info;
  tessera::detail::set_current_rank(info.rank);
  check_nccl_version();

  // GPUs first: a node with fewer GPUs than local ranks is a launch error,
  // reported before any peer is waited for.
  int ngpu = 0;
  const cudaError_t cerr = cudaGetDeviceCount(&ngpu);
  if (cerr != cudaSuccess) {
    (void)cudaGetLastError();
    TESSERA_FAIL("no usable CUDA device (cudaGetDeviceCount: {}); rank {} of {} needs one GPU per process",
                 cudaGetErrorString(cerr), info.rank, info.world);
  }
  TESSERA_CHECK(ngpu >= info.local_world,
                "{} local ranks were launched on this node but only {} GPU(s) are visible (world size {})",
                info.local_world, ngpu, info.world);
  pg->device_ = opts.device >= 0 ? opts.device : info.local_rank;
  TESSERA_CHECK(pg->device_ < ngpu, "device {} does not exist ({} visible)", pg->device_, ngpu);
  TESSERA_CUDA_CHECK(cudaSetDevice(pg->device_));
  TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&pg->props_, pg->device_));

  pg->boot_ = Bootstrap::connect(info, opts.bootstrap_timeout);

  // Every rank must use a distinct GPU: two ranks on one device would
  // deadlock inside NCCL. Compare (host, PCI id) across ranks.
  struct Where {
    char key[128];
  } me{};
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  std::snprintf(me.key, sizeof(me.key), "%s/%04x:%02x:%02x", host, pg->props_.pciDomainID, pg->props_.pciBusID,
                pg->props_.pciDeviceID);
  const auto where = pg->allgather(me);
  for (int r = 0; r < info.world; ++r) {
    TESSERA_CHECK(r == info.rank || std::strcmp(where[r].key, me.key) != 0,
                  "ranks {} and {} both use GPU {} (device {}): each rank needs its own GPU", r, info.rank, me.key,
                  pg->device_);
  }

  ncclUniqueId id{};
  if (info.rank == 0) TESSERA_NCCL_CHECK(ncclGetUniqueId(&id));
  pg->boot_->broadcast(&id, sizeof(id), 0);
  pg->boot_->barrier();  // a peer that died before NCCL init is reported here, not as a hang in NCCL

  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  TESSERA_NCCL_CHECK(ncclCommInitRankConfig(&pg->comm_, info.world, id, info.rank, &cfg));

  pg->lsa_off_ = lsa_disabled();
  pg->lsa_size_ = pg->lsa_off_ ? 1 : ncclTeamLsa(pg->comm_).nRanks;
  if (pg->lsa_reachable()) {
    ncclDevCommRequirements reqs{};
    TESSERA_NCCL_CHECK(ncclDevCommCreate(pg->comm_, &reqs, &pg->dev_comm_));
    pg->dev_comm_created_ = true;
  }

  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&pg->stream_, cudaStreamNonBlocking));
  for (int i = 0; i < opts.comm_streams; ++i) {
    cudaStream_t s;
    TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    pg->comm_streams_.push_back(s);
  }
  pg->register_group();
  return pg;
}

std::unique_ptr<ProcessGroup> ProcessGroup::create_from_unique_id(int rank, int world, int device,
                                                                  const ncclUniqueId& id, ProcessGroupOptions opts) {
  TESSERA_CHECK(world >= 1 && rank >= 0 && rank < world, "create_from_unique_id: rank {} of world {}", rank, world);
  TESSERA_CHECK(device >= 0, "create_from_unique_id: device {} (a CUDA device index is required)", device);
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup());
  pg->info_.rank = rank;
  pg->info_.world = world;
  pg->info_.local_rank = rank;
  pg->info_.local_world = world;
  pg->info_.source = "nccl-unique-id";
  tessera::detail::set_current_rank(rank);
  check_nccl_version();

  int ngpu = 0;
  const cudaError_t cerr = cudaGetDeviceCount(&ngpu);
  if (cerr != cudaSuccess) {
    (void)cudaGetLastError();
    TESSERA_FAIL("no usable CUDA device (cudaGetDeviceCount: {}); rank {} of {} needs one GPU",
                 cudaGetErrorString(cerr), rank, world);
  }
  TESSERA_CHECK(device < ngpu, "create_from_unique_id: device {} does not exist ({} visible)", device, ngpu);
  pg->device_ = device;
  TESSERA_CUDA_CHECK(cudaSetDevice(device));
  TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&pg->props_, device));

  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  TESSERA_NCCL_CHECK(ncclCommInitRankConfig(&pg->comm_, world, id, rank, &cfg));
  {
    auto boot = std::make_unique<NcclBootstrap>(pg->comm_, rank, world, device, opts.bootstrap_timeout);
    boot->set_before_exchange([device](cudaStream_t s) { order_after_all_groups(s, device); });
    pg->boot_ = std::move(boot);
  }

  // Every rank must use a distinct GPU (as in create()).
  struct Where {
    char key[128];
  } me{};
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  std::snprintf(me.key, sizeof(me.key), "%s/%04x:%02x:%02x", host, pg->props_.pciDomainID, pg->props_.pciBusID,
                pg->props_.pciDeviceID);
  const auto where = pg->allgather(me);
  for (int r = 0; r < world; ++r) {
    TESSERA_CHECK(r == rank || std::strcmp(where[r].key, me.key) != 0,
                  "ranks {} and {} both use GPU {} (device {}): each rank needs its own GPU", r, rank, me.key, device);
  }

  pg->lsa_off_ = lsa_disabled();
  pg->lsa_size_ = pg->lsa_off_ ? 1 : ncclTeamLsa(pg->comm_).nRanks;
  if (pg->lsa_reachable()) {
    ncclDevCommRequirements reqs{};
    TESSERA_NCCL_CHECK(ncclDevCommCreate(pg->comm_, &reqs, &pg->dev_comm_));
    pg->dev_comm_created_ = true;
  }
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&pg->stream_, cudaStreamNonBlocking));
  for (int i = 0; i < opts.comm_streams; ++i) {
    cudaStream_t s;
    TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    pg->comm_streams_.push_back(s);
  }
  pg->register_group();
  return pg;
}

ProcessGroup::~ProcessGroup() {
  // Destructors must not throw, and must not hang on a dead peer: every wait
  // below is bounded (bounded_sync; the finalize runs on a helper thread).
  unregister_group();
  std::vector<cudaStream_t> streams = comm_streams_;
  if (stream_) streams.push_back(stream_);
  bool idle = true;
  for (cudaStream_t s : streams) {
    try {
      bounded_sync(s, "ProcessGroup teardown", comm_ ? this : nullptr);
    } catch (const std::exception& e) {  // aborted by bounded_sync when it had a communicator
      std::fprintf(stderr, "%s\n", e.what());
      idle = false;
      break;
    }
  }
  if (!idle && !aborted_) abort();
  if (!idle) {  // after the abort the NCCL kernels end; anything else still stuck is leaked
    for (cudaStream_t s : streams) {
      try {
        bounded_sync(s, "ProcessGroup teardown after abort", nullptr);
      } catch (const std::exception&) {
        idle = false;
      }
    }
  }
  for (cudaStream_t s : comm_streams_) (void)cudaStreamDestroy(s);
  if (stream_) (void)cudaStreamDestroy(stream_);
  // cudaFree synchronizes the device: only when nothing of ours is stuck.
  if (align_token_ && idle) (void)cudaFree(align_token_);
  if (dev_comm_created_ && !aborted_) (void)ncclDevCommDestroy(comm_, &dev_comm_);
  if (comm_ && !aborted_) {
    // ncclCommFinalize flushes outstanding operations and can wait for a
    // peer; it runs on a helper thread so that a dead peer costs at most the
    // wait timeout (then the thread is left behind and the communicator
    // leaked: calling ncclCommAbort beside a blocking finalize is not safe).
    ncclComm_t comm = comm_;
    auto done = std::make_shared<std::promise<bool>>();
    std::future<bool> finished = done->get_future();
    std::thread([comm, done] {
      const bool ok = ncclCommFinalize(comm) == ncclSuccess && ncclCommDestroy(comm) == ncclSuccess;
      if (!ok) (void)ncclCommAbort(comm);
      done->set_value(ok);
    }).detach();
    if (finished.wait_for(std::chrono::nanoseconds(wait_timeout_ns())) != std::future_status::ready)
      std::fprintf(stderr,
                   "[tessera rank %d] ProcessGroup teardown: ncclCommFinalize did not return within %llu ms (a peer "
                   "is gone?); the communicator is left to the process exit\n",
                   info_.rank, static_cast<unsigned long long>(wait_timeout_ns() / 1000000));
  }
}

bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  TESSERA_CUDA_CHECK(cudaStreamIsCapturing(stream, &st));
  return st != cudaStreamCaptureStatusNone;
}

std::optional<unsigned long long> capture_id(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  TESSERA_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &st, &id));
  if (st == cudaStreamCaptureStatusNone) return std::nullopt;
  return id;
}

void ProcessGroup::register_signals(const Signals* s) {
  std::lock_guard lock(signals_mutex_);
  signals_.push_back(s);
}

void ProcessGroup::unregister_signals(const Signals* s) {
  std::lock_guard lock(signals_mutex_);
  std::erase(signals_, s);
}

std::string ProcessGroup::release_host_waits() {
  std::vector<const Signals*> all;
  {
    std::lock_guard lock(signals_mutex_);
    all = signals_;
  }
  cudaStream_t side = nullptr;
  if (all.empty() || cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) != cudaSuccess) return {};
  std::string released;
  for (const Signals* s : all) {
    try {
      const std::string r = s->release_host_waits(side, std::nullopt);
      if (!r.empty()) released += (released.empty() ? "" : "; ") + r;
    } catch (const Error&) {  // a sticky device error: nothing to release any more
    }
  }
  (void)cudaStreamDestroy(side);
  return released;
}

void ProcessGroup::synchronize(cudaStream_t stream, const char* what) { bounded_sync(stream, what, this); }

void ProcessGroup::synchronize_all(const char* what) {
  std::vector<cudaStream_t> all = comm_streams_;
  all.push_back(stream_);
  for (cudaStream_t s : all) bounded_sync(s, what, this);
}

void ProcessGroup::abort() {
  if (aborted_ || comm_ == nullptr) return;
  aborted_ = true;
  // ncclCommAbort ends NCCL's own kernels, but its cudaFree waits for the
  // whole device: with another stuck kernel (a wait that never times out) it
  // would never return. So it runs on a helper thread, waited for at most
  // TESSERA_WAIT_TIMEOUT_MS; past that it is left to finish (or not) while
  // the caller reports the failure and exits.
  ncclComm_t comm = comm_;
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread([comm, done] {
    (void)ncclCommAbort(comm);
    done->set_value();
  }).detach();
  if (finished.wait_for(std::chrono::nanoseconds(wait_timeout_ns())) != std::future_status::ready)
    std::fprintf(stderr,
                 "[tessera rank %d] ncclCommAbort did not return within %llu ms (other work on the GPU is stuck); "
                 "continuing without it\n",
                 info_.rank, static_cast<unsigned long long>(wait_timeout_ns() / 1000000));
}

void ProcessGroup::throw_aborted(const char* what) const {
  throw Error(
      fmt::format("[tessera rank {}] ProcessGroup::{}: the NCCL communicator was aborted after a failed "
                  "wait; create a new process group",
                  info_.rank, what));
}

cudaStream_t ProcessGroup::comm_stream(int i) const {
  TESSERA_CHECK(i >= 0 && i < comm_stream_count(), "comm_stream({}) out of range: {} communication streams", i,
                comm_stream_count());
  return comm_streams_[i];
}

void ProcessGroup::barrier() { boot_->barrier(); }

void ProcessGroup::prepare_align_streams() {
  if (align_token_ != nullptr) return;
  TESSERA_CUDA_CHECK(cudaMalloc(&align_token_, sizeof(float)));
  TESSERA_CUDA_CHECK(cudaMemset(align_token_, 0, sizeof(float)));
}

void ProcessGroup::align_streams(cudaStream_t stream) {
  prepare_align_streams();
  // Only the all-reduce's completion matters; the value is never read.
  TESSERA_NCCL_CHECK(ncclAllReduce(align_token_, align_token_, 1, ncclFloat, ncclSum, comm_, stream));
}

double ProcessGroup::allreduce_max(double v) {
  double m = v;
  for (double x : allgather(v)) m = x > m ? x : m;
  return m;
}

void ProcessGroup::check_same_on_all_ranks(const std::string& what, const void* data, std::size_t bytes) {
  // Lengths first, so ranks passing different sizes fail cleanly too.
  const auto sizes = allgather(static_cast<std::uint64_t>(bytes));
  for (int r = 0; r < world(); ++r) {
    TESSERA_CHECK(sizes[r] == bytes, "{}: rank {} passed {} bytes of description, rank {} passed {}", what, r, sizes[r],
                  rank(), bytes);
  }
  boot_->check_same(data, bytes, what);
}

ncclDataType_t nccl_dtype(DType t) {
  switch (t) {
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::f32:
      return ncclFloat32;
    default:
      break;
  }
  TESSERA_FAIL("nccl_dtype: dtype {} has no NCCL reduction type here", dtype_name(t));
}

}  // namespace tessera::runtime
