#!/usr/bin/env python3
"""Turns a device-check `moe` step's output into a bench/results file.

    scripts/moe_tp_results.py OUT_DIR --commit HASH --device nvidia-h200-x2 --date 2026-11-26 \
        [--gpu-tests-passed N] > bench/results/moe-tp-2026-11-26.json
    scripts/moe_tp_results.py --self-test

OUT_DIR holds moe.json (`tessera bench moe --json`: sequential and
pipelined layer times, automatic's choice, grouped GEMMs alone, collectives
alone, the PyTorch time read from scripts/bench_moe_torch.py). Per case
("MoE-1 uniform TP2"): both layer times, % of ideal (ideal = max(grouped
GEMMs alone, collectives alone)) with the 90 % target on pipelined,
sequential / pipelined, whether automatic chose pipelined, and PyTorch
sequential / the faster strategy with the 1.3x target (not for a run with
--queued-us, whose cases are named "... queued N us": the PyTorch script
times its layer from an idle GPU). Then run
scripts/results.py to regenerate bench/RESULTS.md.
"""
import argparse
import json
import os
import sys


def records(bench, gpu_tests):
    recs = []
    ideal_text = "ideal = max(grouped GEMMs alone, collectives alone)"
    for b in bench:
        case = f"{b['shape']} {b['routing']} TP{b['world']}"
        queued = b.get("queued_us", 0) > 0  # bench moe --queued-us: each call queued behind a GPU sleep
        if queued:
            case += f" queued {b['queued_us']:g} us"
        seq, pipe = b["sequential_ms"], b["pipelined_ms"]
        ideal = max(b["experts_ms"], b["comm_ms"])
        recs += [
            {"metric": "layer time", "case": case, "value": round(seq, 5), "unit": "ms",
             "series": "ours (sequential)"},
            {"metric": "layer time", "case": case, "value": round(pipe, 5), "unit": "ms",
             "series": "ours (pipelined)"},
            {"metric": "grouped GEMMs alone", "case": case, "value": round(b["experts_ms"], 5), "unit": "ms"},
            {"metric": "collectives alone", "case": case, "value": round(b["comm_ms"], 5), "unit": "ms"},
            {"metric": "% of ideal (sequential)", "case": case, "value": round(100 * ideal / seq, 2), "unit": "%",
             "baseline": ideal_text},
            {"metric": "% of ideal (pipelined)", "case": case, "value": round(100 * ideal / pipe, 2), "unit": "%",
             "baseline": ideal_text, "target": {"op": ">=", "value": 90, "text": "issue 22: >= 90 % of ideal"}},
            {"metric": "sequential / pipelined (layer)", "case": case, "value": round(seq / pipe, 4),
             "unit": "ratio", "baseline": "Tessera sequential"},
            {"metric": "automatic chose pipelined", "case": case, "value": 1 if b["auto"] == "pipelined" else 0,
             "unit": "bool", "baseline": f"tuner medians: sequential {b['tuner_sequential_ms']:.4f} ms, "
                                         f"pipelined {b['tuner_pipelined_ms']:.4f} ms"},
        ]
        if b.get("rs_chunks", 1) > 1:
            recs.append({"metric": "layer time", "case": case, "value": round(b["pipelined_one_chunk_ms"], 5),
                         "unit": "ms", "series": "ours (pipelined, part 2 in one chunk)",
                         "baseline": f"pipelined above ran part 2 in {b['rs_chunks']} column chunks"})
        if b.get("transport") == "copy_engine":
            recs.append({"metric": "layer time", "case": case, "value": round(b["pipelined_nccl_ms"], 5),
                         "unit": "ms", "series": "ours (pipelined over NCCL send/recv)",
                         "baseline": "pipelined above moved its data with the copy engine"})
        if b.get("torch_ms", 0) > 0 and not queued:  # the PyTorch layer is timed from an idle GPU
            recs += [
                {"metric": "PyTorch layer time", "case": case, "value": round(b["torch_ms"], 5), "unit": "ms",
                 "series": "torch"},
                {"metric": "torch sequential / ours (faster strategy)", "case": case,
                 "value": round(b["torch_ms"] / min(seq, pipe), 4), "unit": "ratio",
                 "baseline": "PyTorch sequential (all_gather, index_select, torch._grouped_mm, index_add, "
                             "reduce_scatter)",
                 "target": {"op": ">=", "value": 1.3, "text": "issue 22: >= 1.3x PyTorch sequential"}},
            ]
    if gpu_tests is not None:
        recs.append({"metric": "GPU tests passed (ops_moe_gpu, R = 2)", "value": gpu_tests, "unit": "count"})
    return recs


def self_test():
    """records() on made-up rows: the figures, the queued case's name, no PyTorch ratio for it."""
    row = {"shape": "MoE-1", "routing": "uniform", "world": 2, "sequential_ms": 0.5, "pipelined_ms": 0.4,
           "sequential_gather_kernel_ms": 0.5, "pipelined_gather_kernel_ms": 0.41, "rs_chunks": 1,
           "pipelined_one_chunk_ms": 0.4, "transport": "copy_engine", "pipelined_nccl_ms": 0.5,
           "auto": "pipelined", "tuner_sequential_ms": 0.5, "tuner_pipelined_ms": 0.4, "experts_ms": 0.24,
           "comm_ms": 0.2, "torch_ms": 1.5}
    cold = records([row], 3)
    queued = records([dict(row, queued_us=300)], None)
    by = {(r["metric"], r.get("series")): r for r in cold}
    assert by[("layer time", "ours (pipelined)")]["value"] == 0.4
    assert by[("% of ideal (pipelined)", None)]["value"] == 60.0
    assert by[("torch sequential / ours (faster strategy)", None)]["value"] == 3.75
    assert cold[-1] == {"metric": "GPU tests passed (ops_moe_gpu, R = 2)", "value": 3, "unit": "count"}
    assert all(r["case"] == "MoE-1 uniform TP2 queued 300 us" for r in queued), queued
    assert not any("torch" in r["metric"] or r.get("series") == "torch" for r in queued)
    cold_ours = [r for r in cold[:-1] if "torch" not in r["metric"] and r.get("series") != "torch"]
    assert [r["metric"] for r in queued] == [r["metric"] for r in cold_ours]  # the same records, renamed
    print("moe_tp_results self-test: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--commit")
    ap.add_argument("--device")
    ap.add_argument("--date")
    ap.add_argument("--gpu-tests-passed", type=int)
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return
    missing = [n for n in ("out_dir", "commit", "device", "date") if getattr(args, n) is None]
    if missing:
        ap.error("missing: " + ", ".join(missing))
    with open(os.path.join(args.out_dir, "moe.json"), encoding="utf-8") as f:
        bench = json.load(f)
    doc = {
        "provenance": {
            "topic": "moe", "device": args.device, "date": args.date, "commit": args.commit, "issue": 22,
            "command": "CUDA_VISIBLE_DEVICES=0,1 scripts/device-check.sh build tests moe (tessera run -n 2 -- "
                       "tessera bench moe --torch-json; torchrun --nproc-per-node 2 scripts/bench_moe_torch.py)",
        },
        "records": records(bench, args.gpu_tests_passed),
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
