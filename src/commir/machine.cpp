// Machine profiles for the CommIR cost model (figures documented in machine.hpp).
#include "tessera/commir/machine.hpp"

#include <fstream>
#include <nlohmann/json.hpp>

#include "tessera/runtime/error.hpp"

namespace tessera::commir {

std::vector<LinkLevel> MachineProfile::links(const std::vector<int>& mesh) const {
  std::vector<LinkLevel> v(mesh.size(), inter);
  long prod = 1;
  for (int l = static_cast<int>(mesh.size()) - 1; l >= 0; --l) {
    prod *= mesh[l];
    if (prod <= gpus_per_node) v[l] = intra;
  }
  return v;
}

std::vector<std::string> builtin_profile_names() { return {"h200x2", "h100", "a100", "l4"}; }

MachineProfile builtin_profile(const std::string& name) {
  MachineProfile p;
  p.name = name;
  if (name == "h200x2") {
    p.memory_gb = 141;
    p.gemm_tflops = 757;
    p.attention_tflops = 612;
    p.kernel_overhead_us = 5;
    p.gpus_per_node = 2;
    p.intra = {388, 246, 50};
    p.inter = {12.5, 12.5, 20};
  } else if (name == "h100") {
    p.memory_gb = 80;
    p.gemm_tflops = p.attention_tflops = 0.75 * 989;
    p.kernel_overhead_us = 5;
    p.intra = {450, 450, 10};
    p.inter = {12.5, 12.5, 20};
  } else if (name == "a100") {
    p.memory_gb = 40;
    p.gemm_tflops = p.attention_tflops = 0.75 * 312;
    p.kernel_overhead_us = 5;
    p.intra = {300, 300, 10};
    p.inter = {6.25, 6.25, 20};
  } else if (name == "l4") {
    p.memory_gb = 24;
    p.gemm_tflops = p.attention_tflops = 0.75 * 121;
    p.kernel_overhead_us = 5;
    p.intra = {32, 32, 10};
    p.inter = {6.25, 6.25, 20};
  } else {
    TESSERA_FAIL("machine profile '{}': unknown; built-in profiles are h200x2, h100, a100, l4 (or pass a JSON file)",
                 name);
  }
  return p;
}

namespace {
LinkLevel link_from(const nlohmann::json& j, const std::string& what) {
  LinkLevel l;
  l.p2p_gbps = j.at("p2p_gbps").get<double>();
  l.coll_gbps = j.at("coll_gbps").get<double>();
  l.latency_us = j.at("latency_us").get<double>();
  TESSERA_CHECK(l.p2p_gbps > 0 && l.coll_gbps > 0 && l.latency_us >= 0,
                "machine profile: {} link needs positive bandwidths", what);
  return l;
}
nlohmann::json link_to(const LinkLevel& l) {
  return {{"p2p_gbps", l.p2p_gbps}, {"coll_gbps", l.coll_gbps}, {"latency_us", l.latency_us}};
}
}  // namespace

MachineProfile load_profile(const std::string& path) {
  std::ifstream in(path);
  TESSERA_CHECK(in.good(), "machine profile: cannot open '{}'", path);
  try {
    const auto j = nlohmann::json::parse(in);
    MachineProfile p;
    p.name = j.value("name", path);
    p.memory_gb = j.at("memory_gb").get<double>();
    p.gemm_tflops = j.at("gemm_tflops").get<double>();
    p.attention_tflops = j.at("attention_tflops").get<double>();
    p.kernel_overhead_us = j.value("kernel_overhead_us", 5.0);
    p.gpus_per_node = j.value("gpus_per_node", 8);
    p.intra = link_from(j.at("intra"), "intra");
    p.inter = link_from(j.at("inter"), "inter");
    TESSERA_CHECK(p.memory_gb > 0 && p.gemm_tflops > 0 && p.attention_tflops > 0 && p.gpus_per_node > 0,
                  "machine profile '{}': memory, rates and gpus_per_node must be positive", path);
    return p;
  } catch (const nlohmann::json::exception& e) {
    TESSERA_FAIL("machine profile '{}': {}", path, e.what());
  }
}

std::string profile_json(const MachineProfile& p) {
  nlohmann::json j{{"name", p.name},
                   {"memory_gb", p.memory_gb},
                   {"gemm_tflops", p.gemm_tflops},
                   {"attention_tflops", p.attention_tflops},
                   {"kernel_overhead_us", p.kernel_overhead_us},
                   {"gpus_per_node", p.gpus_per_node},
                   {"intra", link_to(p.intra)},
                   {"inter", link_to(p.inter)}};
  return j.dump(2);
}

}  // namespace tessera::commir
