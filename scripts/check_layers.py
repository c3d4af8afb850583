#!/usr/bin/env python3
"""Fails when an #include crosses Tessera's layers (cmake/layers.txt).

    scripts/check_layers.py            check the tree, list every violation

Rules, for every source and header of the repository:
  * A file of layer L (src/L/..., include/tessera/L/...) includes public
    headers "tessera/M/..." only for M = L or M a layer L uses, directly or
    through others (cmake/layers.txt).
  * Private headers are reached only from inside their own layer: a quoted
    include that is not "tessera/..." resolves next to the including file,
    and must stay inside src/L/ (no "../other/x.hpp").
  * A layer's tests (tests/L/) may include L's private headers.
  * Above the layers, the C API, the tools, the benchmarks and the tests
    include public headers of any layer but never a layer's src/.
  * "tessera/<M>/detail/..." headers are M's own implementation: only M
    (and M's tests) include them; outside link nobody names link::detail.
Run by ctest as the test `layers`.
"""
from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
# Layers whose `detail` namespace nobody else may name. (kernels::detail still
# holds the GEMM engine's launch helpers the operators call.)
PRIVATE_DETAIL = ("link",)
DETAIL_USE = re.compile(r'\b(' + "|".join(PRIVATE_DETAIL) + r')::detail::')
SOURCE_EXT = (".cpp", ".hpp", ".cu", ".cuh", ".h")


def read_layers(path):
    deps = {}
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            name, _, rest = line.partition(":")
            name = name.strip()
            uses = rest.split()
            for d in uses:
                if d not in deps:
                    raise SystemExit(f"check_layers: {path}: '{name}' uses '{d}', which is not listed above it")
            deps[name] = set(uses)
    closure = {}
    for name in deps:  # listed bottom-up: every dependency's closure is known
        c = set(deps[name])
        for d in deps[name]:
            c |= closure[d]
        closure[name] = c | {name}
    return closure


def layer_of(rel, layers):
    parts = rel.split(os.sep)
    if parts[0] == "src" and len(parts) > 2 and parts[1] in layers:
        return parts[1]
    if parts[:2] == ["include", "tessera"] and len(parts) > 3 and parts[2] in layers:
        return parts[2]
    if parts[:2] == ["include", "tessera"] and len(parts) == 3:
        base = os.path.splitext(parts[2])[0]
        if base in layers:  # include/tessera/kernels.hpp-style umbrella headers
            return base
    if parts[0] == "tests" and len(parts) > 2 and parts[1] in layers:
        return "tests:" + parts[1]
    return None


def check(root=ROOT):
    layers = read_layers(os.path.join(root, "cmake", "layers.txt"))
    problems = []
    for top in ("src", "include", "tools", "bench", "tests"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for fn in files:
                if not fn.endswith(SOURCE_EXT):
                    continue
                path = os.path.join(dirpath, fn)
                rel = os.path.relpath(path, root)
                owner = layer_of(rel, layers)
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for m in DETAIL_USE.finditer(text):
                    if owner not in (m.group(1), "tests:" + m.group(1)):
                        line = text.count("\n", 0, m.start()) + 1
                        problems.append(f"{rel}:{line}: uses {m.group(0)}, {m.group(1)}'s implementation detail")
                for m in INCLUDE.finditer(text):
                    inc = m.group(1)
                    line = text.count("\n", 0, m.start()) + 1
                    where = f"{rel}:{line}"
                    if inc.startswith("tessera/"):
                        target = inc.split("/")
                        tl = target[1] if len(target) > 2 else os.path.splitext(target[1])[0]
                        if tl not in layers:
                            continue  # tessera/capi/..., tessera/version.hpp: above the layers
                        if "detail" in target[2:-1] and owner not in (tl, "tests:" + tl):
                            problems.append(f"{where}: includes {inc}, {tl}'s implementation detail")
                        if owner in layers and tl not in layers[owner]:
                            problems.append(f"{where}: layer '{owner}' includes {inc}, but does not use "
                                            f"'{tl}' (cmake/layers.txt: {owner} uses {sorted(layers[owner] - {owner})})")
                        continue
                    resolved = os.path.normpath(os.path.join(os.path.dirname(rel), inc))
                    if not os.path.exists(os.path.join(root, resolved)):
                        # Found through an include path: src/ on one is a reach into a layer.
                        resolved = os.path.normpath(os.path.join("src", inc))
                        if not os.path.exists(os.path.join(root, resolved)):
                            continue  # e.g. bench/common/..., tools/command.hpp
                    if resolved.startswith("src" + os.sep):
                        target_layer = resolved.split(os.sep)[1]
                        if owner not in (target_layer, "tests:" + target_layer):
                            problems.append(f"{where}: includes {inc}, a private header of src/{target_layer}")
    return problems


def main():
    problems = check()
    for p in problems:
        print(f"layers: {p}")
    print(f"layers: {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
