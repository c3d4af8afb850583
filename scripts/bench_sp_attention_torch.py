#!/usr/bin/env python3
"""PyTorch baselines of `tessera bench sp-attention` (sequence-parallel attention, zig-zag shards).

    torchrun --nproc-per-node R scripts/bench_sp_attention_torch.py [--seqs 16384,32768] [--cases 32h-causal,gqa]
        > torch.jsonl
    tessera run -n R -- tessera bench sp-attention --torch-json torch.jsonl

Same cases as bench/sp_attention/bench_sp_attention.cpp (bf16, head dim 128, batch 1; 32 and 64 heads MHA, GQA
32/8; causal and not; --seqs global tokens). Rank r holds chunks r and 2R-1-r of 2R (zig-zag), as Tessera does.
  (a) sequential: dist.all_gather_into_tensor of the K and V shards, a reorder into global order, then
      F.scaled_dot_product_attention with the cuDNN backend (sdpa_kernel(SDPBackend.CUDNN_ATTENTION)). Causal:
      SDPA's is_causal aligns the diagonal top-left, so each local chunk g is two cuDNN calls, keys [0, gC)
      without a mask and keys [gC, (g+1)C) with the square causal mask, merged by their log-sum-exps (the cuDNN
      op's logsumexp output). Checked once against a float32 masked reference on a small problem
      (torch_seq_relerr).
  (b) context_parallel: torch.distributed.tensor.experimental.context_parallel ring attention over the global
      tensors (its own load-balanced sharding), causal only: non-causal cases record "n/a".
Every failure (an API that differs in this torch, out of memory) is caught and reported in the line's notes;
the script goes on. Output, rank 0: one JSON object per case
  {"case", "seq", "world", "torch_seq_ms", "torch_seq_relerr", "torch_cp_ms", "torch_cp_note", "torch_seq_note"}
(CUDA events, warm-up, median, max over ranks; a figure that could not be measured is null).
"""
import argparse
import json
import math
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

CASES = {"32h-causal": (32, 32, True), "32h": (32, 32, False), "64h-causal": (64, 64, True), "64h": (64, 64, False),
         "gqa-causal": (32, 8, True), "gqa": (32, 8, False)}
HEAD_DIM = 128


def log(msg):
    print(f"[bench_sp_attention_torch rank {dist.get_rank() if dist.is_initialized() else 0}] {msg}",
          file=sys.stderr, flush=True)


def first_line(e):
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0][:200] if s else ''}"


def time_ms(fn, warm, reps, world):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
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
    return max_over_ranks(times[len(times) // 2], world)


def max_over_ranks(x, world):
    t = torch.tensor([x], device="cuda", dtype=torch.float64)
    if world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def zigzag_order(world):
    """Index of global chunk g in the all-gathered [rank, slot] order: rank g's slot 0 or rank 2R-1-g's slot 1."""
    return [2 * g if g < world else 2 * (2 * world - 1 - g) + 1 for g in range(2 * world)]


# ---- (a) all-gather + cuDNN SDPA ---------------------------------------------------------------------------------
class CudnnAttention:
    """SDPA on the cuDNN backend. plain(): F.scaled_dot_product_attention (no LSE). with_lse(): the cuDNN op that
    SDPA dispatches to, asked for its log-sum-exp; GQA K/V are repeated per query head if the op refuses them."""

    def __init__(self):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        self.ctx = lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION])
        self.expand_gqa = False
        self.padded = False  # the LSE op failed: causal chunks as padded squares
        self.note = ""

    def plain(self, q, k, v, causal):  # [B, H, L, D] views
        with self.ctx():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])

    def with_lse(self, q, k, v, causal):
        if self.expand_gqa and q.shape[1] != k.shape[1]:
            g = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        try:
            r = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False)
        except Exception:
            if q.shape[1] == k.shape[1] or self.expand_gqa:
                raise
            self.expand_gqa = True
            return self.with_lse(q, k, v, causal)
        o, lse = r[0], r[1]
        return o, lse.reshape(o.shape[:-1]).float()


    def causal_chunk(self, qc, kt, vt, g, C):
        """Rows [gC, (g+1)C) of causal attention against keys [0, (g+1)C) ([B, H, ., D] views): the past keys
        without a mask and the diagonal block with one, merged; or, without the LSE op, one top-left causal square
        over (g+1)C query rows whose first gC are padding (extra work, noted)."""
        if not self.padded:
            try:
                o2, l2 = self.with_lse(qc, kt[:, :, g * C:(g + 1) * C], vt[:, :, g * C:(g + 1) * C], True)
                if g == 0:
                    return o2
                o1, l1 = self.with_lse(qc, kt[:, :, :g * C], vt[:, :, :g * C], False)
                return merge(o1, l1, o2, l2)
            except Exception as e:  # noqa: BLE001 — fall back once, noted
                self.padded = True
                self.note = f"cuDNN LSE op unavailable ({first_line(e)}): causal chunks padded to squares"
                log(self.note)
        qp = torch.cat([qc.new_zeros(qc.shape[:2] + (g * C, qc.shape[3])), qc], dim=2)
        return self.plain(qp, kt[:, :, :(g + 1) * C], vt[:, :, :(g + 1) * C], True)[:, :, g * C:]


