#!/usr/bin/env python3
"""Renders bench/RESULTS.md and its plots from the measured data in bench/results/*.json.

    scripts/results.py                 write bench/RESULTS.md and bench/results/plots/*.png
    scripts/results.py --check         validate every data file, write nothing
    scripts/results.py --out DIR       write RESULTS.md and plots/ under DIR instead
    scripts/results.py --no-plots      write RESULTS.md without plots (else matplotlib is required,
                                       so a regeneration never silently drops the plot links)

Data format (bench/results/README.md): a file holds one JSON object
{"provenance": {...}, "records": [...]} or a bare list of records. A record
is a dict with at least "topic", "metric", "value" and, from the record or
the file's provenance, "device", "date", "commit" and "command". Optional:
"case" (shape label), "unit", "baseline", "issue", "target"
({"op": "<=" | ">=" | "<" | ">", "value": x, "text": "..."}), "size" (a
number for time-against-size plots), "series", "source". A malformed record
is an error naming the file and the record, so CI catches it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import OrderedDict, defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "bench", "results")
REQUIRED = ("topic", "metric", "value", "device", "date", "commit", "command")
OPS = {"<=": lambda v, t: v <= t, ">=": lambda v, t: v >= t, "<": lambda v, t: v < t, ">": lambda v, t: v > t}


class DataError(Exception):
    pass


def load_file(path):
    with open(path, encoding="utf-8") as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON: {e}") from None
    if isinstance(doc, list):
        prov, recs = {}, doc
    elif isinstance(doc, dict) and isinstance(doc.get("records"), list):
        prov, recs = doc.get("provenance", {}), doc["records"]
        if not isinstance(prov, dict):
            raise DataError(f"{path}: 'provenance' must be an object")
    else:
        raise DataError(f"{path}: expected a list of records or an object with a 'records' list")
    out = []
    for i, r in enumerate(recs):
        if not isinstance(r, dict):
            raise DataError(f"{path}: record {i} is not an object")
        rec = dict(prov)
        rec.update(r)
        missing = [k for k in REQUIRED if k not in rec or rec[k] in (None, "")]
        if missing:
            raise DataError(f"{path}: record {i} ({rec.get('metric', '?')}) lacks {', '.join(missing)}")
        v = rec["value"]
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)) and not (
                isinstance(v, list) and all(isinstance(x, (int, float)) for x in v)):
            raise DataError(f"{path}: record {i} ({rec['metric']}) value {v!r} is not a finite number or list")
        t = rec.get("target")
        if isinstance(t, str):
            rec["target"] = t = {"text": t} if t else None
        if t is not None and set(t) != {"text"}:
            if not (isinstance(t, dict) and t.get("op") in OPS and isinstance(t.get("value"), (int, float))):
                raise DataError(f"{path}: record {i} ({rec['metric']}) target must be "
                                "{{'op': one of {}, 'value': number}}".format(sorted(OPS)))
        rec["_file"] = os.path.relpath(path, ROOT)
        out.append(rec)
    return out


def load_all(data_dir):
    recs = []
    for name in sorted(os.listdir(data_dir)):
        if name.endswith(".json"):
            recs.extend(load_file(os.path.join(data_dir, name)))
    return recs


def fmt_value(r):
    v = r["value"]
    if isinstance(v, list):
        return "[" + ", ".join(fmt_num(x) for x in v) + "]"
    unit = r.get("unit", "")
    s = fmt_num(v)
    return f"{s} {unit}".strip() if unit and unit != "ratio" else s


def fmt_num(x):
    if isinstance(x, int):
        return str(x)
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    return f"{x:.3f}"


def target_met(r):
    t = r.get("target")
    if t is None or "op" not in t or isinstance(r["value"], list):
        return None
    return OPS[t["op"]](r["value"], t["value"])


def status_table(recs):
    """Latest record per (issue, metric, case) that carries a target."""
    latest = OrderedDict()
    # Same date: the provenance's optional "time" (UTC, HH:MM) orders the runs.
    for r in sorted(recs, key=lambda r: (str(r.get("issue", "")), r["metric"], str(r.get("case", "")), r["date"],
                                         str(r.get("time", "")))):
        if r.get("target") is None:
            continue
        latest[(str(r.get("issue", "")), r["metric"], str(r.get("case", "")))] = r
    lines = ["| issue | metric | case | target | latest | met? | device, date, commit |", "|---|---|---|---|---|---|---|"]
    for (issue, metric, case), r in latest.items():
        t = r["target"]
        target = t.get("text") or f"{t['op']} {fmt_num(t['value'])}"
        met = {True: "yes", False: "**no**", None: "-"}[target_met(r)]
        lines.append(f"| {('#' + issue) if issue else '-'} | {metric} | {case or '-'} | {target} | {fmt_value(r)} | {met} "
                     f"| {r['device']}, {r['date']}, {r['commit']} |")
    return lines


def topic_sections(recs):
    """Per topic, per (metric, baseline) run: one table of cases, newest run first."""
    by_topic = defaultdict(list)
    for r in recs:
        by_topic[r["topic"]].append(r)
    out = []
    for topic in sorted(by_topic):
        out += ["", f"## {topic}", ""]
        runs = defaultdict(list)
        for r in by_topic[topic]:
            runs[(r["date"], r["commit"], r["device"], r["command"])].append(r)
        for (date, commit, device, command) in sorted(runs, reverse=True):
            rs = runs[(date, commit, device, command)]
            out += [f"- {device}, {date}, commit {commit}: `{command}`", ""]
            out += ["| metric | case | baseline or series | value | target |", "|---|---|---|---|---|"]
            for r in rs:
                t = r.get("target")
                tt = (t.get("text") or f"{t['op']} {fmt_num(t['value'])}") if t else ""
                out.append(f"| {r['metric']} | {r.get('case', '-')} | {r.get('baseline') or r.get('series') or '-'} | {fmt_value(r)} | {tt} |")
            out.append("")
    return out


def plots(recs, plot_dir):
    """Speedup (ratio against a baseline) per case, and time against size."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "matplotlib is not installed: plots not drawn"
    os.makedirs(plot_dir, exist_ok=True)
    made = []
    ratio_runs = defaultdict(list)
    size_runs = defaultdict(list)
    for r in recs:
        if isinstance(r["value"], list):
            continue
        if r.get("unit") == "ratio" and r.get("baseline") and r.get("case"):
            ratio_runs[(r["topic"], r["metric"], r["date"], r["commit"])].append(r)
        if isinstance(r.get("size"), (int, float)):
            size_runs[(r["topic"], r["metric"], r.get("unit", ""))].append(r)
    for (topic, metric, date, commit), rs in sorted(ratio_runs.items()):
        if len(rs) < 2:
            continue
        fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(rs)), 3.5))
        ax.bar(range(len(rs)), [r["value"] for r in rs], color="#4472c4")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(rs)))
        ax.set_xticklabels([r["case"] for r in rs], rotation=70, ha="right", fontsize=7)
        ax.set_ylabel(metric)
        ax.set_title(f"{topic}: {metric} ({rs[0]['device']}, {date}, {commit})", fontsize=9)
        fig.tight_layout()
        name = safe(f"{topic}-{metric}-{date}-{commit}") + ".png"
        fig.savefig(os.path.join(plot_dir, name), dpi=110)
        plt.close(fig)
        made.append(name)
    for (topic, metric, unit), rs in sorted(size_runs.items()):
        series = defaultdict(list)
        for r in rs:
            series[r.get("series") or r.get("baseline") or "ours"].append((r["size"], r["value"]))
        if sum(len(v) for v in series.values()) < 2:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, pts in sorted(series.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=name)
        ax.set_xscale("log")
        ax.set_xlabel("size")
        ax.set_ylabel(f"{metric} ({unit})" if unit else metric)
        ax.set_title(f"{topic}: {metric} against size", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        name = safe(f"{topic}-{metric}-vs-size") + ".png"
        fig.savefig(os.path.join(plot_dir, name), dpi=110)
        plt.close(fig)
        made.append(name)
    return made, ""


def safe(s):
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)


