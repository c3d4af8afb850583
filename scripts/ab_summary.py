#!/usr/bin/env python3
"""Turns scripts/ab-bench.sh logs into a bench/results file: head / base per row.

    scripts/ab_summary.py AB_DIR --commit HEAD --base BASE --device nvidia-h200-x2 --date 2026-11-27 \\
        [--time HH:MM] [--issue N] > bench/results/ab-<topic>-<date>.json
    scripts/ab_summary.py --self-test

AB_DIR holds <bench>-<base|head>-<round>.log (bench: gemm, mlp, signal,
sp-attention, moe, grouped).
Each log's table (bench/common/timing.hpp Table::str(): right-aligned
columns two spaces apart, "[rank 0] " prefixes allowed) is read by the
header's column edges, so empty cells and values with single spaces stay in
their column. Per row the medians over rounds give head / base of:
  gemm    "ours ms"   keyed by M, N, K (the benchmark shapes' table, or the
          per-shape lines of bench gemm --random / --mnk, GEMM_AB_ARGS; those
          also give each build's geomean ours/cuBLASLt per round and the
          plans that differ between the builds)
  mlp     "tessera"   keyed by shape, part
  signal  "tessera"   keyed by op, shape, M, N, K
  sp-attention  "fused ms"  keyed by case, S
  moe     "pipe ms"   keyed by shape, routing
  grouped "ours ms"   keyed by problem
moe also gives head / base of "pipe ms" over each build's own "seq ms"
(REFERENCE): where a change leaves the sequential layer alone, this takes
out the drift between runs that both layers share (clocks, neighbours),
and "seq ms" head / base shows that drift.
(bench signal prints one table per op, ar then rs, with the same rows: a
table's op is the one named by the last "<op>: shape i/n", "<op>: offline
stage" or "<op>: budget spent" progress line before it) and per bench the geometric mean, with the no-regression target of a
refactor (<= 1.02). A row missing from either build is reported on stderr.
"""
import argparse
import glob
import json
import math
import os
import re
import statistics
import sys

import gemm_model_check  # its LINE: a shape line of bench gemm --random / --mnk

BENCHES = {
    "gemm": (("M", "N", "K"), "ours ms"),
    "mlp": (("shape", "part"), "tessera"),
    "signal": (("op", "shape", "M", "N", "K"), "tessera"),
    "sp-attention": (("case", "S"), "fused ms"),
    "moe": (("shape", "routing"), "pipe ms"),
    "grouped": (("problem",), "ours ms"),
}
# A column of the same row that the value is also divided by, per build.
REFERENCE = {"moe": "seq ms"}
TARGET = {"op": "<=", "value": 1.02, "text": "no regression beyond noise against the base (same call)"}


def strip_rank(line):
    return line[9:] if line.startswith("[rank 0] ") else line


OP_LINE = re.compile(r"\] (\w+): (shape \d+/\d+|offline stage|budget spent)")


def random_rows(text):
    """{(M, N, K): (plan, ours ms, cuBLASLt ms, ratio)} of bench gemm --random / --mnk lines."""
    out = {}
    for line in text.splitlines():
        m = gemm_model_check.LINE.match(strip_rank(line))  # M N K plan, ours ms, cuBLASLt ms, ratio
        if m:
            out[(m.group(1), m.group(2), m.group(3))] = (m.group(4), float(m.group(5)), float(m.group(6)),
                                                         float(m.group(7)))
    return out


def read_tables(text):
    """Every table in text: a list of row dicts per header line, each row
    carrying "op", the operator of the last progress line of an op (OP_LINE)
    before the table (empty if none).

    A header is a line whose cells (two or more spaces apart) include the
    wanted key and value columns of some bench. Table::str() pads every line
    of a table to the same width, so the table is the run of lines after the
    header that have the header's length."""
    lines = [strip_rank(l.rstrip("\n")) for l in text.splitlines() if not l.startswith("[rank ") or
             l.startswith("[rank 0] ")]
    tables = []
    op = ""
    i = 0
    while i < len(lines):
        m = OP_LINE.search(lines[i])
        if m:
            op = m.group(1)
        labels = [c for c in re.split(r"\s{2,}", lines[i].strip()) if c]
        if len(labels) >= 3 and any(set(k) - {"op"} | {v} <= set(labels) for k, v in BENCHES.values()):
            # Right edge of each column: where its (right-aligned) label ends.
            edges, pos = [], 0
            for lab in labels:
                pos = lines[i].index(lab, pos) + len(lab)
                edges.append(pos)
            rows = []
            j = i + 1
            while j < len(lines) and len(lines[j]) == len(lines[i]) and lines[j].strip():
                cells, left = {"op": op}, 0
                for lab, right in zip(labels, edges):
                    cells[lab] = lines[j][left:right].strip()
                    left = right
                rows.append(cells)
                j += 1
            tables.append(rows)
            i = j
        else:
            i += 1
    return tables


