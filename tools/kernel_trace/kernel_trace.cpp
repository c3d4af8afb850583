// libtessera_kernel_trace.so: a GPU timeline of any CUDA process, for
// machines without Nsight Systems. The CUDA driver loads it when
//
//   CUDA_INJECTION64_PATH=/path/to/libtessera_kernel_trace.so
//
// is set, and calls InitializeInjection() from cuInit. It records every
// kernel, memcpy and memset through CUPTI's activity API (GPU start/end
// timestamps, device, stream) and, when the process exits, writes
// $TESSERA_KERNEL_TRACE_DIR/trace-<host>-<pid>.json (default directory: .)
// in the Chrome trace format (chrome://tracing, ui.perfetto.dev):
// pid = device, tid = stream. scripts/trace_summary.py reads these files.
//
// Contract: it changes no program behaviour other than CUPTI's own overhead
// (about a microsecond per launch); TESSERA_KERNEL_TRACE_MAX bounds the
// records kept (default 2,000,000; later ones are counted, not kept), so a
// long program cannot exhaust host memory. Failures are reported on stderr
// and leave the program running untraced.
#include <cupti.h>
#include <cxxabi.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Record {
  std::uint64_t start, end;
  std::uint32_t device, stream;
  std::uint64_t bytes;  ///< memcpy / memset size; 0 for kernels
  std::string name;
};

struct Trace {
  std::mutex mu;
  std::vector<Record> records;
  std::size_t max_records = 2000000;
  std::size_t dropped = 0;
  bool written = false;
};

Trace& trace() {
  static Trace* t = new Trace;  // never destroyed: used from atexit and CUPTI threads
  return *t;
}

constexpr std::size_t kBufferBytes = 8u << 20;

void report(const char* what, CUptiResult r) {
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "tessera kernel trace: %s failed: %s\n", what, msg ? msg : "unknown error");
}

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = (status == 0 && d) ? d : name;
  std::free(d);
  return out;
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void keep(Record&& r) {
  Trace& t = trace();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.records.size() >= t.max_records) {
    ++t.dropped;
    return;
  }
  t.records.push_back(std::move(r));
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        keep({k->start, k->end, k->deviceId, k->streamId, 0, demangle(k->name)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        keep({m->start, m->end, m->deviceId, m->streamId, m->bytes, "memcpy"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY2: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpyPtoP4*>(rec);
        keep({m->start, m->end, m->deviceId, m->streamId, m->bytes, "memcpy peer"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        keep({m->start, m->end, m->deviceId, m->streamId, m->bytes, "memset"});
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
}

/// JSON string body: names are C++ signatures, so quotes and backslashes
/// are the only characters that need escaping (control characters dropped).
std::string escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) >= 0x20) {
      out += c;
    }
  }
  return out;
}

void write_trace() {
  Trace& t = trace();
  if (CUptiResult r = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED); r != CUPTI_SUCCESS)
    report("cuptiActivityFlushAll", r);
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.written) return;
  t.written = true;
  const char* dir = std::getenv("TESSERA_KERNEL_TRACE_DIR");
  char host[64] = "host";
  gethostname(host, sizeof(host) - 1);
  const std::string path =
      std::string(dir && *dir ? dir : ".") + "/trace-" + host + "-" + std::to_string(getpid()) + ".json";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "tessera kernel trace: cannot write %s\n", path.c_str());
    return;
  }
  std::fprintf(f, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"pid\":%d,\"dropped\":%zu},\"traceEvents\":[\n",
               static_cast<int>(getpid()), t.dropped);
  bool first = true;
  for (const Record& r : t.records) {
    // Chrome trace times are microseconds; keep ns precision as decimals.
    std::fprintf(f, "%s{\"name\":\"%s\",\"ph\":\"X\",\"pid\":%u,\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f",
                 first ? "" : ",\n", escape(r.name).c_str(), r.device, r.stream, r.start / 1e3,
                 (r.end - r.start) / 1e3);
    if (r.bytes) std::fprintf(f, ",\"args\":{\"bytes\":%llu}", static_cast<unsigned long long>(r.bytes));
    std::fputc('}', f);
    first = false;
  }
  std::fprintf(f, "\n]}\n");
  std::fclose(f);
  std::fprintf(stderr, "tessera kernel trace: %zu records (%zu dropped) -> %s\n", t.records.size(), t.dropped,
               path.c_str());
}

/// Flush before a context goes away: its records cannot be read after.
void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void*) {
  if (domain == CUPTI_CB_DOMAIN_RESOURCE && id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING)
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  if (const char* m = std::getenv("TESSERA_KERNEL_TRACE_MAX")) trace().max_records = std::strtoull(m, nullptr, 10);
  if (CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed); r != CUPTI_SUCCESS) {
    report("cuptiActivityRegisterCallbacks", r);
    return 0;
  }
  CUpti_SubscriberHandle subscriber{};
  if (cuptiSubscribe(&subscriber, on_callback, nullptr) == CUPTI_SUCCESS)
    cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING);
  for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                  CUPTI_ACTIVITY_KIND_MEMCPY2, CUPTI_ACTIVITY_KIND_MEMSET})
    if (CUptiResult r = cuptiActivityEnable(kind); r != CUPTI_SUCCESS) report("cuptiActivityEnable", r);
  std::atexit(write_trace);
  return 1;
}
