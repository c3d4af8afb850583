#!/usr/bin/env python3
"""How a hook's code changes ptxas's schedule of the attention kernel's consumers.

Compiles scripts/sass/wait_forms.cu (or takes --object), dumps its SASS with
cuobjdump and, for every head-dim-128 bf16 attention kernel in it, compares
the consumers' code (first to last wgmma; registers, predicates and
constants masked) with the plain kernel's (NoKvWait) by sequence
similarity: 0.99+ is the plain kernel's instruction order, ~0.85 a
rescheduled one (docs/design/waits.md). Needs nvcc and cuobjdump (the CUDA
toolkit; `pip download nvidia-cuda-cuobjdump` where it lacks cuobjdump).

  scripts/sass/schedule.py                       # the wait forms
  scripts/sass/schedule.py --object build/CMakeFiles/.../hook_ab.cu.o
  scripts/sass/schedule.py --require SpKvTableWait=0.99   # the ctest sass_schedule

--require NAME=MIN fails (exit 1) unless the kernel labelled NAME is at least
MIN alike: the ctest keeps sp_attention's table wait (ops/sp_kv_table_wait.cuh)
from growing code that reschedules the consumers. Without cuobjdump (PATH,
the CUDA toolkit, or TESSERA_CUOBJDUMP, which scripts/test.sh fetches) it
exits 77, which ctest reports as skipped.
"""
import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORMS = ["spin", "spin + nanosleep", "poll count, trap", "abort word, trap", "globaltimer, trap",
         "clock64, trap", "poll count, WaitRecord, trap", "abort word, stores, trap", "bounded loop, normal exit",
         "link::wait_geq", "globaltimer (start in shared memory), trap", "abort word at an offset, trap",
         "globaltimer in us, 32-bit start, trap", "sp_attention's chunk walk, abort word at an offset",
         "the walk with a multiply-high and a 32-bit memo", "the flag per block from a table"]


def sass_functions(obj, cuobjdump):
    run = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True)
    if run.returncode != 0 and "nvdisasm" in run.stderr:
        print(f"schedule.py: cuobjdump needs nvdisasm (next to it or on PATH): skipped\n{run.stderr.strip()}")
        sys.exit(77)
    run.check_returncode()
    out = run.stdout
    funcs = {}
    for part in out.split("Function : ")[1:]:
        name = part.split("\n", 1)[0].strip()
        funcs[name] = [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", part)]
    return funcs


def consumer_span(ins):
    mask = lambda x: re.sub(r"\.reuse", "", re.sub(r"\bU?R\d+", "R", re.sub(r"\bU?P\d", "P", re.sub(r"0x[0-9a-f]+", "X", x))))
    idx = [i for i, x in enumerate(ins) if "HGMMA" in x]
    return [mask(x) for x in ins[idx[0]:idx[-1] + 1]] if idx else []


def label(name):
    m = re.search(r"4WaitILi(\d+)E", name)
    if m:
        return f"form {m.group(1)}: {FORMS[int(m.group(1))]}"
    m = re.search(r"\d+([A-Z][A-Za-z]*(?:Wait|Once|Only|Padded|Fence|Hook))(I[A-Za-z0-9]*?E)?E", name.split("bfloat16", 1)[-1])
    return (m.group(1) + (m.group(2) or "")) if m else name[-80:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--object", help="an object file to read instead of compiling wait_forms.cu")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    fetched = os.environ.get("TESSERA_CUOBJDUMP", "")  # scripts/test.sh's copy, if there is one
    ap.add_argument("--cuobjdump", default=fetched if os.path.exists(fetched) else
                    shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump")
    ap.add_argument("--require", action="append", default=[], metavar="NAME=MIN",
                    help="fail unless the kernel labelled NAME is at least MIN alike (repeatable)")
    args = ap.parse_args()
    if not os.path.exists(args.cuobjdump):
        print(f"schedule.py: no cuobjdump at {args.cuobjdump} (pass --cuobjdump or set TESSERA_CUOBJDUMP): skipped")
        sys.exit(77)
    obj = args.object
    if obj is None:
        obj = os.path.join(tempfile.mkdtemp(prefix="tessera-sass-"), "wait_forms.o")
        subprocess.run([args.nvcc, "-I", os.path.join(ROOT, "include"), "-I", os.path.join(ROOT, "bench"), "-O3", "-DNDEBUG",
                        "--generate-code=arch=compute_90a,code=[sm_90a]", "--expt-relaxed-constexpr", "-std=c++17",
                        "-x", "cu", "-c", os.path.join(ROOT, "scripts", "sass", "wait_forms.cu"), "-o", obj],
                       check=True)
    funcs = {n: v for n, v in sass_functions(obj, args.cuobjdump).items()
             if "attention_fwd_kernel" in n and "ILi128ELi192" in n and "bfloat16" in n}
    plain = [n for n in funcs if "NoKvWait" in n]
    if not plain:
        sys.exit("schedule.py: no plain (NoKvWait) head-dim-128 bf16 kernel in the object to compare with")
    ref = consumer_span(funcs[plain[0]])
    rows = []
    for n, ins in funcs.items():
        span = consumer_span(ins)
        rows.append((difflib.SequenceMatcher(None, ref, span, autojunk=False).ratio(), len(span), label(n)))
    for sim, size, name in sorted(rows, reverse=True):
        print(f"{sim:6.3f}  {size:5d}  {name}")
    failed = False
    for req in args.require:
        name, _, low = req.partition("=")
        found = [sim for sim, _, n in rows if n == name]
        if not found:
            print(f"schedule.py: FAILED: no kernel labelled {name}")
            failed = True
        elif min(found) < float(low):
            print(f"schedule.py: FAILED: {name} is {min(found):.3f} alike, below {low}: its hook reschedules the "
                  "consumers (docs/design/waits.md)")
            failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
