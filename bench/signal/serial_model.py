#!/usr/bin/env python3
"""Checks a `tessera bench signal` log against the "nothing overlaps" model.

For every row whose tuner choice is an overlapped partition, recovers the
engine GEMM time on the budgeted SMs (116 = 132 - 16, tile 128x256) by
inverting the log's own prediction (the overlap model of
signal::PredictiveSearch with the curve the log prints), then predicts
    serial = engine GEMM + sum over groups of curve(group bytes)
i.e. every group collective running after the GEMM at its standalone speed,
and prints its error next to the overlap model's. Rows where the inversion
is ill-posed (comm-bound: the prediction does not depend on the GEMM time)
show gemm116 = 0 and a large error; ignore those.

Usage: serial_model.py LOG [LOG...]   (docs/design/signal.md)
"""
import re, math, sys
def parse(path):
    lines=open(path).read().splitlines()
    ops={}
    op=None
    for l in lines:
        m=re.search(r'\] (ar|rs): offline stage: NCCL bandwidth curve',l)
        if m: op=m.group(1); ops[op]={'curve':[], 'rows':[]}; continue
        m=re.search(r'curve: (\d+) KiB in ([\d.]+) us',l)
        if m and op: ops[op]['curve'].append((int(m.group(1))*1024, float(m.group(2))*1e-6)); continue
        m=re.search(r'curve done: \d+ points, .* \.\. (\d+) MiB ([\d.]+) ms',l)
        if m and op: ops[op]['curve'].append((int(m.group(1))<<20, float(m.group(2))*1e-3)); continue
        m=re.search(r'\] (ar|rs): (?:(MLP-\d) )?(\d+)x(\d+)x(\d+) done in .*tessera ([\d.]+) ms \((.*?)\), non-overlap ([\d.]+).*searched overlap ([\d.]+) ms predicted ([\d.]+)',l)
        if m:
            ops[m.group(1)]['rows'].append(dict(label=m.group(2) or '-',M=int(m.group(3)),N=int(m.group(4)),K=int(m.group(5)),
              choice=m.group(7),seq=float(m.group(8)),meas=float(m.group(9))*1e-3,pred=float(m.group(10))*1e-3))
    return ops
def curve_time(pts,b):
    if b<=pts[0][0]: return pts[0][1]
    if b>=pts[-1][0]: return b*pts[-1][1]/pts[-1][0]
    for (ab,at),(bb,bt) in zip(pts,pts[1:]):
        if ab<=b<=bb:
            f=math.log(b/ab)/math.log(bb/ab); bw=(1-f)*ab/at+f*bb/bt
            return min(max(b/bw,at),bt)
def run(path,sms=116,tile=128*256):
    ops=parse(path)
    for op,d in ops.items():
        pts=sorted(d['curve'])
        print(f"== {path} op {op}")
        print(f"{'shape':>22} {'groups':>4} {'meas':>7} {'pred':>7} {'gemm116':>8} {'serial':>7} {'ser err%':>8} {'sumcomm':>8}")
        errs=[]; perrs=[]
        for r in d['rows']:
            if not r['choice'].startswith('['): continue
            parts=[int(x) for x in r['choice'][1:-1].split(',')]
            T=(r['M']//128)*(r['N']//256); W=math.ceil(T/sms)
            assert sum(parts)==W,(r,W)
            def wb(w): return min(w*sms,T)
            groups=[]; done=0
            for w in parts: groups.append((wb(done+w)-wb(done))*tile*2); done+=w
            comms=[curve_time(pts,b) for b in groups]
            def pred(gb):
                end=0; done=0
                for w,c in zip(parts,comms):
                    done+=w; end=max(gb*done/W,end)+c
                return end
            lo,hi=0,r['pred']
            for _ in range(100):
                mid=(lo+hi)/2
                if pred(mid)<r['pred']: lo=mid
                else: hi=mid
            gb=lo; ser=gb+sum(comms)
            e=(ser/r['meas']-1)*100; errs.append(abs(e)); perrs.append(abs(r['pred']/r['meas']-1)*100)
            print(f"{r['label']+' '+str(r['M'])+'x'+str(r['N'])+'x'+str(r['K']):>22} {len(parts):>4} {r['meas']*1e3:7.3f} {r['pred']*1e3:7.3f} {gb*1e3:8.3f} {ser*1e3:7.3f} {e:8.1f} {sum(comms)*1e3:8.3f}")
        if errs: print(f"  mean |err| serialized model {sum(errs)/len(errs):.1f}% vs current predictor {sum(perrs)/len(perrs):.1f}% over {len(errs)} rows")
for p in sys.argv[1:]: run(p)
