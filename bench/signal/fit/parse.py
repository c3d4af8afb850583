# bench/signal/fit/parse.py — parse a bench signal log (its table format, rank 0 lines) into data.json (FIT_DATA): python3 parse.py bench-signal.log
import re, json, sys
L=[l[len('[rank 0] '):].rstrip('\n') for l in open(sys.argv[1]) if l.startswith('[rank 0]')]
ops={}
cur=None; section=None
for l in L:
    m=re.search(r'\] (ar|rs): offline stage: NCCL bandwidth curve',l)
    if m: cur=m.group(1); ops[cur]={'curve':[], 'main':{}, 'diag':{}, 'sweep':{}, 'log':{}}; section=None; continue
    if cur is None: continue
    D=ops[cur]
    m=re.search(r'curve: (\d+) KiB in ([\d.]+) us',l)
    if m: D['curve'].append((int(m.group(1))*1024, float(m.group(2))*1e-3)); continue
    m=re.search(r'curve done: 27 points, .* \.\. (\d+) MiB ([\d.]+) ms',l)
    if m: D['curve'].append((int(m.group(1))<<20, float(m.group(2)))); continue
    m=re.search(r'(ar|rs): (?:MLP-\d )?(\d+)x(\d+)x(\d+) done .*GEMM penalty ([\d.]+) us/group',l)
    if m: D['log'][(int(m.group(2)),int(m.group(3)),int(m.group(4)))]={'penalty_us':float(m.group(5))}; continue
    if l.startswith('shape ') and 'tuner choice' in l: section='main'; continue
    if l.startswith('shape ') and 'engine plain' in l: section='diag'; continue
    if l.startswith('shape ') and 'per extra group' in l: section='sweep'; continue
    if not l.strip() or l.startswith('[') or l.startswith('op ') or l.startswith('where'): 
        if l.startswith('op ') or l.startswith('where'): section=None
        continue
    t=l.split()
    if len(t)<5 or not t[1].isdigit(): continue
    if section=='main':
        # shape M N K waves choice GEMM comm seq decomp tessera speedup bound ofbound searched pred err [exh...] ratio relerr
        key=(int(t[1]),int(t[2]),int(t[3]))
        if t[5]=='no': t=t[:5]+['no overlap']+t[7:]
        r={'label':t[0],'waves':int(t[4]),'choice':t[5],'gemm':float(t[6]),'comm':float(t[7]),'seq':float(t[8]),
           'decomp':float(t[9]),'tessera':float(t[10]),'searched_ms':float(t[14]),'pred':float(t[15])}
        rest=' '.join(t[17:])
        m=re.match(r'([\d.]+) (\S+|no overlap) \((\d+) meas\.\)',rest)
        if m: r['exh_best_ms']=float(m.group(1)); r['exh_best']=m.group(2)
        D['main'][key]=r
    elif section=='diag':
        key=(int(t[1]),int(t[2]),int(t[3]))
        names=['groups','engine_plain','engine_epi','epi_pct','comm','comm_ov','groups_alone','beside_ov','beside_def','ov_gemm_end','overlap','overlap_def','serial_model','overlap_model']
        D['diag'][key]=dict(zip(names,[float(x) for x in t[4:]]))
    elif section=='sweep':
        key=(int(t[1]),int(t[2]),int(t[3]))
        D['sweep'].setdefault(key,[]).append({'G':int(t[4]),'overlap':float(t[5]),'gemm_end':float(t[6])})
for op,D in ops.items():
    print(op, len(D['curve']), len(D['main']), len(D['diag']), len(D['sweep']), len(D['log']), file=sys.stderr)
json.dump({op:{'curve':D['curve'],'rows':[{'shape':list(k),**D['main'][k],**D['diag'].get(k,{}),'sweep':D['sweep'].get(k,[]),**D['log'].get(k,{})} for k in D['main']]} for op,D in ops.items()}, open(__import__('os').environ.get('FIT_DATA','data.json'),'w'), indent=0)
