#!/usr/bin/env python3
"""Summarise the GPU timelines written by libtessera_kernel_trace.so.

Run a program with the tracer injected (one trace file per process):

    CUDA_INJECTION64_PATH=build/lib/libtessera_kernel_trace.so \
    TESSERA_KERNEL_TRACE_DIR=/tmp/tr  tessera run -n 2 -- tessera bench moe ...
    scripts/trace_summary.py /tmp/tr/trace-*.json

A benchmark separates its repetitions by host barriers, so a process's
timeline falls into bursts: runs of GPU work with no gap longer than
--gap-us on any stream. Bursts with the same kernels (by name and count)
and a similar length (within a factor of --length-ratio) are one variant,
so one kernel mix timed on several shapes stays apart; for each variant
this prints the median burst time, each kernel's median duration, the
stream overlap, and the timeline of the median burst (offsets from the
burst's start, per stream). --totals instead sums every kernel over the
whole trace (for a workload without gaps, e.g. a training step). Offsets
and durations are GPU timestamps (CUPTI), so they are what the GPU did, not
what the host asked for. --self-test checks this script on a made-up trace.
"""
import argparse
import json
import math
import re
import statistics
import sys
from collections import Counter, defaultdict


def short_name(name):
    """The function's own name: no return type, namespace, template or arguments."""
    n = re.sub(r"^void ", "", name)
    depth, cut = 0, len(n)
    for i, ch in enumerate(n):  # first '(' or '<' outside template brackets ends the qualified name
        if ch in "<(" and depth == 0:
            cut = i
            break
    n = n[:cut]
    return n.split("::")[-1] or name[:40]


def load(path):
    with open(path) as f:
        doc = json.load(f)
    ev = [e for e in doc.get("traceEvents", []) if e.get("ph") == "X"]
    for e in ev:
        e["short"] = short_name(e["name"])
        e["end"] = e["ts"] + e["dur"]
    ev.sort(key=lambda e: e["ts"])
    return ev, doc.get("otherData", {})


def bursts(events, gap_us):
    out, cur, cur_end = [], [], None
    for e in events:
        if cur and e["ts"] - cur_end > gap_us:
            out.append(cur)
            cur = []
        if not cur:
            cur_end = e["end"]
        cur.append(e)
        cur_end = max(cur_end, e["end"])
    if cur:
        out.append(cur)
    return out


def union_length(intervals):
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def overlap_profile(burst):
    """Time (us) with at least one / at least two streams busy."""
    points = []
    for stream in {e["tid"] for e in burst}:
        iv = [(e["ts"], e["end"]) for e in burst if e["tid"] == stream]
        # merge per stream first so a stream counts once
        merged = []
        for s, e in sorted(iv):
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        for s, e in merged:
            points += [(s, 1), (e, -1)]
    points.sort()
    busy1 = busy2 = 0.0
    level, last = 0, None
    for t, d in points:
        if last is not None:
            if level >= 1:
                busy1 += t - last
            if level >= 2:
                busy2 += t - last
        level += d
        last = t
    return busy1, busy2


def variants(events, gap_us, min_kernels, length_ratio):
    """Bursts grouped by (kernel multiset, length bucket): {key: [burst, ...]}."""
    groups = defaultdict(list)
    for b in bursts(events, gap_us):
        if len(b) < min_kernels:
            continue
        length = max(e["end"] for e in b) - b[0]["ts"]
        bucket = round(math.log(max(length, 1e-3)) / math.log(length_ratio))
        sig = (tuple(sorted(Counter(e["short"] for e in b).items())), bucket)
        groups[sig].append(b)
    return groups


def totals(events):
    """{kernel: (count, total us)} over the whole trace."""
    acc = defaultdict(lambda: [0, 0.0])
    for e in events:
        acc[e["short"]][0] += 1
        acc[e["short"]][1] += e["dur"]
    return acc


