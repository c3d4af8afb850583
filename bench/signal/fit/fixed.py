# bench/signal/fit/fixed.py — error of fixed parameter sets on all measured partitions and on the searched ones
from fit import *
for op in D:
    comm=curve_fn(D[op]['curve']); allp=points(op)
    for prm in ({'p':0.020},{'p':0.020,'gamma':0.25},{'p':0.016,'gamma':0.25},{'p':0.020,'gamma':0.15},{'p':0.016,'gamma':0.35}):
        e=err(allp,comm,prm); es=err([x for x in allp if x[3]=='searched'],comm,prm)
        # bias
        b=[(model_T(r,p,comm,prm,None)-T)/T for r,p,T,_ in allp]
        print(op, prm, f'all {100*e:.2f}%  searched {100*es:.2f}%  signed {100*sum(b)/len(b):+.2f}%')
