#!/usr/bin/env python3
"""PyTorch async-TP baseline for `tessera bench mlp` (same MLP-1..6 shapes).

Times, at TP = world size R, the same parts as `tessera bench mlp` (and the
whole layer, SiLU(gate)*up between the halves):
  AG+GEMM        all_gather(x)[S, H] @ W[I/R, H].T  (non-gated, N = I/R: MACHINES.md's GEMM1)
  AG+GEMM gated  the same with the fused gate/up weight [2I/R, H] (N = 2I/R, GEMM only),
                 and async-TP + its SiLU(gate)*up kernel: the output Tessera's gated
                 ag_gemm delivers (SiLU·up fused into its epilogue)
  GEMM+RS        hid[S, I/R] @ Wd[H, I/R].T, reduce-scattered by rows
each as sequential (all_gather_into_tensor + mm / mm + reduce_scatter_tensor)
and PyTorch async-TP (torch.ops.symm_mem.fused_all_gather_matmul /
fused_matmul_reduce_scatter). Inputs are fresh random data rotated over
--sets buffer sets (no repetition finds them in L2), as in bench mlp, and by
default with every mantissa bit random like bench mlp's (--data).
Timed as bench mlp times: every column of a shape in one interleaved loop
(each repetition runs each column once, so clock and temperature drift hit
all alike), each run after a sync, a barrier and a one-element all-reduce
that starts the ranks together, queued by default behind a ~0.7 ms lead
GEMM (--lead: the run starts on a busy GPU with the host ahead, so neither
Python launch latency nor an idle-clock burst is in the figure); median of --reps CUDA-event timings, max
over ranks. A "GEMM" column (the non-gated AG+GEMM's matmul alone, with its
TFLOP/s) shows the clock state the others ran at, to compare with bench
mlp's "GEMM TF/s".

Run (one process per GPU):
  NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    torchrun --nproc-per-node 2 scripts/bench_async_tp.py --shapes 1,2,3 [--markdown FILE]
Exits 0 with a message when PyTorch (or symm_mem) is not importable.
"""
import argparse
import os
import sys
import time

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
    ap.add_argument("--sets", type=int, default=3)
    ap.add_argument("--markdown", default="")
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="idle the GPU this long before every timed run, as bench mlp --gap-ms")
    ap.add_argument("--lead", action=argparse.BooleanOptionalAction, default=True,
                    help="queue a ~0.7 ms lead GEMM before every timed run, as bench mlp --lead: the run starts on a "
                         "busy GPU with the host ahead, so Python launch latency is not in the figure")
    ap.add_argument("--tessera", default="auto", choices=["auto", "on", "off"],
                    help="also time Tessera's operators (tessera.ops automatic: tuned afresh) in the same loop, "
                         "through python/tessera_torch.py (libtessera_c.so); auto: when the library is found")
    ap.add_argument("--data", default="full", choices=["full", "coarse"],
                    help="full: uniform [-1, 1) drawn in float32, rounded to bf16/f16 (every mantissa bit random, "
                         "as bench mlp's fill); coarse: torch.rand in the 16-bit type, then *2-1 (multiples of "
                         "1/256: low mantissa bits zero, so the GEMM draws less power and clocks higher)")
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

    tes = None
    if args.tessera != "off":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
        try:
            import tessera_torch
            tes = tessera_torch.Session.from_torchrun()
            tes.use_cache(False)
            # Everything (PyTorch's columns, Tessera's, the events) on one stream.
            torch.cuda.set_stream(tes.stream)
        except Exception as e:  # noqa: BLE001
            if args.tessera == "on":
                raise
            print(f"bench_async_tp: Tessera columns skipped ({e})")
            tes = None
    token = torch.zeros(1, device="cuda", dtype=torch.float32)

    def everywhere(ok):
        """True only if `ok` holds on every rank (so all ranks drop the same columns and never diverge)."""
        flag = torch.tensor([0.0 if ok else 1.0], device="cuda")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() == 0.0

    if args.tessera != "off" and not everywhere(tes is not None):
        if tes is not None:
            print("bench_async_tp: Tessera columns skipped (not available on every rank)")
        tes = None  # a session that exists on some ranks only is never used (its close would need all ranks)
    lead_a = (torch.rand(8192, 4096, device="cuda") * 2 - 1).to(dt)
    lead_b = (torch.rand(8192, 4096, device="cuda") * 2 - 1).to(dt)
    lead_d = torch.empty(8192, 8192, device="cuda", dtype=dt)

    def timed_interleaved(fns):
        """Median ms of each fn, max over ranks; repetition r runs every fn once, in order."""
        def before():
            torch.cuda.synchronize()
            if args.gap_ms > 0:
                time.sleep(args.gap_ms / 1000.0)
            dist.barrier()
            if args.lead:
                torch.mm(lead_a, lead_b.t(), out=lead_d)  # the host queues the run while this runs
            dist.all_reduce(token)  # the ranks start together (ProcessGroup::align_streams)
        for _ in range(args.warmup):
            for fn in fns:
                before()
                fn()
        ts = [[] for _ in fns]
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(args.reps):
            for k, fn in enumerate(fns):
                before()
                a.record()
                fn()
                b.record()
                b.synchronize()
                ts[k].append(a.elapsed_time(b))
        med = []
        for t in ts:
            t.sort()
            med.append(t[len(t) // 2])
        m = torch.tensor(med, device="cuda")
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        return m.tolist()

    rows = []
    for idx in [int(v) for v in args.shapes.split(",")]:
        name, s, h, i = SHAPES[idx]
        il, ml = i // world, s // world
        def rnd(*shape):
            if args.data == "coarse":
                return torch.rand(*shape, device="cuda", dtype=dt) * 2 - 1
            return (torch.rand(*shape, device="cuda", dtype=torch.float32) * 2 - 1).to(dt)

        sets = []
        for _ in range(max(1, args.sets)):
            sets.append({"x": rnd(ml, h), "wgu": rnd(2 * il, h), "wd": rnd(h, il), "hid": rnd(s, il)})
        xfull = torch.empty(s, h, device="cuda", dtype=dt)
        out = torch.empty(ml, h, device="cuda", dtype=dt)
        turn = [0]

        def nxt():
            turn[0] += 1
            return sets[turn[0] % len(sets)]

        def ag_seq(gated):
            def fn():
                d = nxt()
                w = d["wgu"] if gated else d["wgu"][:il]
                dist.all_gather_into_tensor(xfull, d["x"])
                return xfull @ w.t()
            return fn

        def ag_async(gated):
            def fn():
                d = nxt()
                w = d["wgu"] if gated else d["wgu"][:il]
                return torch.ops.symm_mem.fused_all_gather_matmul(d["x"], [w.t()], gather_dim=0,
                                                                  group_name=group.group_name)
            return fn

        def rs_seq():
            d = nxt()
            p = d["hid"] @ d["wd"].t()
            dist.reduce_scatter_tensor(out, p)

        def rs_async():
            d = nxt()
            return torch.ops.symm_mem.fused_matmul_reduce_scatter(d["hid"], d["wd"].t(), "sum", scatter_dim=0,
                                                                   group_name=group.group_name)

        def gemm_alone():
            d = nxt()
            return xfull @ d["wgu"][:il].t()

        agout = torch.empty(s, il, device="cuda", dtype=dt)

        # The whole layer: gated AG+GEMM, SiLU(gate)*up (gate/up rows interleaved,
        # as ops::MlpArgs), GEMM+RS. PyTorch runs the activation as its own
        # kernel; Tessera fuses it into the AG+GEMM epilogue.
        def act(hcat):
            return torch.nn.functional.silu(hcat[:, 0::2]) * hcat[:, 1::2]

        def layer_seq():
            d = nxt()
            dist.all_gather_into_tensor(xfull, d["x"])
            dist.reduce_scatter_tensor(out, act(xfull @ d["wgu"].t()) @ d["wd"].t())

        def layer_async():
            d = nxt()
            _, mm = torch.ops.symm_mem.fused_all_gather_matmul(d["x"], [d["wgu"].t()], gather_dim=0,
                                                                group_name=group.group_name)
            return torch.ops.symm_mem.fused_matmul_reduce_scatter(act(mm[0]), d["wd"].t(), "sum", scatter_dim=0,
                                                                   group_name=group.group_name)

        # The gated part as Tessera's gated ag_gemm delivers it: SiLU(gate)*up
        # [S, I/R]. async-TP's matmul writes [S, 2I/R] and needs the activation
        # kernel after it; this column times both.
        def agg_async_act():
            d = nxt()
            _, mm = torch.ops.symm_mem.fused_all_gather_matmul(d["x"], [d["wgu"].t()], gather_dim=0,
                                                                group_name=group.group_name)
            return act(mm[0])

        def tes_layer():
            d = nxt()
            tes.mlp(d["x"], d["wgu"], d["wd"], out)

        def tes_ag(gated):
            def fn():
                d = nxt()
                tes.ag_gemm(d["x"], d["wgu"] if gated else d["wgu"][:il], agout, swiglu=gated)
            return fn

        def tes_rs():
            d = nxt()
            tes.gemm_rs(d["hid"], d["wd"], out)

        r = {"shape": name}
        cols = ["gemm", "ag_seq", "ag_async", "agg_seq", "agg_async", "agg_async_act", "rs_seq", "rs_async", "mlp_seq",
                "mlp_async"]
        fns = [gemm_alone, ag_seq(False), ag_async(False), ag_seq(True), ag_async(True), agg_async_act, rs_seq, rs_async,
               layer_seq, layer_async]
        if tes:
            cols += ["tes_ag", "tes_agg", "tes_rs", "tes_mlp"]
            fns += [tes_ag(False), tes_ag(True), tes_rs, tes_layer]
        # The layer columns are new (2026-11-22) and unrun: one that fails on its
        # first call is dropped with a message rather than losing the table.
        # Every rank decides together (everywhere()), so the ranks keep the same
        # columns and their collectives stay matched.
        for c in ("agg_async_act", "mlp_seq", "mlp_async", "tes_mlp"):
            if c in cols:
                k = cols.index(c)
                err = None
                try:
                    fns[k]()
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    err = e
                if not everywhere(err is None):
                    print(f"bench_async_tp: column {c} dropped ({err or 'failed on another rank'})")
                    del cols[k], fns[k]
        vals = timed_interleaved(fns)
        r.update(dict(zip(cols, vals)))
        for c in ("agg_async_act", "mlp_seq", "mlp_async", "tes_mlp"):
            r.setdefault(c, float("nan"))
        if tes:  # the tuned choices (cached in the session by the timed calls)
            d = sets[0]
            r["ch_ag"] = tes.resolve_ag_gemm(d["x"], d["wgu"][:il], agout)
            r["ch_agg"] = tes.resolve_ag_gemm(d["x"], d["wgu"], agout, swiglu=True)
            r["ch_rs"] = tes.resolve_gemm_rs(d["hid"], d["wd"], out)
        r["gemm_tflops"] = 2.0 * s * il * h / (r["gemm"] * 1e-3) * 1e-12
        rows.append(r)
        del sets
    if rank == 0:
        hdr = ("| shape | GEMM | GEMM TF/s | AG+GEMM seq | AG+GEMM async-TP | AG+GEMM gated seq | AG+GEMM gated async-TP "
               "| AG+GEMM gated async-TP + SiLU·up | GEMM+RS seq | GEMM+RS async-TP | MLP layer seq | MLP layer async-TP |")
        lines = [f"### PyTorch {torch.__version__} async-TP, TP={world} {args.dtype} on {torch.cuda.get_device_name()} "
                 f"(ms, median of {args.reps}, max over ranks, inputs rotated over {args.sets} sets, "
                 f"columns interleaved, {args.data} data, "
                 f"{'lead GEMM' if args.lead else 'no lead GEMM'} before each run, {args.gap_ms} ms idle before)",
                 "", hdr, "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['shape']} | {r['gemm']:.3f} | {r['gemm_tflops']:.0f} | {r['ag_seq']:.3f} | "
                         f"{r['ag_async']:.3f} | {r['agg_seq']:.3f} | "
                         f"{r['agg_async']:.3f} | {r['agg_async_act']:.3f} | {r['rs_seq']:.3f} | {r['rs_async']:.3f} | {r['mlp_seq']:.3f} | "
                         f"{r['mlp_async']:.3f} |")
        if tes:
            lines += ["", "Tessera (tuned, same loop) and its speedup over PyTorch async-TP / sequential:", "",
                      "| shape | AG+GEMM | choice | vs async-TP | vs seq | AG+GEMM gated | choice | vs async-TP | vs seq "
                      "| GEMM+RS | choice | vs async-TP | vs seq |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for r in rows:
                cells = []
                for t, ch, a, q in (("tes_ag", "ch_ag", "ag_async", "ag_seq"), ("tes_agg", "ch_agg", "agg_async", "agg_seq"),
                                    ("tes_rs", "ch_rs", "rs_async", "rs_seq")):
                    cells.append(f"{r[t]:.3f} | {r[ch]} | {r[a] / r[t]:.2f}x | {r[q] / r[t]:.2f}x")
                lines.append(f"| {r['shape']} | " + " | ".join(cells) + " |")
            lines += ["", "Gated AG+GEMM against what async-TP needs to deliver the same SiLU(gate)·up output "
                      "(its matmul, then the activation kernel):", "",
                      "| shape | Tessera gated | async-TP + SiLU·up | vs async-TP + SiLU·up |", "|---|---|---|---|"]
            for r in rows:
                lines.append(f"| {r['shape']} | {r['tes_agg']:.3f} | {r['agg_async_act']:.3f} | "
                             f"{r['agg_async_act'] / r['tes_agg']:.2f}x |")
            lines += ["", "Whole MLP layer (Tessera's mlp, tuned halves):", "",
                      "| shape | Tessera | vs async-TP | vs seq |", "|---|---|---|---|"]
            for r in rows:
                lines.append(f"| {r['shape']} | {r['tes_mlp']:.3f} | {r['mlp_async'] / r['tes_mlp']:.2f}x | "
                             f"{r['mlp_seq'] / r['tes_mlp']:.2f}x |")
        text = "\n".join(lines)
        print(text)
        if args.markdown:
            with open(args.markdown, "a") as f:
                f.write("\n" + text + "\n")
    if tes:
        torch.cuda.synchronize()
        tes.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
