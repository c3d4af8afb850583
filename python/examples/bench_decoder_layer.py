"""Training step (forward + backward) of a Llama-style decoder layer with TP + sequence parallelism:
tessera.torch.TensorParallelDecoderLayer (automatic strategies; after Context.calibrate, the step-level choice; and
every strategy forced to sequential) against
the same layer in plain PyTorch (nn.Linear weights, torch.distributed all-gather / reduce-scatter + matmul) and in
PyTorch async-TP (the symmetric-memory ops torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter
that Inductor's micro-pipeline TP emits, wired by hand into forward and backward). Checks first that loss and
gradients agree, then times each variant's step and its forward alone in the same process, the variants taking
turns call by call (CUDA events, warm-up, median).

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


class _AsyncAgMm(torch.autograd.Function):
    """[AG(x) @ w.T for w in ws] through fused_all_gather_matmul; backward: dx by fused_matmul_reduce_scatter."""

    @staticmethod
    def forward(ctx, x, group_name, *ws):
        ag, outs = torch.ops.symm_mem.fused_all_gather_matmul(x.contiguous(), [w.t() for w in ws], gather_dim=0,
                                                              group_name=group_name)
        ctx.save_for_backward(ag, *ws)
        ctx.group_name = group_name
        return tuple(outs)

    @staticmethod
    def backward(ctx, *dys):
        ag, *ws = ctx.saved_tensors
        dy = torch.cat([d.contiguous() for d in dys], dim=1)
        w = torch.cat(ws, dim=0)
        dx = torch.ops.symm_mem.fused_matmul_reduce_scatter(dy, w, "sum", scatter_dim=0, group_name=ctx.group_name)
        return (dx, None, *[d.t().mm(ag) for d in dys])


class _AsyncMmRs(torch.autograd.Function):
    """RS(h @ w.T) through fused_matmul_reduce_scatter; backward: AG(dy) @ w through fused_all_gather_matmul."""

    @staticmethod
    def forward(ctx, h, w, group_name):
        ctx.save_for_backward(h, w)
        ctx.group_name = group_name
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(h.contiguous(), w.t(), "sum", scatter_dim=0,
                                                              group_name=group_name)

    @staticmethod
    def backward(ctx, dy):
        h, w = ctx.saved_tensors
        dyg, (dh,) = torch.ops.symm_mem.fused_all_gather_matmul(dy.contiguous(), [w], gather_dim=0,
                                                                group_name=ctx.group_name)
        return dh, dyg.t().mm(h), None


class AsyncTpLayer(PlainTpLayer):
    """The plain layer with PyTorch async-TP's fused AG+matmul / matmul+RS in place of collective + matmul."""

    def forward(self, x):
        g = self.group.group_name
        m = x.shape[0] * dist.get_world_size(self.group)
        d, hq, hkv = self.d, self.hq, self.hkv
        (qkv,) = _AsyncAgMm.apply(rms_norm(x, self.ln1, self.eps), g, self.wqkv)
        q = qkv[:, : hq * d].reshape(m, hq, d).transpose(0, 1)
        k = qkv[:, hq * d:(hq + hkv) * d].reshape(m, hkv, d).transpose(0, 1)
        v = qkv[:, (hq + hkv) * d:].reshape(m, hkv, d).transpose(0, 1)
        a = attention(rope(q), rope(k), v).transpose(0, 1).reshape(m, hq * d)
        x = x + _AsyncMmRs.apply(a, self.wo, g)
        gate, up = _AsyncAgMm.apply(rms_norm(x, self.ln2, self.eps), g, self.wg, self.wu)
        return x + _AsyncMmRs.apply(F.silu(gate) * up, self.wd, g)


def step(model, x):
    for p in model.parameters():
        p.grad = None
    xs = x.detach().requires_grad_(True)
    loss = model(xs).float().square().mean()
    loss.backward()
    return loss, xs.grad


def time_interleaved(bodies, device, warmup, iters):
    """{name: median ms} of `iters` timed calls of each body, the bodies taking turns call by call (so clock and
    power state drift reaches every variant alike), after `warmup` untimed calls of each; CUDA events, every call
    started on an idle GPU with the ranks together (a barrier), max over ranks."""
    for body in bodies.values():
        for _ in range(warmup):
            body()
    times = {name: [] for name in bodies}
    for _ in range(iters):
        for name, body in bodies.items():
            dist.barrier()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            body()
            b.record()
            b.synchronize()
            times[name].append(a.elapsed_time(b))
    t = torch.tensor([statistics.median(times[name]) for name in bodies], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(bodies, t.tolist()))


