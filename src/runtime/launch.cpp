// Reads rank / world / rendezvous from torchrun, Open MPI and SLURM
// environments. See include/tessera/runtime/launch.hpp for the rules.
#include "tessera/runtime/launch.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::runtime {
namespace {

constexpr std::int64_t kMaxWorld = 1 << 20;

bool is_set(const char* name) { return env::get(name).has_value(); }

/// The integer `name`, which must be set because `why` is.
int required_int(const char* name, const char* why, std::int64_t lo, std::int64_t hi) {
  auto v = env::find_int(name, lo, hi);
  TESSERA_CHECK(v.has_value(), "launch environment: {} is set but {} is not", why, name);
  return static_cast<int>(*v);
}

/// Checks 0 <= rank < world etc. with messages naming the variables.
void check_ranks(const LaunchInfo& li, const char* rank_var, const char* world_var, const char* local_rank_var,
                 const char* local_world_var) {
  TESSERA_CHECK(li.world >= 1, "launch environment: {} = {} must be at least 1", world_var, li.world);
  TESSERA_CHECK(li.rank >= 0 && li.rank < li.world, "launch environment: {} = {} is out of range for {} = {}", rank_var,
                li.rank, world_var, li.world);
  TESSERA_CHECK(li.local_world >= 1 && li.local_world <= li.world,
                "launch environment: {} = {} must be in [1, {} = {}]", local_world_var, li.local_world, world_var,
                li.world);
  TESSERA_CHECK(li.local_rank >= 0 && li.local_rank < li.local_world,
                "launch environment: {} = {} is out of range for {} = {}", local_rank_var, li.local_rank,
                local_world_var, li.local_world);
}

std::optional<int> master_port_from_env() {
  auto p = env::find_int("MASTER_PORT", 1, 65535);
  if (!p) return std::nullopt;
  return static_cast<int>(*p);
}

std::optional<std::string> master_addr_from_env() {
  auto a = env::get("MASTER_ADDR");
  if (!a) return std::nullopt;
  TESSERA_CHECK(!a->empty(), "launch environment: MASTER_ADDR is set but empty");
  return a;
}

/// Fills in the rendezvous address: MASTER_ADDR/MASTER_PORT, else the
/// convention's fallbacks; required only when world > 1.
void set_rendezvous(LaunchInfo& li, const std::function<std::optional<std::string>()>& addr_fallback,
                    const std::function<std::optional<int>()>& port_fallback, const char* missing_hint) {
  auto addr = master_addr_from_env();
  auto port = master_port_from_env();  // validated even when world == 1
  if (li.world == 1) {
    li.master_addr = addr.value_or("127.0.0.1");
    li.master_port = port.value_or(0);
    return;
  }
  if (!addr) addr = addr_fallback();
  TESSERA_CHECK(addr.has_value(), "launch environment ({}): world size is {} but MASTER_ADDR is not set{}", li.source,
                li.world, missing_hint);
  if (!port) port = port_fallback();
  TESSERA_CHECK(port.has_value(), "launch environment ({}): world size is {} but MASTER_PORT is not set{}", li.source,
                li.world, missing_hint);
  li.master_addr = *addr;
  li.master_port = *port;
}

LaunchInfo from_torchrun() {
  LaunchInfo li;
  li.source = "torchrun";
  const char* why = is_set("RANK")         ? "RANK"
                    : is_set("WORLD_SIZE") ? "WORLD_SIZE"
                    : is_set("LOCAL_RANK") ? "LOCAL_RANK"
                                           : "LOCAL_WORLD_SIZE";
  li.world = required_int("WORLD_SIZE", why, INT64_MIN, kMaxWorld);
  TESSERA_CHECK(li.world >= 1, "launch environment: WORLD_SIZE = {} must be at least 1", li.world);
  li.rank = required_int("RANK", why, INT64_MIN, kMaxWorld);
  const bool has_lr = is_set("LOCAL_RANK"), has_lw = is_set("LOCAL_WORLD_SIZE");
  if (has_lr || has_lw) {
    li.local_rank = required_int("LOCAL_RANK", has_lr ? "LOCAL_RANK" : "LOCAL_WORLD_SIZE", INT64_MIN, kMaxWorld);
    li.local_world = required_int("LOCAL_WORLD_SIZE", has_lw ? "LOCAL_WORLD_SIZE" : "LOCAL_RANK", INT64_MIN, kMaxWorld);
  } else {  // one node assumed
    li.local_rank = li.rank;
    li.local_world = li.world;
  }
  check_ranks(li, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  set_rendezvous(
      li, [] { return std::optional<std::string>(); }, [] { return std::optional<int>(); }, "");
  return li;
}

std::optional<int> port_from_hash(const std::string& text) {
  std::uint32_t h = 2166136261u;  // FNV-1a: stable across processes and runs
  for (unsigned char c : text) h = (h ^ c) * 16777619u;
  return static_cast<int>(20000 + h % 20000);
}

LaunchInfo from_openmpi() {
  LaunchInfo li;
  li.source = "openmpi";
  const char* why = is_set("OMPI_COMM_WORLD_RANK") ? "OMPI_COMM_WORLD_RANK" : "OMPI_COMM_WORLD_SIZE";
  li.world = required_int("OMPI_COMM_WORLD_SIZE", why, INT64_MIN, kMaxWorld);
  TESSERA_CHECK(li.world >= 1, "launch environment: OMPI_COMM_WORLD_SIZE = {} must be at least 1", li.world);
  li.rank = required_int("OMPI_COMM_WORLD_RANK", why, INT64_MIN, kMaxWorld);
  li.local_rank = required_int("OMPI_COMM_WORLD_LOCAL_RANK", why, INT64_MIN, kMaxWorld);
  li.local_world = required_int("OMPI_COMM_WORLD_LOCAL_SIZE", why, INT64_MIN, kMaxWorld);
  check_ranks(li, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE");
  const bool one_node = li.local_world == li.world;
  set_rendezvous(
      li,
      [&]() -> std::optional<std::string> { return one_node ? std::optional<std::string>("127.0.0.1") : std::nullopt; },
      []() -> std::optional<int> {
        for (const char* v : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"}) {
          if (auto s = env::get(v); s && !s->empty()) return port_from_hash(*s);
        }
        return std::nullopt;
      },
      " (set MASTER_ADDR/MASTER_PORT for a multi-node Open MPI job)");
  return li;
}

/// Tasks per node from a SLURM list such as "4(x2),3": the count of node `node`.
int slurm_tasks_on_node(const char* var, const std::string& text, int node) {
  int index = 0;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    std::string count = item, repeat = "1";
    if (auto open = item.find("(x"); open != std::string::npos) {
      TESSERA_CHECK(item.back() == ')', "launch environment: {} = '{}' is malformed", var, text);
      count = item.substr(0, open);
      repeat = item.substr(open + 2, item.size() - open - 3);
    }
    const auto c = env::parse_int(count, var, 1, kMaxWorld);
    const auto r = env::parse_int(repeat, var, 1, kMaxWorld);
    if (node < index + r) return static_cast<int>(c);
    index += static_cast<int>(r);
    pos = comma + 1;
  }
  TESSERA_FAIL("launch environment: {} = '{}' lists {} node(s) but SLURM_NODEID = {}", var, text, index, node);
}

/// First host of a SLURM host list, e.g. "gpu[07-09,12],login1" -> "gpu07".
std::string slurm_first_host(const std::string& list) {
  std::string first;
  int depth = 0;
  for (char c : list) {
    if (c == ',' && depth == 0) break;
    if (c == '[') ++depth;
    if (c == ']') --depth;
    first += c;
  }
  const auto open = first.find('[');
  if (open == std::string::npos) return first;
  const auto close = first.find(']', open);
  if (close == std::string::npos) return {};
  const std::string range = first.substr(open + 1, close - open - 1);
  const std::string lo = range.substr(0, range.find_first_of(",-"));
  return first.substr(0, open) + lo + first.substr(close + 1);
}

LaunchInfo from_slurm() {
  LaunchInfo li;
  li.source = "slurm";
  li.world = required_int("SLURM_NTASKS", "SLURM_PROCID", INT64_MIN, kMaxWorld);
  TESSERA_CHECK(li.world >= 1, "launch environment: SLURM_NTASKS = {} must be at least 1", li.world);
  li.rank = required_int("SLURM_PROCID", "SLURM_PROCID", INT64_MIN, kMaxWorld);
  li.local_rank = required_int("SLURM_LOCALID", "SLURM_PROCID", INT64_MIN, kMaxWorld);
  if (auto n = env::find_int("SLURM_NTASKS_PER_NODE", INT64_MIN, kMaxWorld)) {
    li.local_world = static_cast<int>(*n);
  } else {
    const char* var = is_set("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE"
                      : is_set("SLURM_TASKS_PER_NODE")    ? "SLURM_TASKS_PER_NODE"
                                                          : nullptr;
    if (var != nullptr) {
      const int node = static_cast<int>(env::get_int("SLURM_NODEID", 0, 0, kMaxWorld));
      li.local_world = slurm_tasks_on_node(var, *env::get(var), node);
    } else {
      li.local_world = li.world;
    }
  }
  check_ranks(li, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
              is_set("SLURM_NTASKS_PER_NODE") ? "SLURM_NTASKS_PER_NODE" : "SLURM_TASKS_PER_NODE");
  const bool one_node = env::get_int("SLURM_NNODES", 0, 0, kMaxWorld) == 1 || li.local_world == li.world;
  set_rendezvous(
      li,
      [&]() -> std::optional<std::string> {
        if (one_node) return "127.0.0.1";
        for (const char* v : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
          if (auto s = env::get(v); s && !s->empty()) {
            auto host = slurm_first_host(*s);
            TESSERA_CHECK(!host.empty(), "launch environment: {} = '{}' is not a host list", v, *s);
            return host;
          }
        }
        return std::nullopt;
      },
      []() -> std::optional<int> {
        if (auto id = env::find_int("SLURM_JOB_ID", 0, INT64_MAX)) return static_cast<int>(20000 + *id % 20000);
        return std::nullopt;
      },
      " (nor SLURM_JOB_NODELIST / SLURM_JOB_ID to derive it from)");
  return li;
}

constexpr std::size_t kMinSecretChars = 16;

/// The job secret (launch.hpp): TESSERA_JOB_SECRET, else a value derived from
/// the job's ids, the rendezvous address and the world size.
void set_job_secret(LaunchInfo& li) {
  if (li.world == 1) return;
  if (auto s = env::get("TESSERA_JOB_SECRET")) {
    TESSERA_CHECK(s->size() >= kMinSecretChars,
                  "launch environment: TESSERA_JOB_SECRET has {} characters; it needs at least {} (e.g. 32 random "
                  "bytes in hex: openssl rand -hex 32)",
                  s->size(), kMinSecretChars);
    li.job_secret = *s;
    li.secret_source = "TESSERA_JOB_SECRET";
    li.secret_derived = false;
    return;
  }
  std::vector<const char*> vars;
  if (li.source == "torchrun")
    vars = {"TORCHELASTIC_RUN_ID"};
  else if (li.source == "slurm")
    vars = {"SLURM_JOB_ID", "SLURM_STEP_ID"};
  else if (li.source == "openmpi")
    vars = {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"};
  std::string text = "tessera-job|" + li.source;
  std::string used;
  for (const char* v : vars) {
    if (auto s = env::get(v)) {
      text += fmt::format("|{}={}", v, *s);
      used += (used.empty() ? "" : ", ") + std::string(v);
    }
  }
  text += fmt::format("|{}:{}|world={}", li.master_addr, li.master_port, li.world);
  li.job_secret = text;
  li.secret_source = fmt::format("derived from {}{}MASTER_ADDR:MASTER_PORT and the world size (not a secret)", used,
                                 used.empty() ? "" : ", ");
  li.secret_derived = true;
}

LaunchInfo detect_unauthenticated() {
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
    if (is_set(v)) return from_torchrun();
  }
  if (is_set("OMPI_COMM_WORLD_RANK") || is_set("OMPI_COMM_WORLD_SIZE")) return from_openmpi();
  if (is_set("SLURM_PROCID")) return from_slurm();
  LaunchInfo li;
  li.source = "single";
  li.master_addr = "127.0.0.1";
  return li;
}

}  // namespace

LaunchInfo detect_launch_info() {
  LaunchInfo li = detect_unauthenticated();
  set_job_secret(li);
  return li;
}

}  // namespace tessera::runtime
