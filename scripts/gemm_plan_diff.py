#!/usr/bin/env python3
"""Which random GEMM shapes change plan between two planners (no GPU).

    scripts/gemm_plan_diff.py --base BIN [--head BIN] [--head-env VAR=VALUE ...] [--count 1500] [--seed 4242]
                              [--sms 132] [--max-shapes 40] [--mnk-out FILE] [--jobs 4]

Draws --count shapes from the distribution `tessera bench gemm --random`
uses (M log-uniform in 16..16384; N and K log-uniform in 512..16384,
multiples of 8; the same distribution, not the same shapes), asks each
planner which plan it runs (`tessera tune --op gemm --model-only`), and
prints how many change, the changes by plan family, and up to
--max-shapes of the changed shapes as an `--mnk` list (also written to
--mnk-out). --head defaults to --base; --head-env sets variables for the
head planner only (one build with an environment switch).

Why: a change to the plan rules moves a few percent of shapes, which a
random sweep dilutes below its run-to-run spread. Timing only the shapes
that change (`bench gemm --mnk <list> --diag`, where the old plan's kernel
is timed in the same loop, or scripts/ab-bench.sh with GEMM_AB_ARGS)
measures the change itself (docs/design/gemm.md).
"""
from __future__ import annotations

import argparse
import collections
import math
import os
import random
import sys
from concurrent.futures import ThreadPoolExecutor

from gemm_model_check import planner


def draw(count: int, seed: int):
    r = random.Random(seed)

    def log_uniform(lo, hi):
        return math.exp(r.uniform(math.log(lo), math.log(hi)))

    shapes = []
    for _ in range(count):
        m = int(log_uniform(16, 16384))
        n = max(512, int(log_uniform(512, 16384)) // 8 * 8)
        k = max(512, int(log_uniform(512, 16384)) // 8 * 8)
        shapes.append((m, n, k))
    return shapes


def plan(tessera: str, sms: int, env: dict, shape) -> str:
    runs, _ = planner(tessera, sms, *shape, env=env)
    if runs is None:
        raise RuntimeError(f"no plan in the planner's output for {shape}")
    return runs


def family(p: str) -> str:
    """128x32/c1/k3/swap -> 128x32/swap; 128x128/c1x2 -> 128x128/c1x2; 64x256/pp/k4 -> 64x256/pp/split."""
    parts = p.split("/")
    tail = "/split" if any(x.startswith("k") and x[1:].isdigit() for x in parts) else ""
    if "swap" in parts:
        return parts[0] + "/swap" + tail
    return "/".join(x for x in parts if not (x.startswith("k") and x[1:].isdigit())) + tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="tessera binary of the base planner")
    ap.add_argument("--head", help="tessera binary of the head planner (default: --base)")
    ap.add_argument("--head-env", action="append", default=[], metavar="VAR=VALUE")
    ap.add_argument("--count", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=4242)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--max-shapes", type=int, default=40)
    ap.add_argument("--mnk-out")
    ap.add_argument("--jobs", type=int, default=4)
    a = ap.parse_args()
    head_env = dict(os.environ)
    for kv in a.head_env:
        if "=" not in kv:
            ap.error(f"--head-env {kv!r} is not VAR=VALUE")
        k, v = kv.split("=", 1)
        head_env[k] = v
    shapes = draw(a.count, a.seed)
    with ThreadPoolExecutor(a.jobs) as ex:
        base = list(ex.map(lambda s: plan(a.base, a.sms, dict(os.environ), s), shapes))
        head = list(ex.map(lambda s: plan(a.head or a.base, a.sms, head_env, s), shapes))
    changed = [(s, b, h) for s, b, h in zip(shapes, base, head) if b != h]
    print(f"{len(changed)} of {len(shapes)} shapes change plan (seed {a.seed}, {a.sms} SMs)")
    for (b, h), n in collections.Counter((family(b), family(h)) for _, b, h in changed).most_common():
        print(f"  {n:5d}  {b} -> {h}")
    picked = [s for s, _, _ in changed]
    random.Random(a.seed).shuffle(picked)
    mnk = " ".join("%dx%dx%d" % s for s in picked[:a.max_shapes])
    if mnk:
        print(f"--mnk {mnk}")
    if a.mnk_out:
        with open(a.mnk_out, "w", encoding="utf-8") as f:
            f.write(mnk + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
