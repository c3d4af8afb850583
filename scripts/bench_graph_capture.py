#!/usr/bin/env python3
"""The TP MLP layer inside CUDA graphs: overlapped against sequential strategies.

Per shape (MLP-1..3 of ../shared/WORKLOADS.md by default, S tokens, hidden H,
intermediate I over R ranks), one layer call `ctx.mlp(x, w_gate_up, w_down)`
is timed in five forms, interleaved rep by rep so clock drift hits all alike:

  eager sequential        strategies sequential / sequential, eager calls
  eager fused             AG+GEMM fused_ce / GEMM+RS fused_ce, eager calls, a context never captured
  graph sequential        a CUDA graph of --calls layer calls, sequential strategies
  graph fused             the same graph with the fused strategies (each replay resets the flags first)
  eager fused, captured   eager fused calls on the context that was captured (each call resets the flags)

Each timing is --calls calls (or one replay of --calls captured calls) between
CUDA events after a barrier and a one-element all-reduce; median of --reps,
max over ranks, reported per layer call. Inputs are random (every mantissa bit).
Prints one JSON object per line (shape, form, ms) and a table on rank 0.

  NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \\
    TESSERA_C_LIB=build/lib/libtessera_c.so PYTHONPATH=python \\
    torchrun --nproc-per-node 2 scripts/bench_graph_capture.py --shapes 1,2,3 > graph.jsonl
"""
import argparse
import json
import os
import statistics
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

SHAPES = {1: ("MLP-1", 8192, 4096, 11008), 2: ("MLP-2", 8192, 4096, 14336), 3: ("MLP-3", 8192, 3584, 14336)}
FORMS = ["eager sequential", "eager fused", "graph sequential", "graph fused", "eager fused, captured"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="1,2,3", help="MLP shape numbers (1..3)")
    p.add_argument("--calls", type=int, default=4, help="layer calls per timing (and per graph)")
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args()
    try:
        import torch
        import torch.distributed as dist
        import tessera.torch as tt
    except ImportError as e:  # the CPU machine
        print(f"bench_graph_capture: {e}; nothing to time", file=sys.stderr)
        return 0
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(dev)
    g = torch.Generator(device=dev)
    token = torch.zeros(1, device=dev)

    def randn(*shape, seed, scale=1.0):
        g.manual_seed(seed)
        return (torch.randn(*shape, generator=g, device=dev) * scale).to(torch.bfloat16)

    rows = []
    for n in (int(s) for s in args.shapes.split(",")):
        name, m, h, inter = SHAPES[n]
        il = inter // world
        x = randn(m // world, h, seed=1 + rank)
        wgu = randn(2 * il, h, seed=10 + rank, scale=0.02)
        wd = randn(h, il, seed=20 + rank, scale=0.02)
        plain, captured = tt.Context(), tt.Context()
        seq = dict(ag_strategy="sequential", rs_strategy="sequential")
        fused = dict(ag_strategy="fused_ce", rs_strategy="fused_ce")

        def calls(c, kw):
            for _ in range(args.calls):
                c.mlp(x, wgu, wd, m=m, **kw)

        for c in (plain, captured):  # workspaces at their size before the captures
            calls(c, seq)
            calls(c, fused)
        torch.cuda.synchronize()
        graphs = {}
        for key, kw in (("seq", seq), ("fused", fused)):
            graphs[key] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[key]):
                calls(captured, kw)
        run = {
            "eager sequential": lambda: calls(plain, seq),
            "eager fused": lambda: calls(plain, fused),
            "graph sequential": graphs["seq"].replay,
            "graph fused": graphs["fused"].replay,
            "eager fused, captured": lambda: calls(captured, fused),
        }
        times = {f: [] for f in FORMS}
        for rep in range(args.reps + 2):
            for f in FORMS:
                torch.cuda.synchronize()
                dist.barrier()
                dist.all_reduce(token)
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run[f]()
                stop.record()
                stop.synchronize()
                if rep >= 2:  # warm-up
                    times[f].append(start.elapsed_time(stop) / args.calls)
        for f in FORMS:
            t = torch.tensor([statistics.median(times[f])], device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            rows.append({"shape": name, "m": m, "h": h, "i": inter, "world": world, "form": f, "ms": t.item(),
                         "calls": args.calls, "reps": args.reps})
        del graphs
        torch.cuda.synchronize()
        plain.close()
        captured.close()
    if rank == 0:
        for r in rows:
            print(json.dumps(r))
        print(f"# TP = {world}, ms per layer call (median of {args.reps}, slowest rank)", file=sys.stderr)
        print("# shape  " + "  ".join(f"{f:>22s}" for f in FORMS), file=sys.stderr)
        for name in dict.fromkeys(r["shape"] for r in rows):
            ms = {r["form"]: r["ms"] for r in rows if r["shape"] == name}
            print(f"# {name:6s} " + "  ".join(f"{ms[f]:22.4f}" for f in FORMS), file=sys.stderr)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
