#!/usr/bin/env python3
"""PyTorch async-TP baseline for `tessera bench mlp` (same MLP-1..6 shapes).

Times torch.ops.symm_mem.fused_all_gather_matmul (AG + gate/up GEMM) and
torch.ops.symm_mem.fused_matmul_reduce_scatter (down GEMM + RS) at TP = world
size, plus the sequential all_gather_into_tensor + mm / mm + reduce_scatter
for reference. Median of --reps CUDA-event timings, max over ranks.

Run (one process per GPU):
  NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    torchrun --nproc-per-node 2 scripts/bench_async_tp.py --shapes 1,2,3 [--markdown FILE]
Exits 0 with a message when PyTorch (or symm_mem) is not importable.
"""
import argparse
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

SHAPES = {1: ("MLP-1", 8192, 4096, 11008), 2: ("MLP-2", 8192, 4096, 14336), 3: ("MLP-3", 8192, 3584, 14336),
          4: ("MLP-4", 8192, 4608, 36864), 5: ("MLP-5", 8192, 8192, 28672), 6: ("MLP-6", 8192, 8192, 29568)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1,2,3,4,5,6")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--markdown", default="")
    args = ap.parse_args()
    try:
        import torch
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem
    except Exception as e:  # noqa: BLE001 — report and skip, never fail the device call
        print(f"bench_async_tp: PyTorch async-TP not importable ({e}); skipped")
        return 0
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    group = dist.group.WORLD
    symm_mem.enable_symm_mem_for_group(group.group_name)
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float16

    def timed(fn):
        for _ in range(args.warmup):
            fn()
        ts = []
        for _ in range(args.reps):
            torch.cuda.synchronize()
            dist.barrier()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        ts.sort()
        t = torch.tensor([ts[len(ts) // 2]], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    rows = []
    for idx in [int(s) for s in args.shapes.split(",")]:
        name, s, h, i = SHAPES[idx]
        il, ml = i // world, s // world
        x = torch.randn(ml, h, device="cuda", dtype=dt) * 0.1
        wgu = torch.randn(2 * il, h, device="cuda", dtype=dt) * 0.02
        wd = torch.randn(h, il, device="cuda", dtype=dt) * 0.02
        hid = torch.randn(s, il, device="cuda", dtype=dt) * 0.1
        xfull = torch.empty(s, h, device="cuda", dtype=dt)
        out = torch.empty(ml, h, device="cuda", dtype=dt)

        def ag_seq():
            dist.all_gather_into_tensor(xfull, x)
            return xfull @ wgu.t()

        def ag_async():
            return torch.ops.symm_mem.fused_all_gather_matmul(x, [wgu.t()], gather_dim=0, group_name=group.group_name)

        def rs_seq():
            p = hid @ wd.t()
            dist.reduce_scatter_tensor(out, p)

        def rs_async():
            return torch.ops.symm_mem.fused_matmul_reduce_scatter(hid, wd.t(), "sum", scatter_dim=0,
                                                                   group_name=group.group_name)

        r = {"shape": name}
        r["ag_seq"], r["ag_async"] = timed(ag_seq), timed(ag_async)
        r["rs_seq"], r["rs_async"] = timed(rs_seq), timed(rs_async)
        rows.append(r)
    if rank == 0:
        hdr = f"| shape | AG+GEMM seq | AG+GEMM async-TP | GEMM+RS seq | GEMM+RS async-TP |"
        lines = [f"### PyTorch {torch.__version__} async-TP, TP={world} {args.dtype} on {torch.cuda.get_device_name()}",
                 "", hdr, "|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['shape']} | {r['ag_seq']:.3f} | {r['ag_async']:.3f} | {r['rs_seq']:.3f} | "
                         f"{r['rs_async']:.3f} |")
        text = "\n".join(lines)
        print(text)
        if args.markdown:
            with open(args.markdown, "a") as f:
                f.write("\n" + text + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
