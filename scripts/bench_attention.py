#!/usr/bin/env python3
"""Tessera's flash-attention forward kernel against PyTorch SDPA (cuDNN and
flash backends), side by side in one process, plus a correctness sweep.

Tessera's kernel is reached through a small shared library (C entry point in
scripts/attention_ctypes.cpp, called with ctypes on torch tensors'
data_ptr()), which --build compiles with nvcc from the library's sources in
about a minute, without building the rest of Tessera.

  python3 scripts/bench_attention.py --build --check          # correctness sweep
  python3 scripts/bench_attention.py --build --bench --json out.json

--check: random inputs (fresh per case), outputs poisoned (NaN) beforehand,
against a float32 reference (torch, on the GPU): causal and not, explicit
q_offset, Lq != Lk, GQA / MQA, ragged lengths, head dims 64 and 128, bf16 and
fp16, BSHD and BHSD strides; O by relative Frobenius error (and max abs), LSE
(natural log, [B, Hq, Lq] float32) by max abs error.

--bench: bf16, head dim 128, batch 1 (the target cases plus 64 heads and
32k..128k where memory allows); --head-dim 64 / --dtype f16 for the others. Every column of a case is timed in one
interleaved loop (each repetition runs each column once, so clock and
temperature drifts hit all alike), CUDA events around each run, warm-up
first, median of --reps. TFLOP/s as FlashAttention counts: 4·B·H·D·pairs
(causal: the admitted pairs, about half). SDPA takes [B, H, S, D]: the BSHD
tensors are passed as transposed views (no copy), the layout SDPA users keep.
"""
import argparse
import ctypes
import json
import math
import os
import subprocess
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ["scripts/attention_ctypes.cpp", "src/kernels/attention_host.cpp", "src/kernels/gemm_host.cpp",
           "src/runtime/env.cpp", "src/kernels/attention_bf16.cu", "src/kernels/attention_f16.cu", "scripts/attention_variants.cu"]


