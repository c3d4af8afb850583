"""python -m tessera.env — what Tessera sees on this machine: its version and
library, the NCCL it was built with and the one loaded, the GPUs, the links
between them (nvidia-smi topo -m, else CUDA peer-access queries), and whether
the GPUs form one load/store-accessible (LSA) team, which the operators need.

    python -m tessera.env [--json] [--no-probe]

--no-probe skips creating an NCCL communicator over the GPUs (the LSA probe).
"""
import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys


def _run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def collect(probe=True):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never create NVLink multicast objects from a probe
    import tessera
    from tessera import _lib

    rep = {"tessera": tessera.__version__, "python": sys.version.split()[0], "library": None, "library_error": None,
           "build_info": _lib.build_info(), "nccl": None, "gpus": [], "peer_access": None, "topology": None,
           "lsa": None}
    try:
        lib = _lib.load()
    except _lib.TesseraError as e:
        rep["library_error"] = str(e)
        return rep
    rep["library"] = _lib.library_path()
    built, loaded = _lib.nccl_versions()
    rep["nccl"] = {"built_with": built, "loaded": loaded, "loaded_path": _lib.loaded_nccl_path(), "match": built == loaded}

    smi = shutil.which("nvidia-smi")
    if smi:
        q = _run([smi, "--query-gpu=index,name,pci.bus_id,memory.total,driver_version", "--format=csv,noheader"])
        for line in q.splitlines():
            f = [x.strip() for x in line.split(",")]
            if len(f) >= 5:
                rep["gpus"].append({"index": int(f[0]), "name": f[1], "pci": f[2], "memory": f[3], "driver": f[4]})
    n = ctypes.c_int()
    if lib.tessera_device_count(ctypes.byref(n)) != 0:
        rep["cuda_error"] = lib.tessera_last_error().decode(errors="replace")
        n.value = 0
    rep["cuda_devices"] = n.value
    if n.value > 1:
        pa = {}
        for a in range(n.value):
            for b in range(n.value):
                if a != b:
                    c = ctypes.c_int()
                    ok = lib.tessera_can_access_peer(a, b, ctypes.byref(c)) == 0 and c.value == 1
                    pa[f"{a}->{b}"] = ok
        rep["peer_access"] = pa
        if smi:
            rep["topology"] = _run([smi, "topo", "-m"]) or None
    if probe and n.value >= 1:
        s = ctypes.c_int()
        if lib.tessera_lsa_probe(n.value, ctypes.byref(s)) == 0:
            rep["lsa"] = {"devices": n.value, "team": s.value, "all_reachable": s.value == n.value}
        else:
            rep["lsa"] = {"error": lib.tessera_last_error().decode(errors="replace")}
    return rep


def render(rep):
    out = [f"tessera {rep['tessera']} (python {rep['python']})"]
    if rep["library_error"]:
        out.append(f"library: NOT LOADED — {rep['library_error']}")
        return "\n".join(out)
    out.append(f"library: {rep['library']}")
    nc = rep["nccl"]
    out.append(f"NCCL: built with {nc['built_with']}, loaded {nc['loaded']} ({nc['loaded_path'] or '?'})"
               + ("" if nc["match"] else "  << MISMATCH: the device API needs the same NCCL"))
    out.append(f"CUDA devices: {rep['cuda_devices']}" + (f" ({rep['cuda_error']})" if rep.get("cuda_error") else ""))
    for g in rep["gpus"]:
        out.append(f"  GPU {g['index']}: {g['name']}, {g['memory']}, PCI {g['pci']}, driver {g['driver']}")
    if rep["peer_access"] is not None:
        bad = [k for k, v in rep["peer_access"].items() if not v]
        out.append("peer access (CUDA): " + ("all pairs" if not bad else "MISSING for " + ", ".join(bad)))
    if rep["topology"]:
        out.append("links (nvidia-smi topo -m):")
        out += ["  " + line for line in rep["topology"].splitlines()]
    lsa = rep["lsa"]
    if lsa is None:
        out.append("load/store reachability: not probed")
    elif "error" in lsa:
        out.append(f"load/store reachability: probe failed — {lsa['error']}")
    else:
        out.append(f"load/store reachability (NCCL LSA team over {lsa['devices']} GPU(s)): {lsa['team']} — "
                   + ("every GPU reaches every other by load/store" if lsa["all_reachable"]
                      else "NOT all reachable: Tessera's operators need one LSA team"))
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tessera.env", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--no-probe", action="store_true", help="skip the NCCL LSA probe")
    a = ap.parse_args(argv)
    rep = collect(probe=not a.no_probe)
    print(json.dumps(rep, indent=2) if a.json else render(rep))
    return 0 if rep["library_error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