def rows_of(path, bench, column=None):
    """{key: float} of `column` (default: the bench's value column) in the log's tables."""
    keys, value = BENCHES[bench]
    column = column or value
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    out = {}
    for table in read_tables(text):
        for r in table:
            if all(k in r for k in keys) and column in r:
                try:
                    out[tuple(r[k] for k in keys)] = float(r[column])
                except ValueError:
                    pass
    if bench == "gemm" and not out and column in ("ours ms", "cuBLASLt ms"):
        at = 1 if column == "ours ms" else 2
        out = {key: row[at] for key, row in random_rows(text).items()}
    return out


def random_runs(ab_dir):
    """{"base"|"head": [(round, {(M, N, K): row})]} of gemm logs in the --random / --mnk format."""
    runs = {"base": [], "head": []}
    for build in runs:
        for path in sorted(glob.glob(os.path.join(ab_dir, f"gemm-{build}-*.log"))):
            with open(path, encoding="utf-8", errors="replace") as f:
                rows = random_rows(f.read())
            if rows:
                runs[build].append((path.rsplit("-", 1)[1][:-4], rows))
    return runs


def column_runs(ab_dir, bench, column=None):
    """{"base"|"head": {key: [values over rounds]}} of one column."""
    runs = {"base": {}, "head": {}}
    for build in runs:
        for path in sorted(glob.glob(os.path.join(ab_dir, f"{bench}-{build}-*.log"))):
            for key, v in rows_of(path, bench, column).items():
                runs[build].setdefault(key, []).append(v)
    return runs


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summarize(ab_dir, issue=18):
    recs = []
    for bench, (keys, value) in BENCHES.items():
        runs = column_runs(ab_dir, bench)
        if not runs["base"] and not runs["head"]:
            continue
        ref = REFERENCE.get(bench)
        refs = column_runs(ab_dir, bench, ref) if ref else {"base": {}, "head": {}}
        normalised, drift = [], []
        ratios = []
        plans = random_runs(ab_dir) if bench == "gemm" else {"base": [], "head": []}
        for build in ("base", "head"):
            for rnd, rows in plans[build]:
                recs.append({"metric": "geomean ours/cuBLASLt", "case": f"bench gemm, {build}, round {rnd}",
                             "value": round(geomean([r[3] for r in rows.values()]), 4), "unit": "ratio",
                             "series": build, "baseline": "cuBLASLt, same loop", "count": len(rows)})
        for key in sorted(set(runs["base"]) | set(runs["head"])):
            if key not in runs["base"] or key not in runs["head"]:
                print(f"ab_summary: {bench} {' '.join(key)} ran only on the "
                      f"{'head' if key in runs['head'] else 'base'}", file=sys.stderr)
                continue
            r = statistics.median(runs["head"][key]) / statistics.median(runs["base"][key])
            ratios.append(r)
            recs.append({"metric": f"head / base ({value})", "case": f"bench {bench} {' '.join(key)}",
                         "value": round(r, 4), "unit": "ratio", "series": bench,
                         "baseline": f"medians of {len(runs['base'][key])} base and {len(runs['head'][key])} head runs"})
            if plans["base"] and plans["head"]:
                pb, ph = plans["base"][0][1].get(key), plans["head"][0][1].get(key)
                if pb and ph and pb[0] != ph[0]:
                    recs[-1].update({"base_plan": pb[0], "head_plan": ph[0]})
            if key in refs["base"] and key in refs["head"]:
                rb, rh = statistics.median(refs["base"][key]), statistics.median(refs["head"][key])
                normalised.append(r * rb / rh)
                drift.append(rh / rb)
                recs.append({"metric": f"head / base ({value} / {ref})", "case": f"bench {bench} {' '.join(key)}",
                             "value": round(normalised[-1], 4), "unit": "ratio", "series": bench,
                             "baseline": f"each build's {value} over its own {ref}; valid where the change "
                                         f"leaves the {ref} path alone"})
                recs.append({"metric": f"head / base ({ref})", "case": f"bench {bench} {' '.join(key)}",
                             "value": round(drift[-1], 4), "unit": "ratio", "series": bench})
        if ratios:
            recs.append({"metric": f"geomean head / base ({value})", "case": f"bench {bench}, {len(ratios)} rows",
                         "value": round(geomean(ratios), 4), "unit": "ratio", "issue": issue, "target": TARGET,
                         "source": f"min {min(ratios):.4f}, max {max(ratios):.4f}"})
        if normalised:
            recs.append({"metric": f"geomean head / base ({value} / {ref})", "case": f"bench {bench}, {len(normalised)} rows",
                         "value": round(geomean(normalised), 4), "unit": "ratio", "issue": issue,
                         "source": f"min {min(normalised):.4f}, max {max(normalised):.4f}; {ref} head / base "
                                   f"{min(drift):.4f}-{max(drift):.4f}"})
    return recs


