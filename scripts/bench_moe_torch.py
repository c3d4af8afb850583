#!/usr/bin/env python3
"""PyTorch sequential TP / EP MoE layers: the baselines of `tessera bench moe`.

    python3 scripts/bench_moe_torch.py [--shapes 1,2,3,4,5,6] > torch.jsonl      (one GPU)
    torchrun --nproc-per-node R scripts/bench_moe_torch.py [--ep] ...             (R ranks)

Per rank, the layer the way a PyTorch user writes it: all-gather the token
shard and its routing (NCCL), sort the routed entries by expert (argsort),
index_select the rows, torch._grouped_mm with the gate/up weights, SiLU(gate)
* up, torch._grouped_mm with the down weights, scale by the gate weights,
index_add back per token, reduce-scatter. Same shapes, sharding and routing
rule as bench/moe/bench_moe.cpp (see its header). Prints one JSON object per
case on rank 0: {"shape", "routing", "world", "mode", "torch_ms"} (CUDA
events, warm-up, median, max over ranks).

--ep: the expert-parallel layer (bench moe --ep): experts split over the
ranks (each with its full I), tokens sharded. Per rank: sort the routed
entries by expert (so by destination), all_to_all_single of the per-expert
counts, .tolist() of the splits (the host sync a PyTorch user pays),
all_to_all_single of the rows, a stable sort of the received rows by local
expert, torch._grouped_mm gate/up, SiLU(gate) * up, torch._grouped_mm down,
the inverse permutation, all_to_all_single back, scale by the gate weights
and index_add per token.
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


def run_ep(args, world, rank, dev):
    for si in [int(s) for s in args.shapes.split(",")]:
        name, S, H, I, E, k = MOE[si]
        assert S % world == 0 and E % world == 0, f"{name} does not shard over {world} ranks"
        Tl, El = S // world, E // world
        x = torch.randn(Tl, H, device=dev, dtype=torch.bfloat16)
        w_gu = torch.randn(El, 2 * I, H, device=dev, dtype=torch.bfloat16) * 0.02
        w_dn = torch.randn(El, H, I, device=dev, dtype=torch.bfloat16) * 0.02
        local_e = torch.arange(El, device=dev).repeat(world)
        for routing in args.routing.split(","):
            ids = torch.tensor(route(Tl * rank, Tl, E, k, routing == "skewed"), device=dev, dtype=torch.int64)
            gw = torch.full((Tl, k), 1.0 / k, device=dev, dtype=torch.float32)

            def layer():
                flat = ids.flatten()
                order = torch.argsort(flat, stable=True)
                token = order // k
                xs = x.index_select(0, token)
                counts = torch.bincount(flat, minlength=E)
                if world > 1:
                    recv_counts = torch.empty_like(counts)
                    dist.all_to_all_single(recv_counts, counts)
                    in_splits = counts.view(world, El).sum(1).tolist()
                    out_splits = recv_counts.view(world, El).sum(1).tolist()
                    recv = torch.empty(sum(out_splits), H, device=dev, dtype=x.dtype)
                    dist.all_to_all_single(recv, xs, out_splits, in_splits)
                else:
                    recv_counts, recv = counts, xs
                le = torch.repeat_interleave(local_e, recv_counts)
                order2 = torch.argsort(le, stable=True)
                offs = torch.bincount(le, minlength=El).cumsum(0).to(torch.int32)
                xr = recv.index_select(0, order2)
                h = torch._grouped_mm(xr, w_gu.transpose(-2, -1), offs=offs)
                h = F.silu(h[:, 0::2]) * h[:, 1::2]
                y = torch._grouped_mm(h, w_dn.transpose(-2, -1), offs=offs)
                yb = torch.empty_like(y)
                yb[order2] = y
                if world > 1:
                    back = torch.empty(sum(in_splits), H, device=dev, dtype=y.dtype)
                    dist.all_to_all_single(back, yb, in_splits, out_splits)
                else:
                    back = yb
                back = back * gw.flatten()[order].unsqueeze(1).to(back.dtype)
                return torch.zeros(Tl, H, device=dev, dtype=back.dtype).index_add_(0, token, back)

            ms = time_ms(layer, args.warmup, args.reps, world)
            if rank == 0:
                print(json.dumps({"shape": name, "routing": routing, "world": world, "mode": "ep", "torch_ms": ms}),
                      flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1,2,3,4,5,6")
    ap.add_argument("--routing", default="uniform,skewed")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--ep", action="store_true", help="the expert-parallel layer")
    args = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if world > 1:
        dist.init_process_group("nccl")
    dev = torch.device("cuda")
    if args.ep:
        run_ep(args, world, rank, dev)
        if world > 1:
            dist.destroy_process_group()
        return
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
                print(json.dumps({"shape": name, "routing": routing, "world": world, "mode": "tp", "torch_ms": ms}),
                      flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