def time_steps(models, x, warmup, iters):
    """{name: median training-step ms} of the models, interleaved (time_interleaved)."""
    return time_interleaved({n: (lambda m=m: step(m, x)) for n, m in models.items()}, x.device, warmup, iters)


def time_forwards(models, x, warmup, iters):
    """{name: median forward ms}: the forward alone, as a training step runs it (autograd recording, graph then
    dropped), interleaved."""
    xs = x.detach().requires_grad_(True)
    return time_interleaved({n: (lambda m=m: m(xs)) for n, m in models.items()}, x.device, warmup, iters)


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
                async_tp, async_error = None, None
                try:
                    import torch.distributed._symmetric_memory as symm_mem
                    symm_mem.enable_symm_mem_for_group(dist.group.WORLD.group_name)
                    async_tp = AsyncTpLayer(tes, dist.group.WORLD)
                except Exception as e:  # noqa: BLE001 — reported in the row, never fails the run
                    async_error = f"{type(e).__name__}: {e}"
            x = torch.randn(a.tokens // world, s["h"], device=dev, dtype=torch.bfloat16)
            chosen = ctx.pretune(tt.tuning_shapes(tes, a.tokens))  # tuning before, not inside, the step
            lt, gt = step(tes, x)
            lp, gp = step(plain, x)
            check = {"loss": abs(lt.item() - lp.item()) / abs(lp.item()), "dx": rel_err(gt, gp),
                     "qkv": rel_err(tes.qkv.weight.grad, plain.wqkv.grad), "o": rel_err(tes.o.weight.grad, plain.wo.grad),
                     "down": rel_err(tes.mlp.w_down.grad, plain.wd.grad)}
            row = {"shape": name, **s, "tokens": a.tokens, "check": check,
                   "strategies": {" ".join(map(str, k)): v for k, v in chosen.items()}}
            if async_tp is not None:
                try:
                    la, ga = step(async_tp, x)
                    check["async_tp_dx"] = rel_err(ga, gp)
                except Exception as e:  # noqa: BLE001
                    async_tp, async_error = None, f"{type(e).__name__}: {e}"
            models = {"plain_pytorch": plain, "tessera": tes, "tessera_sequential": seq, "async_tp": async_tp}
            models = {label: model for label, model in models.items() if model is not None}
            steps_ms = time_steps(models, x, a.warmup, a.iters)
            fwd_ms = time_forwards(models, x, a.warmup, a.iters)
            for label in ("plain_pytorch", "tessera", "tessera_sequential", "async_tp"):
                row[label + "_ms"] = steps_ms.get(label)
                row[label + "_fwd_ms"] = fwd_ms.get(label)
            # The step-level choice: automatic calls that lose inside the step run sequential (Context.calibrate).
            cal = ctx.calibrate(lambda: step(tes, x), warmup=a.warmup, reps=max(3, a.iters // 2))
            row["calibrated_overrides"] = [" ".join(map(str, k)) for k in cal["overrides"]]
            row["calibration_ms"] = {k if isinstance(k, str) else " ".join(map(str, k)): v
                                     for k, v in cal["times_ms"].items()}
            # Timed beside plain PyTorch again: its ratio to plain is taken within this one interleaved run.
            cal_ms = time_steps({"calibrated": tes, "plain_pytorch": plain}, x, a.warmup, a.iters)
            row["tessera_calibrated_ms"] = cal_ms["calibrated"]
            row["plain_pytorch_beside_calibrated_ms"] = cal_ms["plain_pytorch"]
            ctx.set_overrides({})
            row["speedup_vs_plain"] = row["plain_pytorch_ms"] / row["tessera_ms"]
            row["fwd_speedup_vs_plain"] = row["plain_pytorch_fwd_ms"] / row["tessera_fwd_ms"]
            row["speedup_calibrated_vs_plain"] = (row["plain_pytorch_beside_calibrated_ms"] /
                                                  row["tessera_calibrated_ms"])
            if row["async_tp_ms"]:
                row["speedup_vs_async_tp"] = row["async_tp_ms"] / row["tessera_ms"]
                row["speedup_calibrated_vs_async_tp"] = row["async_tp_ms"] / row["tessera_calibrated_ms"]
            else:
                row["async_tp_error"] = async_error
            if a.profile:
                for label, model in (("plain_pytorch", plain), ("tessera", tes), ("tessera_sequential", seq)):
                    profile_step(model, x, os.path.join(a.profile, f"profile-{name}-{label}.txt"), rank)
            results.append(row)
            if rank == 0:
                print(json.dumps(row))
            del tes, seq, plain, async_tp
            torch.cuda.empty_cache()
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "world": world, "torch": torch.__version__,
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": results}, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
