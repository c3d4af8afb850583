#!/usr/bin/env python3
"""PyTorch sequential TP MoE layer: the baseline of `tessera bench moe`.

    python3 scripts/bench_moe_torch.py [--shapes 1,2,3,4,5,6] > torch.jsonl      (one GPU)
    torchrun --nproc-per-node R scripts/bench_moe_torch.py ...                    (R ranks)

Per rank, the layer the way a PyTorch user writes it: all-gather the token
shard and its routing (NCCL), sort the routed entries by expert (argsort),
index_select the rows, torch._grouped_mm with the gate/up weights, SiLU(gate)
* up, torch._grouped_mm with the down weights, scale by the gate weights,
index_add back per token, reduce-scatter. Same shapes, sharding and routing
rule as bench/moe/bench_moe.cpp (see its header). Prints one JSON object per
case on rank 0: {"shape", "routing", "world", "torch_ms"} (CUDA events,
warm-up, median, max over ranks).
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

MOE = {1: ("MoE-1", 8192, 2048, 1536, 8, 2), 2: ("MoE-2", 8192, 2048, 1536, 32, 2),
       3: ("MoE-3", 8192, 2048, 1536, 32, 5), 4: ("MoE-4", 8192, 4096, 2048, 8, 2),
       5: ("MoE-5", 8192, 4096, 2048, 32, 2), 6: ("MoE-6", 8192, 4096, 2048, 32, 5)}


def route(t0, n, E, k, skewed):
    live = E - E // 4 if skewed else E
    stride = max(1, live // k)
    ids = []
    for t in range(t0, t0 + n):
        row = []
        for s in range(k):
            e = (t + s * stride) % live
            if skewed and s == 0 and t % 2 == 0:
                e = 0
            while e in row:
                e = (e + 1) % live
            row.append(e)
        ids.append(row)
    return ids


def time_ms(fn, warm, reps, world):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        if world > 1:
            dist.barrier()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    t = torch.tensor([times[len(times) // 2]], device="cuda")
    if world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1,2,3,4,5,6")
    ap.add_argument("--routing", default="uniform,skewed")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if world > 1:
        dist.init_process_group("nccl")
    dev = torch.device("cuda")
    for si in [int(s) for s in args.shapes.split(",")]:
        name, S, H, I, E, k = MOE[si]
        Tl, Il = S // world, I // world
        x = torch.randn(Tl, H, device=dev, dtype=torch.bfloat16)
        w_gu = torch.randn(E, 2 * Il, H, device=dev, dtype=torch.bfloat16) * 0.02
        w_dn = torch.randn(E, H, Il, device=dev, dtype=torch.bfloat16) * 0.02
        for routing in args.routing.split(","):
            ids = torch.tensor(route(Tl * rank, Tl, E, k, routing == "skewed"), device=dev, dtype=torch.int32)
            gw = torch.full((Tl, k), 1.0 / k, device=dev, dtype=torch.float32)

            def layer():
                if world > 1:
                    xf = torch.empty(S, H, device=dev, dtype=x.dtype)
                    idf = torch.empty(S, k, device=dev, dtype=ids.dtype)
                    gwf = torch.empty(S, k, device=dev, dtype=gw.dtype)
                    dist.all_gather_into_tensor(xf, x)
                    dist.all_gather_into_tensor(idf, ids)
                    dist.all_gather_into_tensor(gwf, gw)
                else:
                    xf, idf, gwf = x, ids, gw
                flat = idf.flatten()
                order = torch.argsort(flat, stable=True)
                token = order // k
                offs = torch.bincount(flat, minlength=E).cumsum(0).to(torch.int32)
                xs = xf.index_select(0, token)
                h = torch._grouped_mm(xs, w_gu.transpose(-2, -1), offs=offs)
                h = F.silu(h[:, 0::2]) * h[:, 1::2]
                y = torch._grouped_mm(h, w_dn.transpose(-2, -1), offs=offs)
                y = y * gwf.flatten()[order].unsqueeze(1).to(y.dtype)
                out = torch.zeros(S, H, device=dev, dtype=y.dtype).index_add_(0, token, y)
                if world > 1:
                    shard = torch.empty(Tl, H, device=dev, dtype=y.dtype)
                    dist.reduce_scatter_tensor(shard, out)
                    return shard
                return out

            ms = time_ms(layer, args.warmup, args.reps, world)
            if rank == 0:
                print(json.dumps({"shape": name, "routing": routing, "world": world, "torch_ms": ms}), flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
