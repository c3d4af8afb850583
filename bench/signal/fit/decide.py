# bench/signal/fit/decide.py — decision check on held-out shapes: the model picks among each shape's measured partitions and no overlap
from fit import *
def seq_pred(r, comm, which):
    T=tiles(r)*TB
    return r['gemm'] + (comm(T) if which=='split curve' else r['comm'])
for op in D:
    comm=curve_fn(D[op]['curve'])
    rows=D[op]['rows']; shapes=[tuple(r['shape']) for r in rows]
    allp=points(op)
    # seq prediction error
    for which in ('split curve','default comm (measured)'):
        e=[abs(seq_pred(r,comm,which)-r['seq'])/r['seq'] for r in rows]
        b=[(seq_pred(r,comm,which)-r['seq'])/r['seq'] for r in rows]
        print(f'{op} non-overlap prediction, comm from {which}: mean |err| {100*sum(e)/len(e):.2f}%, mean signed {100*sum(b)/len(b):+.2f}%')
    for name,grid in [('M0 fixed p',GRIDS['M0 fixed p (current form)']),('M3 p+gamma',GRIDS['M3 p + comm beside GEMM slower (gamma)'])]:
      for which in ('split curve','default comm (measured)'):
        for mg in (0.0,0.03):
          slow=0; n=0; frac=[]; sp=[]; errsearch=[]
          for fold in (0,1):
            train={s for i,s in enumerate(shapes) if i%2==fold}
            e,prm=fit([x for x in allp if tuple(x[0]['shape']) in train],comm,grid)
            for r in rows:
                if tuple(r['shape']) in train: continue
                cands=[(p,T) for rr,p,T,_ in allp if rr is r]
                if not cands: continue
                n+=1
                preds=[(model_T(r,p,comm,prm,None),T,p) for p,T in cands]
                bp=min(preds)
                sq=seq_pred(r,comm,which)
                chosen = bp[1] if bp[0] < sq*(1-mg) else r['seq']
                best=min([T for _,T in cands]+[r['seq']])
                slow += chosen > r['seq']*1.005
                frac.append(best/chosen); sp.append(r['seq']/chosen)
          print(f'  {op} {name:12s} seq from {which:24s} min_gain {mg:.2f}: held-out shapes {n}: slower than non-overlap on {slow}, mean best/chosen {100*sum(frac)/n:.1f}%, >=99% on {sum(f>=0.99 for f in frac)}, mean speedup {sum(sp)/n:.3f}')
