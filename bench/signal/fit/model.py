# bench/signal/fit/model.py — the overlap model of signal::PredictiveSearch rebuilt in Python from the log's 5-point curve; run it to check the rebuild against the logged predictions
import json, math
D=json.load(open(__import__('os').environ.get('FIT_DATA','data.json')))
SMS=116; TB=128*256*2
def curve_fn(pts):
    pts=[(b, ms) for b,ms in pts]
    def t(bytes):
        if bytes<=pts[0][0]: return pts[0][1]
        if bytes>=pts[-1][0]: return bytes*pts[-1][1]/pts[-1][0]
        for i in range(1,len(pts)):
            if bytes<pts[i][0]:
                a=pts[i-1]; b=pts[i]; break
        f=math.log(bytes/a[0])/math.log(b[0]/a[0])
        bw=(1-f)*a[0]/a[1]+f*b[0]/b[1]
        return min(max(bytes/bw,a[1]),b[1])
    return t
def tiles(r): return (r['shape'][0]//128)*((r['shape'][1]+255)//256)
def parse_part(s): return [int(x) for x in s.strip('[]').split(',')]
def equal_part(W,G): return [W//G+(1 if g<W%G else 0) for g in range(G)]
def group_bytes(r, part):
    T=tiles(r); out=[]; a=0
    for w in part:
        b=a+w; out.append((min(b*SMS,T)-min(a*SMS,T))*TB); a=b
    return out
def predict(r, part, comm, E=None, pen=0.0, **kw):
    """base model: C(k)=k*E/W; group g ready at C(b)+g*pen; end=max(ready,prev)+comm"""
    W=r['waves']; E=r['engine_epi'] if E is None else E
    end=0; a=0
    for g,(w,by) in enumerate(zip(part, group_bytes(r,part))):
        b=a+w; ready=b*E/W+g*pen
        end=max(ready,end)+comm(by); a=b
    return end
if __name__=='__main__':
    for op in D:
        c=curve_fn(D[op]['curve']); errs=[]
        for r in D[op]['rows']:
            assert math.ceil(tiles(r)/SMS)==r['waves'], r['shape']
            p=predict(r, parse_part(r['choice']) if r['choice']!='no overlap' else None or parse_part(r['choice']) , c, pen=r['penalty_us']*1e-3) if r['choice']!='no overlap' else None
        # reconstruct logged prediction of the searched partition: need searched partition: only known when chosen
        for r in D[op]['rows']:
            if r['choice']=='no overlap': continue
            p=predict(r, parse_part(r['choice']), c, pen=r['penalty_us']*1e-3)
            errs.append((p-r['pred'])/r['pred'])
        print(op, 'reconstruction of logged prediction: n',len(errs),'mean abs %.2f%% max %.2f%%'%(100*sum(map(abs,errs))/len(errs), 100*max(map(abs,errs))))