def table_str(header, rows):
    """Table::str() of bench/common/timing.cpp: right-aligned, two spaces after each cell."""
    w = [max(len(r[i]) if i < len(r) else 0 for r in [header] + rows) for i in range(len(header))]
    return "".join("".join(f"{(r[i] if i < len(r) else ''):>{w[i]}}  " for i in range(len(w))) + "\n"
                   for r in [header] + rows)


def sample_logs(a, b, seq="0.499"):
    gemm = ("bench gemm on NVIDIA H200 (132 SMs), bf16 in/out\n"
            "8192x5504x4096: ours 0.546 ms, cuBLASLt 0.560 ms, ratio 0.976\n\n" +
            table_str(["M", "N", "K", "tile", "ours ms", "cuBLASLt ms", "overlap == ours"],
                      [["8192", "5504", "4096", "64x256/pp", a, "0.560", "yes"],
                       ["8192", "4096", "5504", "128x256/c1", b, "0.567", ""]]) +
            "\nmedian ours/cuBLASLt = 0.997, worst = 1.031\n")
    mlp_rows = [["MLP-1", "AG+GEMM", "0.585", "0.581", "fused_ce", a, "fused_ce"],
                ["MLP-1", "AG+GEMM gated", "1.105", "1.103", "fused_ce (copy engine)", b, "fused_ce"]]
    main = table_str(["shape", "part", "GEMM", "best fused", "which", "tessera", "choice"], mlp_rows)
    # A second table of other columns right after it (bench mlp's variants):
    # its rows must not be read as the first table's.
    variants = table_str(["shape", "part", "variant", "ms", "speedup"],
                         [["MLP-1", "AG+GEMM", "fused_ce ch=4", "7.777", "1.1x"]])
    mlp = "".join("[rank 0] " + l + "\n" for l in (main + variants).splitlines())
    mlp += "[rank 1] " + main.splitlines()[1].replace(a, "9.999") + "\n"
    sig_rows = lambda v: [["MLP-1", "8192", "4096", "5504", v]]
    signal = "".join("[rank 0] " + l + "\n" for l in (
        "[    1.4 s] ar: shape 1/1 MLP-1 8192x4096x5504 ...\n" +
        table_str(["shape", "M", "N", "K", "tessera"], sig_rows(a)) +
        "[    9.7 s] rs: shape 1/1 MLP-1 8192x4096x5504 ...\n" +
        table_str(["shape", "M", "N", "K", "tessera"], sig_rows(b))).splitlines())
    sp = "".join("[rank 0] " + l + "\n" for l in table_str(
        ["case", "S", "seq ms", "fused ms", "auto ms (pick)", "attn ms"],
        [["32h causal", "16k", "2.451", a, "1.958 (fused_ce)", "1.722"],
         ["GQA 32/8 causal", "32k", "7.154", b, "7.152 (sequential)", "6.720"]]).splitlines())
    moe = "".join("[rank 0] " + l + "\n" for l in table_str(
        ["shape", "routing", "seq ms", "pipe ms", "seq gk ms", "pipe gk ms", "transport"],
        [["MoE-1", "uniform", seq, a, "0.505", "0.400", "copy_engine"],
         ["MoE-6", "uniform", "2.266", b, "2.253", "2.062", "copy_engine"]]).splitlines())
    grouped = table_str(["problem", "N", "K", "tile", "ours ms", "ours TF/s"],
                        [["MoE-1 TP2 gateup uniform", "1536", "2048", "64x256/pp", a, "700"],
                         ["MoE-1 TP2 down uniform", "2048", "768", "64x256/pp", b, "650"]])
    return gemm, mlp, signal, sp, moe, grouped


