#!/usr/bin/env python3
"""Condenses device-check's clock sampler log per step and GPU.

  clock-summary.py clocks.csv steps.txt

clocks.csv: nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,
power.draw,temperature.gpu,clocks_event_reasons.active (csv,noheader,nounits,
every 100 ms). steps.txt: "<step> start|end <epoch s>" lines.
Per step and GPU: busy samples (the idle reason bit clear), median and 10th
percentile SM clock over them, median / max power, max temperature, and the
share of busy samples throttled by the software power cap (bit 0x4), by
thermal slowdown (0x20 | 0x40) or by hardware slowdown / power brake
(0x8 | 0x80). A benchmark column that ran power-capped ran at lower clocks
than one that did not: compare figures only at like clocks.
"""
import sys
from datetime import datetime
from statistics import median


def parse_clocks(path):
    rows = []
    for line in open(path, errors="replace"):
        f = [x.strip() for x in line.split(",")]
        if len(f) < 7:
            continue
        try:
            t = datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((t, int(f[1]), float(f[2]), float(f[4]), float(f[5]), int(f[6], 16)))
        except ValueError:
            continue  # "[N/A]" or a torn line
    return rows


def parse_steps(path):
    spans, open_ = [], {}
    for line in open(path):
        f = line.split()
        if len(f) != 3:
            continue
        if f[1] == "start":
            open_[f[0]] = float(f[2])
        elif f[1] == "end" and f[0] in open_:
            spans.append((f[0], open_.pop(f[0]), float(f[2])))
    return spans


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    rows, spans = parse_clocks(sys.argv[1]), parse_steps(sys.argv[2])
    if not rows:
        print("clocks: no samples (see clocks.err)")
        return 0
    print("clocks per step (busy samples; SM MHz median / p10; W median / max; max °C; % power-capped / thermal / hw)")
    for name, t0, t1 in spans:
        for gpu in sorted({r[1] for r in rows}):
            busy = [r for r in rows if r[1] == gpu and t0 <= r[0] <= t1 and not r[5] & 0x1]
            if not busy:
                continue
            clk = sorted(r[2] for r in busy)
            pw = [r[3] for r in busy]
            pct = lambda mask: 100.0 * sum(1 for r in busy if r[5] & mask) / len(busy)
            print(f"  {name:8s} gpu{gpu} n={len(busy):4d}  SM {median(clk):6.0f} / {clk[len(clk) // 10]:6.0f} MHz"
                  f"  {median(pw):5.0f} / {max(pw):5.0f} W  {max(r[4] for r in busy):3.0f} C"
                  f"  capped {pct(0x4):5.1f}%  thermal {pct(0x60):5.1f}%  hw {pct(0x88):5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