def merge(o1, l1, o2, l2):
    """Two partial attentions over disjoint key sets, merged by their natural-log log-sum-exps."""
    lse = torch.logaddexp(l1, l2)
    w1, w2 = torch.exp(l1 - lse).unsqueeze(-1), torch.exp(l2 - lse).unsqueeze(-1)
    return (o1.float() * w1 + o2.float() * w2).to(o1.dtype)


def sequential_fn(attn, q, k, v, causal, world, rank):
    """The rank's output [B, 2C, Hq, D] for zig-zag shards q, k, v [B, 2C, H, D]."""
    B, L, hkv, D = k.shape
    C = L // 2
    S = L * world
    order = torch.tensor(zigzag_order(world), device=q.device)
    chunks = (rank, 2 * world - 1 - rank)

    def run():
        if world > 1:
            kg = torch.empty((world * B, L, hkv, D), device=k.device, dtype=k.dtype)
            vg = torch.empty_like(kg)
            dist.all_gather_into_tensor(kg, k)
            dist.all_gather_into_tensor(vg, v)
        else:
            kg, vg = k, v
        # [R, B, 2, C, H, D] -> [B, R*2, C, H, D] in global chunk order -> [B, H, S, D] views
        kf = kg.view(world, B, 2, C, hkv, D).transpose(0, 1).reshape(B, 2 * world, C, hkv, D).index_select(1, order)
        vf = vg.view(world, B, 2, C, hkv, D).transpose(0, 1).reshape(B, 2 * world, C, hkv, D).index_select(1, order)
        kt, vt = kf.reshape(B, S, hkv, D).transpose(1, 2), vf.reshape(B, S, hkv, D).transpose(1, 2)
        qt = q.transpose(1, 2)
        if not causal:
            return attn.plain(qt, kt, vt, False).transpose(1, 2)
        outs = [attn.causal_chunk(qt[:, :, i * C:(i + 1) * C], kt, vt, g, C) for i, g in enumerate(chunks)]
        return torch.cat(outs, dim=2).transpose(1, 2)

    return run


def reference(q, k, v, causal):
    """float32 attention of global q [B, S, Hq, D] against k, v [B, S, Hkv, D]."""
    g = q.shape[2] // k.shape[2]
    qf = q.float().transpose(1, 2)
    kf = k.float().repeat_interleave(g, dim=2).transpose(1, 2)
    vf = v.float().repeat_interleave(g, dim=2).transpose(1, 2)
    s = qf @ kf.transpose(-1, -2) / math.sqrt(q.shape[3])
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return (torch.softmax(s, dim=-1) @ vf).transpose(1, 2)


def shard(x, world, rank):
    c = x.shape[1] // (2 * world)
    return torch.cat([x[:, rank * c:(rank + 1) * c], x[:, (2 * world - 1 - rank) * c:(2 * world - rank) * c]], dim=1)