def self_test():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        for build, (a, b, seq) in {"base": ("0.500", "1.000", "0.500"), "head": ("0.510", "0.990", "0.510")}.items():
            gemm, mlp, signal, sp, moe, grouped = sample_logs(a, b, seq)
            for r in (1, 2):
                for bench, text in (("moe", moe), ("grouped", grouped)):
                    with open(os.path.join(d, f"{bench}-{build}-{r}.log"), "w") as f:
                        f.write(text)
                with open(os.path.join(d, f"sp-attention-{build}-{r}.log"), "w") as f:
                    f.write(sp)
                with open(os.path.join(d, f"signal-{build}-{r}.log"), "w") as f:
                    f.write(signal)
                with open(os.path.join(d, f"gemm-{build}-{r}.log"), "w") as f:
                    f.write(gemm)
                with open(os.path.join(d, f"mlp-{build}-{r}.log"), "w") as f:
                    f.write(mlp)
        recs = summarize(d)
    by_case = {r["case"]: r["value"] for r in recs if "seq ms" not in r["metric"]}
    assert by_case["bench gemm 8192 5504 4096"] == 1.02, by_case
    assert by_case["bench gemm 8192 4096 5504"] == 0.99, by_case
    assert by_case["bench mlp MLP-1 AG+GEMM"] == 1.02, by_case  # rank 1's row ignored
    assert by_case["bench mlp MLP-1 AG+GEMM gated"] == 0.99, by_case
    gm = by_case["bench gemm, 2 rows"]
    assert abs(gm - math.sqrt(1.02 * 0.99)) < 1e-4, gm
    assert by_case["bench signal ar MLP-1 8192 4096 5504"] == 1.02, by_case  # one row per op
    assert by_case["bench signal rs MLP-1 8192 4096 5504"] == 0.99, by_case
    assert by_case["bench sp-attention 32h causal 16k"] == 1.02, by_case
    assert by_case["bench sp-attention GQA 32/8 causal 32k"] == 0.99, by_case
    assert by_case["bench moe MoE-1 uniform"] == 1.02, by_case
    assert by_case["bench moe MoE-6 uniform"] == 0.99, by_case
    # MoE-1: pipe and seq both 2 % slower on the head, so pipe / seq is unchanged.
    norm = {r["case"]: r["value"] for r in recs if r["metric"] == "head / base (pipe ms / seq ms)"}
    assert norm["bench moe MoE-1 uniform"] == 1.0, norm
    assert norm["bench moe MoE-6 uniform"] == 0.99, norm
    drift = {r["case"]: r["value"] for r in recs if r["metric"] == "head / base (seq ms)"}
    assert drift["bench moe MoE-1 uniform"] == 1.02, drift
    assert by_case["bench grouped MoE-1 TP2 gateup uniform"] == 1.02, by_case
    assert by_case["bench grouped MoE-1 TP2 down uniform"] == 0.99, by_case
    # bench gemm --random / --mnk lines: head / base per shape, per-build geomeans, plan changes.
    line = ("   {m} {n} {k} {plan:<16} ours   {ours} ms   21 TF/s  cuBLASLt   {cub} ms   21 TF/s  ratio {ratio}  "
            "err 0.0e+00\n")
    with tempfile.TemporaryDirectory() as d:
        for build, (plan, ours) in {"base": ("64x64/pp", "0.0100"), "head": ("128x32/c1/swap", "0.0080")}.items():
            text = ("bench gemm --mnk on NVIDIA H200 (132 SMs), bf16 in/out, B [N,K]\n" +
                    line.format(m=19, n=4400, k=2160, plan=plan, ours=ours, cub="0.0080",
                                ratio=f"{float(ours) / 0.008:.3f}") +
                    line.format(m=29, n=808, k=728, plan="64x64/pp", ours="0.0040", cub="0.0040", ratio="1.000") +
                    "\nours          all                                      n=  2  geomean 1.1  worst 1.2\n")
            for r in (1, 2):
                with open(os.path.join(d, f"gemm-{build}-{r}.log"), "w") as f:
                    f.write(text)
        recs = summarize(d)
    by_case = {r["case"]: r for r in recs}
    assert by_case["bench gemm 19 4400 2160"]["value"] == 0.8, by_case
    assert by_case["bench gemm 19 4400 2160"]["head_plan"] == "128x32/c1/swap", by_case
    assert "head_plan" not in by_case["bench gemm 29 808 728"], by_case
    assert by_case["bench gemm, head, round 1"]["value"] == 1.0, by_case
    assert abs(by_case["bench gemm, base, round 2"]["value"] - math.sqrt(1.25)) < 1e-4, by_case
    print("ab_summary self-test: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ab_dir", nargs="?")
    ap.add_argument("--commit")
    ap.add_argument("--base")
    ap.add_argument("--device")
    ap.add_argument("--date")
    ap.add_argument("--time")
    ap.add_argument("--issue", type=int, default=18, help="the issue the geometric means are recorded for")
    ap.add_argument("--self-test", action="store_true")
    o = ap.parse_args()
    if o.self_test:
        self_test()
        return
    missing = [n for n in ("ab_dir", "commit", "base", "device", "date") if not getattr(o, n)]
    if missing:
        ap.error("needs " + ", ".join(missing))
    recs = summarize(o.ab_dir, o.issue)
    if not recs:
        sys.exit(f"ab_summary: no rows in {o.ab_dir} (<bench>-<base|head>-<round>.log)")
    prov = {"topic": "ab", "device": o.device, "date": o.date, "commit": o.commit,
            "command": f"scripts/ab-bench.sh prepare {o.base}; on the device: scripts/ab-bench.sh build, run; "
                       f"scripts/ab_summary.py", "baseline_commit": o.base}
    if o.time:
        prov["time"] = o.time
    json.dump({"provenance": prov, "records": recs}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
