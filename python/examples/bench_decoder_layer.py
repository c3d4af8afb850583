"""Training step (forward + backward) of a Llama-style decoder layer with TP + sequence parallelism:
tessera.torch.TensorParallelDecoderLayer (automatic strategies, and every strategy forced to sequential) against
the same layer in plain PyTorch (nn.Linear weights, torch.distributed all-gather / reduce-scatter + matmul).
Checks first that loss and gradients agree, then times each variant in the same process (CUDA events, warm-up,
median). PyTorch async-TP (torch.compile micro-pipeline TP) is not among the baselines yet.

    torchrun --nproc-per-node <GPUs> python/examples/bench_decoder_layer.py [--shapes 8b,70b] [--tokens 8192]
        [--iters 10] [--json out.json]
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import tessera.torch as tt
from tessera.torch.layers import attention, rms_norm, rope

SHAPES = {"8b": dict(h=4096, inter=14336, heads=32, kv=8), "70b": dict(h=8192, inter=28672, heads=64, kv=8)}


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.new_empty((x.shape[0] * dist.get_world_size(group), *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        out = g.new_empty((g.shape[0] // dist.get_world_size(ctx.group), *g.shape[1:]))
        dist.reduce_scatter_tensor(out, g.contiguous(), group=ctx.group)
        return out, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.new_empty((x.shape[0] // dist.get_world_size(group), *x.shape[1:]))
        dist.reduce_scatter_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        out = g.new_empty((g.shape[0] * dist.get_world_size(ctx.group), *g.shape[1:]))
        dist.all_gather_into_tensor(out, g.contiguous(), group=ctx.group)
        return out, None


class PlainTpLayer(torch.nn.Module):
    """The same layer, TP + sequence parallel, in plain PyTorch: NCCL collectives then matmul."""

    def __init__(self, tes, group):
        super().__init__()
        self.group = group
        self.d, self.hq, self.hkv, self.eps = tes.head_dim, tes.heads_local, tes.kv_local, tes.eps
        p = lambda w: torch.nn.Parameter(w.detach().clone())  # noqa: E731
        self.wqkv, self.wo = p(tes.qkv.weight), p(tes.o.weight)
        g, u = tes.mlp.w_gate_up[0::2], tes.mlp.w_gate_up[1::2]
        self.wg, self.wu, self.wd = p(g), p(u), p(tes.mlp.w_down)
        self.ln1, self.ln2 = p(tes.ln1), p(tes.ln2)

    def forward(self, x):
        m = x.shape[0] * dist.get_world_size(self.group)
        d, hq, hkv = self.d, self.hq, self.hkv
        qkv = _AllGather.apply(rms_norm(x, self.ln1, self.eps), self.group) @ self.wqkv.t()
        q = qkv[:, : hq * d].reshape(m, hq, d).transpose(0, 1)
        k = qkv[:, hq * d:(hq + hkv) * d].reshape(m, hkv, d).transpose(0, 1)
        v = qkv[:, (hq + hkv) * d:].reshape(m, hkv, d).transpose(0, 1)
        a = attention(rope(q), rope(k), v).transpose(0, 1).reshape(m, hq * d)
        x = x + _ReduceScatter.apply(a @ self.wo.t(), self.group)
        hn = _AllGather.apply(rms_norm(x, self.ln2, self.eps), self.group)
        return x + _ReduceScatter.apply((F.silu(hn @ self.wg.t()) * (hn @ self.wu.t())) @ self.wd.t(), self.group)


def step(model, x):
    for p in model.parameters():
        p.grad = None
    xs = x.detach().requires_grad_(True)
    loss = model(xs).float().square().mean()
    loss.backward()
    return loss, xs.grad


def time_steps(model, x, warmup, iters):
    for _ in range(warmup):
        step(model, x)
    times = []
    for _ in range(iters):
        dist.barrier()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step(model, x)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    t = torch.tensor([statistics.median(times)], device=x.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def profile_step(model, x, path, rank, steps=2):
    """The CUDA kernels of `steps` training steps, by total GPU time (rank 0 writes the table)."""
    from torch.profiler import ProfilerActivity, profile
    step(model, x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(model, x)
        torch.cuda.synchronize()
    if rank == 0:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            try:
                table = prof.key_averages().table(sort_by="device_time_total", row_limit=40, max_name_column_width=90)
            except (KeyError, AttributeError, ValueError):
                table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=90)
            f.write(table)


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8b,70b")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", default=None, help="directory: a torch.profiler kernel table per variant (rank 0)")
    a = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda", torch.cuda.current_device())
    results = []
    with tt.Context() as ctx:
        for name in a.shapes.split(","):
            s = SHAPES[name]
            torch.manual_seed(1)
            tes = tt.TensorParallelDecoderLayer(s["h"], s["inter"], s["heads"], s["kv"], ctx)
            seq = tt.TensorParallelDecoderLayer(s["h"], s["inter"], s["heads"], s["kv"], ctx, strategy="sequential")
            with torch.no_grad():
                for p in tes.parameters():
                    p.mul_(0.05)  # keep activations in range through the layer
                seq.load_state_dict(tes.state_dict())
                plain = PlainTpLayer(tes, dist.group.WORLD)
            x = torch.randn(a.tokens // world, s["h"], device=dev, dtype=torch.bfloat16)
            chosen = ctx.pretune(tt.tuning_shapes(tes, a.tokens))  # tuning before, not inside, the step
            lt, gt = step(tes, x)
            lp, gp = step(plain, x)
            check = {"loss": abs(lt.item() - lp.item()) / abs(lp.item()), "dx": rel_err(gt, gp),
                     "qkv": rel_err(tes.qkv.weight.grad, plain.wqkv.grad), "o": rel_err(tes.o.weight.grad, plain.wo.grad),
                     "down": rel_err(tes.mlp.w_down.grad, plain.wd.grad)}
            row = {"shape": name, **s, "tokens": a.tokens, "check": check,
                   "strategies": {" ".join(map(str, k)): v for k, v in chosen.items()}}
            for label, model in (("plain_pytorch", plain), ("tessera", tes), ("tessera_sequential", seq)):
                row[label + "_ms"] = time_steps(model, x, a.warmup, a.iters)
            row["speedup_vs_plain"] = row["plain_pytorch_ms"] / row["tessera_ms"]
            if a.profile:
                for label, model in (("plain_pytorch", plain), ("tessera", tes)):
                    profile_step(model, x, os.path.join(a.profile, f"profile-{name}-{label}.txt"), rank)
            results.append(row)
            if rank == 0:
                print(json.dumps(row))
            del tes, seq, plain
            torch.cuda.empty_cache()
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "world": world, "torch": torch.__version__,
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": results}, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