def check_sequential(attn, hq, hkv, causal, world, rank):
    """Relative error (max over ranks) of the sequential baseline on a small problem against float32."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    S = 512 * world
    q, k, v = (torch.randn(1, S, h, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
               for h in (hq, hkv, hkv))
    out = sequential_fn(attn, shard(q, world, rank), shard(k, world, rank), shard(v, world, rank), causal, world,
                        rank)()
    ref = shard(reference(q, k, v, causal), world, rank)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    return max_over_ranks(err, world)


# ---- (b) context_parallel ----------------------------------------------------------------------------------------
def context_parallel_ms(hq, hkv, S, causal, world, args):
    """Median ms of PyTorch's context_parallel ring attention on global [B, H, S, D] tensors, and a note."""
    if not causal:
        return None, "n/a: context_parallel is run causal only (it refuses non-causal)"
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel
    mesh = init_device_mesh("cuda", (world,))
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = (torch.randn(1, h, S, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
               for h in (hq, hkv, hkv))
    notes = []
    for name, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
                def run():
                    with sdpa_kernel([backend]):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)
                ms = time_ms(run, args.warmup, args.reps, world)
            return ms, f"SDPA {name} backend" + (f" ({'; '.join(notes)})" if notes else "")
        except Exception as e:  # noqa: BLE001 — report, try the next backend
            notes.append(f"{name}: {first_line(e)}")
            if args.verbose:
                traceback.print_exc()
            torch.cuda.synchronize()
    return None, "failed: " + "; ".join(notes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="16384,32768,65536")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-cp", action="store_true", help="skip context_parallel")
    ap.add_argument("--verbose", action="store_true", help="print tracebacks of caught failures")
    args = ap.parse_args()
    for key, val in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517"), ("RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, val)  # one process without torchrun
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    attn = CudnnAttention()
    for name in args.cases.split(","):
        if name not in CASES:
            log(f"unknown case {name!r} ({', '.join(CASES)}); skipped")
            continue
        hq, hkv, causal = CASES[name]
        relerr, seq_note = None, ""
        try:
            relerr = check_sequential(attn, hq, hkv, causal, world, rank)
        except Exception as e:  # noqa: BLE001
            seq_note = f"check failed: {first_line(e)}"
        for S in (int(s) for s in args.seqs.split(",")):
            row = {"case": name, "seq": S, "world": world, "torch_seq_ms": None, "torch_seq_relerr": relerr,
                   "torch_cp_ms": None, "torch_cp_note": "", "torch_seq_note": seq_note}
            if S % (2 * world):
                row["torch_seq_note"] = row["torch_cp_note"] = f"seq {S} is not a multiple of 2 x world"
            else:
                L = S // world
                try:
                    q = torch.randn(1, L, hq, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
                    k = torch.randn(1, L, hkv, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
                    v = torch.randn(1, L, hkv, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
                    row["torch_seq_ms"] = time_ms(sequential_fn(attn, q, k, v, causal, world, rank), args.warmup,
                                                  args.reps, world)
                    extra = [n for n in (seq_note, attn.note if causal else "",
                                         "GQA K/V repeated for the cuDNN LSE op" if attn.expand_gqa and causal
                                         and hq != hkv else "") if n]
                    row["torch_seq_note"] = "; ".join(extra)
                    del q, k, v
                except Exception as e:  # noqa: BLE001
                    row["torch_seq_note"] = f"failed: {first_line(e)}"
                    if args.verbose:
                        traceback.print_exc()
                torch.cuda.empty_cache()
                if args.no_cp:
                    row["torch_cp_note"] = "skipped (--no-cp)"
                else:
                    try:
                        row["torch_cp_ms"], row["torch_cp_note"] = context_parallel_ms(hq, hkv, S, causal, world, args)
                    except Exception as e:  # noqa: BLE001
                        row["torch_cp_note"] = f"failed: {first_line(e)}"
                        if args.verbose:
                            traceback.print_exc()
                torch.cuda.empty_cache()
            if world > 1:
                dist.barrier()
            if rank == 0:
                print(json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