def describe(path, args):
    events, other = load(path)
    print(f"== {path}: {len(events)} records" + (f", {other.get('dropped')} dropped" if other.get("dropped") else ""))
    if args.totals:
        busy, _ = overlap_profile(events) if events else (0.0, 0.0)
        print(f"   GPU busy {busy / 1e3:.2f} ms of {(events[-1]['end'] - events[0]['ts']) / 1e3 if events else 0:.2f} ms")
        for n, (c, t) in sorted(totals(events).items(), key=lambda kv: -kv[1][1])[: args.top]:
            print(f"   {t / 1e3:10.3f} ms  {c:7d}x  {n}")
        return
    groups = variants(events, args.gap_us, args.min_kernels, args.length_ratio)
    ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    for (sig, _), bs in ranked[: args.variants]:
        durs = [max(e["end"] for e in b) - b[0]["ts"] for b in bs]
        med = statistics.median(durs)
        rep = bs[min(range(len(bs)), key=lambda i: abs(durs[i] - med))]
        t0 = rep[0]["ts"]
        span = max(e["end"] for e in rep) - t0
        busy1, busy2 = overlap_profile(rep)
        print(f"\n-- variant: {len(bs)} bursts, {sum(c for _, c in sig)} records each; burst median {med:.1f} us")
        print(f"   representative burst {span:.1f} us: GPU busy {busy1:.1f} us, idle {span - busy1:.1f} us, "
              f"two or more streams busy {busy2:.1f} us")
        per_name = defaultdict(list)
        for b in bs:
            acc = defaultdict(float)
            for e in b:
                acc[e["short"]] += e["dur"]
            for n, v in acc.items():
                per_name[n].append(v)
        print("   per kernel (median total per burst, us):")
        for n, v in sorted(per_name.items(), key=lambda kv: -statistics.median(kv[1])):
            print(f"     {statistics.median(v):9.1f}  {n}")
        if args.timeline:
            streams = sorted({e["tid"] for e in rep})
            print("   timeline (stream, start us, duration us, kernel):")
            for e in rep:
                col = streams.index(e["tid"])
                extra = f" {e['args']['bytes'] / 2**20:.1f} MiB" if e.get("args", {}).get("bytes") else ""
                print(f"     s{col} {e['ts'] - t0:9.1f} {e['dur']:9.1f}  {'  ' * col}{e['short']}{extra}")


def self_test():
    """Two shapes of one kernel mix stay apart; overlap and totals add up."""
    ev, t = [], 0.0
    for length in [100.0] * 5 + [400.0] * 5:  # two shapes, same kernels
        ev.append({"name": "void ns::gemm_kernel<int>(P)", "ph": "X", "pid": 0, "tid": 1, "ts": t, "dur": length})
        ev.append({"name": "ncclDevKernel_SendRecv(A)", "ph": "X", "pid": 0, "tid": 2, "ts": t + 10, "dur": length / 2})
        t += length + 1000.0
    for e in ev:
        e["short"] = short_name(e["name"])
        e["end"] = e["ts"] + e["dur"]
    groups = variants(ev, 20.0, 2, 1.25)
    assert len(groups) == 2, groups.keys()
    assert sorted(len(v) for v in groups.values()) == [5, 5]
    b = next(iter(groups.values()))[0]
    busy1, busy2 = overlap_profile(b)
    length = b[0]["dur"]
    assert abs(busy1 - length) < 1e-6 and abs(busy2 - length / 2) < 1e-6, (busy1, busy2)
    tot = totals(ev)
    assert tot["gemm_kernel"][0] == 10 and abs(tot["gemm_kernel"][1] - 2500.0) < 1e-6, tot
    assert short_name("void a::b::k<c::d<1>, e>(f::g)") == "k"
    print("trace_summary self-test: ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--self-test", action="store_true", help="check the script on a made-up trace")
    ap.add_argument("--totals", action="store_true", help="per-kernel totals over the whole trace")
    ap.add_argument("--top", type=int, default=25, help="--totals: kernels to list")
    ap.add_argument("--length-ratio", type=float, default=1.25, help="burst lengths in one variant differ by less")
    ap.add_argument("--gap-us", type=float, default=20.0, help="idle time that ends a burst")
    ap.add_argument("--min-kernels", type=int, default=2, help="ignore bursts with fewer records")
    ap.add_argument("--variants", type=int, default=8, help="most frequent variants to show")
    ap.add_argument("--timeline", action="store_true", help="print the median burst of each variant")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if not args.traces:
        ap.error("no trace files")
    for p in args.traces:
        describe(p, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
