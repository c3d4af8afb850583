// tessera/commir/machine.hpp — what the cost model knows about a machine:
// per-GPU memory, kernel rates, and per mesh level (intra-node / inter-node)
// point-to-point bandwidth, collective bus bandwidth and latency.
//
// Built-in profiles:
//  h200x2  — measured figures of MACHINES.md (2 x H200, NV18): cuBLAS bf16 GEMM
//            757 TFLOP/s, SDPA 612 TFLOP/s, copy-engine P2P 388 GB/s, NCCL
//            all-gather bus bandwidth 246 GB/s at 256 MiB with ~50 us fixed
//            cost (fit of the 1/4/16/256 MiB points). No inter-node link was
//            measured: the inter level reuses the seed's 100 Gb/s figure.
//  h100, a100, l4 — the seed's Table 3 (Mercury): memory, intra-node link
//            (NVLink 900 / 600 GB/s, PCIe 64 GB/s, both directions: half per
//            direction), inter-node 100 / 50 / 50 Gb/s. Kernel rates: 75% of
//            the dense fp16 peak (Table 3 lists H100 1979 and L4 242 TFLOP/s
//            with sparsity, i.e. 989 / 121 dense; A100 312 dense).
//            Latencies (10 us intra, 20 us inter) are assumptions.
// JSON form: the fields below by name; load_profile reads a file.
#pragma once

#include <string>
#include <vector>

namespace tessera::commir {

struct LinkLevel {
  double p2p_gbps = 0;    // GB/s per direction per GPU
  double coll_gbps = 0;   // collective bus bandwidth, GB/s
  double latency_us = 0;  // fixed cost per transfer / collective
};

struct MachineProfile {
  std::string name;
  double memory_gb = 0;
  double gemm_tflops = 0;
  double attention_tflops = 0;
  double kernel_overhead_us = 0;  // launch + tail per local kernel call
  int gpus_per_node = 8;
  LinkLevel intra, inter;
  /// The link of each mesh level: from the innermost level outwards, levels
  /// stay intra-node while the product of their sizes fits in a node.
  std::vector<LinkLevel> links(const std::vector<int>& mesh) const;
};

MachineProfile builtin_profile(const std::string& name);  // h200x2, h100, a100, l4
std::vector<std::string> builtin_profile_names();
MachineProfile load_profile(const std::string& path);
std::string profile_json(const MachineProfile& p);

}  // namespace tessera::commir
