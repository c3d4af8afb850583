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
    out = subprocess.run([cuobjdump, "-sass", obj], check=True, capture_output=True, text=True).stdout
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
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump")
    args = ap.parse_args()
    if not os.path.exists(args.cuobjdump):
        sys.exit(f"schedule.py: no cuobjdump at {args.cuobjdump} (pass --cuobjdump)")
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


if __name__ == "__main__":
    main()
