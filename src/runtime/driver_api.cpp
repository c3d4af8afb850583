#include "tessera/runtime/driver_api.hpp"

#include <mutex>

#include "tessera/runtime/error.hpp"

namespace tessera::runtime::driver {

namespace {

using WriteValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WaitValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using GetErrorString = CUresult (*)(CUresult, const char**);
using DeviceGetAttribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);

struct Api {
  WriteValue64 write64 = nullptr;
  WriteValue32 write32 = nullptr;
  WaitValue64 wait64 = nullptr;
  WaitValue32 wait32 = nullptr;
  GetErrorString error_string = nullptr;
  DeviceGetAttribute attribute = nullptr;
};

template <class F>
void load(const char* name, F& fn) {
  cudaDriverEntryPointQueryResult q{};
  void* p = nullptr;
  TESSERA_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q));
  TESSERA_CHECK(q == cudaDriverEntryPointSuccess && p != nullptr, "CUDA driver entry point {} not found", name);
  fn = reinterpret_cast<F>(p);
}

const Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    load("cuStreamWriteValue64", a.write64);
    load("cuStreamWriteValue32", a.write32);
    load("cuStreamWaitValue64", a.wait64);
    load("cuStreamWaitValue32", a.wait32);
    load("cuGetErrorString", a.error_string);
    load("cuDeviceGetAttribute", a.attribute);
  });
  return a;
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = "?";
  if (api().error_string) api().error_string(r, &s);
  TESSERA_FAIL("CUDA driver error {} ({}) in {}", static_cast<int>(r), s, what);
}

// Whether the current device can flush remote writes after a wait (the
// acquire half of a stream wait). Cached per device.
unsigned wait_flags() {
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  static int cached_dev = -1;
  static unsigned cached = 0;
  static std::mutex m;
  std::lock_guard lock(m);
  if (cached_dev != dev) {
    int can_flush = 0;
    check(api().attribute(&can_flush, CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, dev),
          "cuDeviceGetAttribute(CAN_FLUSH_REMOTE_WRITES)");
    cached = CU_STREAM_WAIT_VALUE_GEQ | (can_flush ? CU_STREAM_WAIT_VALUE_FLUSH : 0);
    cached_dev = dev;
  }
  return cached;
}

}  // namespace

void stream_write_u64(cudaStream_t stream, std::uint64_t* addr, std::uint64_t value) {
  check(api().write64(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(addr), value,
                      CU_STREAM_WRITE_VALUE_DEFAULT),
        "cuStreamWriteValue64");
}

void stream_write_u32(cudaStream_t stream, std::uint32_t* addr, std::uint32_t value) {
  check(api().write32(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(addr), value,
                      CU_STREAM_WRITE_VALUE_DEFAULT),
        "cuStreamWriteValue32");
}

void stream_wait_geq_u64(cudaStream_t stream, std::uint64_t* addr, std::uint64_t value) {
  check(api().wait64(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(addr), value, wait_flags()),
        "cuStreamWaitValue64");
}

void stream_wait_geq_u32(cudaStream_t stream, std::uint32_t* addr, std::uint32_t value) {
  check(api().wait32(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(addr), value, wait_flags()),
        "cuStreamWaitValue32");
}

}  // namespace tessera::runtime::driver
