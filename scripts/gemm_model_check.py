#!/usr/bin/env python3
"""Offline check of the GEMM plan choice against measured per-kernel times.

    scripts/gemm_model_check.py LOG [LOG ...] [--tessera build/bin/tessera] [--sms 132] [--max-m M]
                                [--max-geomean X] [-v]
    scripts/gemm_model_check.py LOG [LOG ...] --alignment

LOG: the output of `tessera bench gemm --random N --seed S --diag` or
`--mnk ... --diag` (one line per shape: the plan, ours/cuBLASLt, then every
--diag kernel's time / cuBLASLt), e.g. bench/results/raw/. For each shape
it asks this build's planner (`tessera tune --op gemm --model-only`, no
GPU) which plan it runs, looks that plan up among the shape's timed
kernels, and reports its time over the fastest timed kernel's. Where the
timed kernels lack the chosen plan (a split count --diag does not time),
the cheapest timed kernel by the model's estimate stands in, marked '~'.

So a change to model_gemm_us() / model_plan() can be judged against
timings already taken before a device A/B confirms it (docs/design/gemm.md).
The timings are relative to the build that took them; the planner is this
checkout's. --max-geomean X exits 1 when a log's geometric mean exceeds X
(the ctest test gemm_model_check guards the planner with the logs in
bench/results/raw/). --alignment instead reports, over all the logs'
shapes, ours/cuBLASLt by K row alignment beside the same plans on rows
padded to 128 bytes (the `ours ld64` timing): what misaligned rows cost.
"""
from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys

LINE = re.compile(r"\s*(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+ours\s+([\d.]+) ms.*?cuBLASLt\s+([\d.]+) ms.*?ratio ([\d.]+)")
KERNEL = re.compile(r"  (\S+) ([\d.]+)(?=  |$)")


def diag_name(plan: str) -> str:
    """The --diag label of a plan_name(): 128x32/c1/k2/swap -> 128x32/swap/k2."""
    if plan.endswith("/swap"):
        parts = plan.split("/")
        split = [p for p in parts[2:-1] if p.startswith("k")]
        return parts[0] + "/swap" + ("/" + split[0] if split else "")
    return plan


def parse_log(path: str):
    shapes = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            tail = line.split(" err ", 1)[1] if " err " in line else ""
            # Our compiled kernels only: not the host times, the padded-layout
            # views ("ld64") or the PDL A/B variant.
            kernels = {k: float(v) for k, v in KERNEL.findall(tail)
                       if not k.startswith("host") and "ld64" not in k and "PDL" not in k and k != "ours"}
            if not kernels:
                continue
            ld64 = re.search(r"  ours ld64 ([\d.]+)", tail)
            shapes.append({"m": int(m.group(1)), "n": int(m.group(2)), "k": int(m.group(3)), "plan": m.group(4),
                           "ours": float(m.group(7)), "kernels": kernels,
                           "ours_ld64": float(ld64.group(1)) if ld64 else None})
    return shapes


def planner(tessera: str, sms: int, m: int, n: int, k: int, env=None):
    """The plan this planner runs for MxNxK (None if it names none) and its
    estimate of every candidate by --diag label; env: the planner's environment."""
    out = subprocess.run([tessera, "tune", "--op", "gemm", "--model-only", "--sms", str(sms), "--shape",
                          f"{m}x{n}x{k}", "--top-k", "64"], capture_output=True, text=True, check=True,
                         env=env).stdout
    runs = re.search(r"runs (\S+)", out)
    est = {diag_name(p): float(us) for us, p in re.findall(r"^\s+([\d.]+) us\s+(\S+)", out, re.M)}
    return (runs.group(1) if runs else None), est


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def row_alignment(k: int) -> int:
    """The bytes (16 .. 128) K's 16-bit rows are aligned to in a packed --diag buffer."""
    a = 1
    while a < 128 and (2 * k) % (2 * a) == 0:
        a *= 2
    return a


def alignment_report(shapes) -> None:
    """ours/cuBLASLt by K row alignment, and the same plans on rows padded to
    128 bytes (`ours ld64`, still over unpadded cuBLASLt): what misaligned
    rows cost."""
    print(f"{len(shapes)} shapes: ours/cuBLASLt {geomean([s['ours'] for s in shapes]):.3f}")
    for al in (16, 32, 64, 128):
        group = [s for s in shapes if row_alignment(s["k"]) == al]
        if not group:
            continue
        padded = [s["ours_ld64"] for s in group if s["ours_ld64"]]
        print(f"  rows {al:3d}-byte aligned: {len(group):3d} shapes, ours/cuBLASLt {geomean([s['ours'] for s in group]):.3f}"
              + (f", rows padded to 128 bytes {geomean(padded):.3f}" if padded else ""))
    what_if = [s["ours_ld64"] if s["ours_ld64"] and row_alignment(s["k"]) < 128 else s["ours"] for s in shapes]
    print(f"  every misaligned shape at its padded time: {geomean(what_if):.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--tessera", default="build/bin/tessera")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--max-m", type=int, default=0, help="only shapes with M <= this (0: all)")
    ap.add_argument("--max-geomean", type=float, default=0.0, help="exit 1 if a log's geomean exceeds this")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per shape")
    ap.add_argument("--alignment", action="store_true",
                    help="instead: ours/cuBLASLt of all logs' shapes by K row alignment, and with rows padded")
    a = ap.parse_args()
    if a.alignment:
        alignment_report([s for path in a.logs for s in parse_log(path) if not a.max_m or s["m"] <= a.max_m])
        return 0
    failed = False
    for path in a.logs:
        shapes = [s for s in parse_log(path) if not a.max_m or s["m"] <= a.max_m]
        if not shapes:
            print(f"{path}: no --diag lines")
            failed = True
            continue
        chosen, as_run = [], []
        for s in shapes:
            runs, est = planner(a.tessera, a.sms, s["m"], s["n"], s["k"])
            t = s["kernels"]
            best = min(t.values())
            pick, exact = diag_name(runs or ""), True
            if pick not in t:
                timed = [k for k in t if k in est]
                pick, exact = (min(timed, key=est.get), False) if timed else (None, False)
            if pick is None:
                continue
            chosen.append(t[pick] / best)
            as_run.append(s["ours"] / best)
            if a.verbose:
                print(f"  {s['m']:6d} x {s['n']:6d} x {s['k']:6d}  as run {s['plan']:18s} {s['ours'] / best:6.3f}"
                      f"  now {runs or '-':18s} {'' if exact else '~'}{t[pick] / best:6.3f}"
                      f"  best {min(t, key=t.get):18s} {best:6.3f} of cuBLASLt")
        g = geomean(chosen)
        print(f"{path}: {len(chosen)} shapes; plan / best timed kernel: this build {g:.3f} "
              f"(max {max(chosen):.3f}), as run {geomean(as_run):.3f}")
        if a.max_geomean and not g <= a.max_geomean:
            print(f"{path}: geomean {g:.3f} above --max-geomean {a.max_geomean}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