def render(recs, out_dir, plot_dir, draw=True):
    os.makedirs(out_dir, exist_ok=True)
    made, why = plots(recs, plot_dir) if draw else ([], "plots not drawn (--no-plots)")
    lines = ["# Tessera — measured results", "",
             "Generated by `scripts/results.py` from the data in `bench/results/*.json`; do not edit by hand.",
             "Each figure names its device kind, date, commit and command. Figures of different runs are",
             "not compared with each other. The historical log up to 2026-11-22 is bench/RESULTS-archive.md.", "",
             "## Where each target stands (latest measurement)", ""]
    lines += status_table(recs)
    if made:
        lines += ["", "## Plots", ""]
        rel = os.path.relpath(plot_dir, out_dir)
        lines += [f"![{m}]({rel}/{m})" for m in made]
    elif why:
        lines += ["", f"({why})"]
    lines += topic_sections(recs)
    path = os.path.join(out_dir, "RESULTS.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path, made


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=DATA, help="directory of *.json result files")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench"), help="where RESULTS.md goes")
    ap.add_argument("--check", action="store_true", help="validate the data only")
    ap.add_argument("--no-plots", action="store_true", help="write RESULTS.md without drawing plots")
    a = ap.parse_args(argv)
    try:
        recs = load_all(a.data)
    except DataError as e:
        print(f"results: {e}", file=sys.stderr)
        return 1
    if a.check:
        print(f"results: {len(recs)} records in {a.data} are valid")
        return 0
    if not a.no_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("results: matplotlib is not installed, so the plots (and RESULTS.md's links to them) would be "
                  "dropped; pip install matplotlib, or pass --no-plots", file=sys.stderr)
            return 1
    plot_dir = os.path.join(a.out, "results", "plots") if a.out != os.path.join(ROOT, "bench") else os.path.join(DATA, "plots")
    path, made = render(recs, a.out, plot_dir, draw=not a.no_plots)
    print(f"results: {len(recs)} records -> {path}, {len(made)} plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
