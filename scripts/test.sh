#!/usr/bin/env bash
# The test command: builds (via setup.sh) and runs every ctest test. GPU tests
# (label gpu) report skipped on a machine without enough GPUs.
#   scripts/test.sh [ctest args...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
# The Python suite (ctest python_package_test) needs pytest, and torch for
# the front end's tests (PyPI's torch 2.11, as on the GPU machines); without
# them the suite reports skipped. TESSERA_NO_PY_DEPS=1 leaves the Python
# environment as it is.
if [ "${TESSERA_NO_PY_DEPS:-0}" != 1 ]; then
  py_need=()
  python3 -c "import pytest" 2>/dev/null || py_need+=(pytest)
  python3 -c "import torch" 2>/dev/null || py_need+=("torch>=2.11,<2.12")
  if [ ${#py_need[@]} -gt 0 ]; then
    echo "test: installing ${py_need[*]} for the Python suite"
    python3 -m pip install --quiet "${py_need[@]}" || echo "test: pip failed; the Python suite will report skipped"
  fi
fi
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
cd "$root/build"
ctest --output-on-failure -j "${TESSERA_TEST_JOBS:-2}" "$@"
