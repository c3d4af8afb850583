#!/usr/bin/env python3
"""torch._grouped_mm baseline for `tessera bench grouped`.

Times torch._grouped_mm on the MoE-1..6 expert GEMMs (../shared/WORKLOADS.md)
with the routing `tessera bench grouped` uses (same row counts per expert),
and prints one JSON object per problem:
  {"shape", "tp", "gemm": "gateup"|"down", "routing", "n", "k", "rows",
   "torch_ms", "torch_tflops", "torch_layout", "dense_mm_ms"}
gate/up: N = 2 I / TP, K = H; down: N = H, K = I / TP; rows = S * topk.
Weights are [G, N, K] (nn.Linear) passed transposed (the "nk" layout) and,
if that is not accepted, [G, K, N]; the faster accepted one is reported.
Timing: CUDA events per call, warm-up, median.
"""
import argparse
import json
import sys

import torch

MOE = [("MoE-1", 8192, 2048, 1536, 8, 2), ("MoE-2", 8192, 2048, 1536, 32, 2),
       ("MoE-3", 8192, 2048, 1536, 32, 5), ("MoE-4", 8192, 4096, 2048, 8, 2),
       ("MoE-5", 8192, 4096, 2048, 32, 2), ("MoE-6", 8192, 4096, 2048, 32, 5)]


def routing(S, E, topk, skewed):
    """Rows per expert: uniform, or one hot expert with half of the routed rows
    (capped at S: a token picks an expert once), every 4th other expert none,
    the rest sharing evenly. Same as bench/grouped/bench_grouped.cpp."""
    T = S * topk
    if not skewed:
        return [T // E + (1 if e < T % E else 0) for e in range(E)]
    r = [0] * E
    r[0] = min(T // 2, S)
    live = [e for e in range(1, E) if e % 4 != 0]
    rest = T - r[0]
    for i, e in enumerate(live):
        r[e] = rest // len(live) + (1 if i < rest % len(live) else 0)
    return r


def time_ms(fn, warm, reps):
    for _ in range(warm):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return t[len(t) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", default="1,2,4")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    for tp in [int(x) for x in args.tp.split(",")]:
        for name, S, H, I, E, topk in MOE:
            for gemm in ("gateup", "down"):
                for skewed in (False, True):
                    n, k = (2 * I // tp, H) if gemm == "gateup" else (H, I // tp)
                    rows = routing(S, E, topk, skewed)
                    T = sum(rows)
                    a = torch.randn(T, k, device=dev, dtype=torch.bfloat16)
                    offs = torch.tensor(rows, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
                    w_nk = torch.randn(E, n, k, device=dev, dtype=torch.bfloat16)
                    best = None
                    for layout, b in (("nk", w_nk.transpose(-2, -1)), ("kn", w_nk.transpose(-2, -1).contiguous())):
                        try:
                            ms = time_ms(lambda: torch._grouped_mm(a, b, offs=offs), args.warmup, args.reps)
                        except Exception as e:  # layout not accepted
                            print(json.dumps({"note": f"{name} {gemm} layout {layout}: {type(e).__name__}: {e}"[:300]}),
                                  file=sys.stderr)
                            continue
                        if best is None or ms < best[0]:
                            best = (ms, layout)
                    wd = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
                    dense = time_ms(lambda: torch.mm(a, wd.t()), args.warmup, args.reps)
                    flop = 2.0 * T * n * k
                    rec = {"shape": name, "tp": tp, "gemm": gemm, "routing": "skewed" if skewed else "uniform",
                           "n": n, "k": k, "rows": T, "dense_mm_ms": dense}
                    if best:
                        rec.update({"torch_ms": best[0], "torch_tflops": flop / best[0] / 1e9, "torch_layout": best[1]})
                    print(json.dumps(rec), flush=True)
                    del a, w_nk, wd
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