def build(lib):
    """Compiles the sources in parallel, then links the shared library."""
    os.makedirs(os.path.dirname(os.path.abspath(lib)), exist_ok=True)
    flags = ["-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr",
             "-Xcompiler", "-fPIC", "-Iinclude", "-Isrc/kernels", "-I.deps/include", "-DFMT_HEADER_ONLY"]
    objs, procs = [], []
    for src in SOURCES:
        obj = os.path.abspath(lib) + "." + os.path.basename(src) + ".o"
        objs.append(obj)
        procs.append((src, subprocess.Popen(["nvcc", *flags, "-Xptxas", "-v", "-c", src, "-o", obj], cwd=ROOT,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    ok = True
    for src, p in procs:
        out, _ = p.communicate()
        spills = [l for l in out.splitlines() if "spill" in l or "Used" in l or "error" in l]
        print(f"[build] {src}: rc {p.returncode}" + "".join("\n    " + l.strip() for l in spills))
        if p.returncode != 0:
            print(out)
            ok = False
    if not ok:
        sys.exit("build failed")
    subprocess.check_call(["nvcc", "-shared", "-o", lib, *objs], cwd=ROOT)


class Tessera:
    def __init__(self, lib):
        self.lib = ctypes.CDLL(lib)
        f = self.lib.tessera_attention_fwd
        i64, p = ctypes.c_int64, ctypes.c_void_p
        f.argtypes = [p, p, p, p, p, i64, i64, i64, i64, i64, i64, ctypes.c_int, ctypes.c_int, ctypes.c_int, i64,
                      ctypes.c_float, p, p, p, p, p, ctypes.c_int]
        f.restype = ctypes.c_int
        self.lib.tessera_attention_last_error.restype = ctypes.c_char_p

    def __call__(self, q, k, v, o, lse, causal=False, q_offset=None, scale=0.0, variant=0):
        """q, k, v, o: [B, S, H, D] views (any strides, D contiguous); lse: [B, Hq, Lq] float32 or None."""
        import torch
        B, Lq, Hq, D = q.shape
        Lk, Hkv = k.shape[1], k.shape[2]
        st = lambda t: (ctypes.c_int64 * 3)(t.stride(0), t.stride(1), t.stride(2))
        qs, ks, vs, os_ = st(q), st(k), st(v), st(o)
        dt = 0 if q.dtype == torch.bfloat16 else 1
        rc = self.lib.tessera_attention_fwd(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr() if lse is not None else None,
            B, Lq, Lk, Hq, Hkv, D, dt, int(causal), int(q_offset is not None), int(q_offset or 0), float(scale),
            ctypes.cast(qs, ctypes.c_void_p), ctypes.cast(ks, ctypes.c_void_p), ctypes.cast(vs, ctypes.c_void_p),
            ctypes.cast(os_, ctypes.c_void_p), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), variant)
        if rc != 0:
            raise RuntimeError(self.lib.tessera_attention_last_error().decode())


def reference(q, k, v, causal, q_offset, scale):
    """float32 O [B, Lq, Hq, D] and LSE [B, Hq, Lq] (natural log; -inf for rows with no key)."""
    import torch
    B, Lq, Hq, D = q.shape
    Lk, Hkv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    qf = q.float().permute(0, 2, 1, 3)                                   # B Hq Lq D
    kf = k.float().permute(0, 2, 1, 3).repeat_interleave(g, dim=1)      # B Hq Lk D
    vf = v.float().permute(0, 2, 1, 3).repeat_interleave(g, dim=1)
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if causal:
        off = (Lk - Lq) if q_offset is None else q_offset
        i = torch.arange(Lq, device=q.device)[:, None]
        j = torch.arange(Lk, device=q.device)[None, :]
        s = s.masked_fill(j > i + off, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                    # B Hq Lq
    p = torch.exp(s - lse[..., None].masked_fill(torch.isinf(lse[..., None]), 0))
    p = torch.nan_to_num(p, nan=0.0)
    o = torch.matmul(p, vf).permute(0, 2, 1, 3)
    return o, lse


def check(tess, args):
    import torch
    torch.manual_seed(1234)
    cases = []
    for dt in (torch.bfloat16, torch.float16):
        for d in (64, 128):
            cases += [
                dict(B=2, Lq=256, Lk=256, Hq=4, Hkv=4, D=d, causal=False, dt=dt),
                dict(B=2, Lq=256, Lk=256, Hq=4, Hkv=4, D=d, causal=True, dt=dt),
                dict(B=1, Lq=333, Lk=1000, Hq=6, Hkv=2, D=d, causal=False, dt=dt),   # ragged, GQA, Lq != Lk
                dict(B=1, Lq=333, Lk=1000, Hq=6, Hkv=2, D=d, causal=True, dt=dt),    # end-aligned causal
                dict(B=3, Lq=77, Lk=77, Hq=4, Hkv=1, D=d, causal=True, dt=dt),       # MQA, one partial tile
            ]
    cases += [
        dict(B=1, Lq=300, Lk=900, Hq=4, Hkv=2, D=128, causal=True, dt=torch.bfloat16, q_offset=250),  # shard mid-sequence
        dict(B=1, Lq=200, Lk=500, Hq=2, Hkv=2, D=128, causal=True, dt=torch.bfloat16, q_offset=-50),  # rows with no key
        dict(B=2, Lq=1030, Lk=2049, Hq=8, Hkv=2, D=128, causal=False, dt=torch.bfloat16, layout="bhsd"),
        dict(B=2, Lq=1030, Lk=1030, Hq=8, Hkv=8, D=64, causal=True, dt=torch.float16, layout="bhsd"),
        dict(B=1, Lq=4096, Lk=4096, Hq=4, Hkv=4, D=128, causal=True, dt=torch.bfloat16, scale=0.05),
        dict(B=1, Lq=1, Lk=513, Hq=4, Hkv=2, D=128, causal=True, dt=torch.bfloat16),  # decode-like row
    ]
    variants = [0] + [v for v in args.variants if v != 0]
    worst = 0.0
    failed = 0
    for c in cases:
        if args.quick and c["Lq"] > 1500:
            continue
        B, Lq, Lk, Hq, Hkv, D, dt = c["B"], c["Lq"], c["Lk"], c["Hq"], c["Hkv"], c["D"], c["dt"]
        layout = c.get("layout", "bshd")

        def mk(L, H):
            if layout == "bshd":
                return torch.randn(B, L, H, D, device="cuda", dtype=dt)
            return torch.randn(B, H, L, D, device="cuda", dtype=dt).transpose(1, 2)  # BHSD storage, BSHD view

        q, k, v = mk(Lq, Hq), mk(Lk, Hkv), mk(Lk, Hkv)
        scale = c.get("scale", 1.0 / math.sqrt(D))
        o_ref, lse_ref = reference(q, k, v, c["causal"], c.get("q_offset"), scale)
        for var in (variants if dt == torch.bfloat16 else [0]):
            o = mk(Lq, Hq).fill_(float("nan"))
            lse = torch.full((B, Hq, Lq), float("nan"), device="cuda", dtype=torch.float32)
            tess(q, k, v, o, lse, causal=c["causal"], q_offset=c.get("q_offset"),
                 scale=c.get("scale", 0.0), variant=var)
            torch.cuda.synchronize()
            of = o.float()
            finite = torch.isfinite(of).all().item() and not torch.isnan(lse).any().item()
            rel = ((of - o_ref).norm() / o_ref.norm().clamp_min(1e-30)).item()
            mx = (of - o_ref).abs().max().item()
            both_inf = torch.isinf(lse) & torch.isinf(lse_ref) & (lse.sign() == lse_ref.sign())
            dl = torch.where(both_inf, torch.zeros_like(lse), (lse - lse_ref).abs())
            lse_err = dl.max().item()
            tol = 2e-2 if dt == torch.bfloat16 else 4e-3
            ok = finite and rel < tol and lse_err < 1e-3 * max(1.0, lse_ref[torch.isfinite(lse_ref)].abs().max().item())
            worst = max(worst, rel)
            failed += not ok
            desc = {k_: (str(v_).replace("torch.", "") if k_ == "dt" else v_) for k_, v_ in c.items()}
            print(f"[check] {'ok  ' if ok else 'FAIL'} variant {var} {desc}: O rel {rel:.2e} max abs {mx:.2e}, "
                  f"LSE max abs {lse_err:.2e}{'' if finite else ' NON-FINITE'}")
    print(f"[check] {len(cases)} cases, {failed} failed, worst O rel err {worst:.2e}")
    return failed == 0


BENCH = [  # name, B, Lq, Lk, Hq, Hkv, causal
    ("32h Q8k KV16k", 1, 8192, 16384, 32, 32, False),
    ("32h 16k causal", 1, 16384, 16384, 32, 32, True),
    ("32h Q16k KV32k", 1, 16384, 32768, 32, 32, False),
    ("GQA 32/8 Q8k KV16k", 1, 8192, 16384, 32, 8, False),
    ("64h 16k", 1, 16384, 16384, 64, 64, False),
    ("64h 16k causal", 1, 16384, 16384, 64, 64, True),
    ("32h 32k causal", 1, 32768, 32768, 32, 32, True),
    ("32h 64k causal", 1, 65536, 65536, 32, 32, True),
    ("32h Q8k KV128k", 1, 8192, 131072, 32, 32, False),
    ("32h 128k causal", 1, 131072, 131072, 32, 32, True),
]


def bench(tess, args):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    results = []
    names = [b[0] for b in BENCH]
    sel = [BENCH[i] for i in range(len(BENCH)) if not args.cases or str(i) in args.cases.split(",")]
    for name, B, Lq, Lk, Hq, Hkv, causal in sel:
        D = args.head_dim
        dt = torch.bfloat16 if args.dtype == "bf16" else torch.float16
        q = torch.randn(B, Lq, Hq, D, device="cuda", dtype=dt)
        k = torch.randn(B, Lk, Hkv, D, device="cuda", dtype=dt)
        v = torch.randn(B, Lk, Hkv, D, device="cuda", dtype=dt)
        o = torch.empty_like(q)
        lse = torch.empty(B, Hq, Lq, device="cuda", dtype=torch.float32)
        if causal:
            pairs = sum(min(Lk, max(0, i + (Lk - Lq) + 1)) for i in range(0, Lq)) if Lq <= 200000 else Lq * Lk / 2
        else:
            pairs = Lq * Lk
        flops = 4.0 * B * Hq * D * pairs
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cols = {}
        for var in ([0] + [x for x in args.variants if x != 0]):
            cols["tessera" if var == 0 else f"tessera v{var}"] = (
                lambda var=var: tess(q, k, v, o, lse, causal=causal, variant=var))

        def sdpa(backend):
            def run():
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=(Hq != Hkv))
            return run

        for label, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            fn = sdpa(backend)
            try:
                ref = fn()
                torch.cuda.synchronize()
                cols[label] = fn
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"[bench] {name}: SDPA {label} unavailable: {str(e).splitlines()[0][:160]}")
        # Correctness of ours against cuDNN/flash on this case (bf16 both sides).
        tess(q, k, v, o, lse, causal=causal)
        torch.cuda.synchronize()
        ref_o = None
        for label in ("cudnn", "flash"):
            if label in cols:
                ref_o = cols[label]().transpose(1, 2)
                break
        rel = float("nan")
        if ref_o is not None:
            rel = ((o.float() - ref_o.float()).norm() / ref_o.float().norm()).item()
        times = {c: [] for c in cols}
        for _ in range(args.warmup):
            for c, fn in cols.items():
                fn()
        torch.cuda.synchronize()
        for _ in range(args.reps):
            for c, fn in cols.items():
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                e.synchronize()
                times[c].append(s.elapsed_time(e))
        row = {"case": name, "B": B, "Lq": Lq, "Lk": Lk, "heads_q": Hq, "heads_kv": Hkv, "head_dim": D,
               "dtype": args.dtype,
               "causal": causal, "flops": flops, "rel_err_vs_sdpa": rel}
        for c, ts in times.items():
            ts.sort()
            med = ts[len(ts) // 2]
            row[c] = {"median_ms": med, "min_ms": ts[0], "max_ms": ts[-1], "tflops": flops / med / 1e9}
        line = f"[bench] {name:22s}"
        for c in cols:
            line += f" | {c} {row[c]['median_ms']:.3f} ms {row[c]['tflops']:.0f} TF/s"
        if "cudnn" in row:
            line += f" | ours/cudnn {row['cudnn']['median_ms'] / row['tessera']['median_ms']:.3f}x"
        if "flash" in row:
            line += f" | ours/flash {row['flash']['median_ms'] / row['tessera']['median_ms']:.3f}x"
        line += f" | rel err {rel:.1e}"
        print(line, flush=True)
        results.append(row)
        del q, k, v, o, lse, qt, kt, vt, cols, ref_o
        torch.cuda.empty_cache()
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(ROOT, "build-attn-lib", "libtessera_attn.so"))
    ap.add_argument("--build", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--cases", default="", help="comma-separated indices into the bench cases (default all)")
    ap.add_argument("--variants", default="", help="comma-separated extra kernel variants (attention_variants.cu)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--quick", action="store_true", help="--check: skip the largest cases")
    ap.add_argument("--commit", default="unknown", help="recorded in --json")
    ap.add_argument("--head-dim", type=int, default=128, choices=[64, 128], help="--bench head dim")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"], help="--bench dtype (variants: bf16 only)")
    args = ap.parse_args()
    args.variants = [int(x) for x in args.variants.split(",") if x]
    if args.build:
        t = time.time()
        build(args.lib)
        print(f"[build] {args.lib} in {time.time() - t:.0f} s", flush=True)
    try:
        import torch
    except ImportError:
        print("PyTorch not importable: nothing to compare against")
        return 0
    tess = Tessera(args.lib)
    ok = True
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "command": " ".join(sys.argv),
           "commit": args.commit, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if args.check:
        ok = check(tess, args)
        out["check_ok"] = ok
    if args.bench:
        out["results"] = bench(tess, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
