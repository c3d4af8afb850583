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
# The interpreter is the one ctest runs the suite with (CMake's Python3).
if [ "${TESSERA_NO_PY_DEPS:-0}" != 1 ]; then
  py=$(sed -n 's/^_\{0,1\}Python3_EXECUTABLE:[A-Z]*=//p' "$root/build/CMakeCache.txt" 2>/dev/null | head -1 || true)
  py=${py:-python3}
  py_need=()
  "$py" -c "import pytest" 2>/dev/null || py_need+=(pytest)
  "$py" -c "import torch" 2>/dev/null || py_need+=("torch>=2.11,<2.12")
  if [ ${#py_need[@]} -gt 0 ]; then
    echo "test: installing ${py_need[*]} into $py for the Python suite"
    "$py" -m pip install --quiet "${py_need[@]}" ||
      echo "test: WARNING: pip failed; the Python suite (python_package_test) will report skipped"
  fi
fi
# cuobjdump and the nvdisasm it runs, for the ctest sass_schedule (the CUDA
# toolkit here may lack them): PyPI's nvidia-cuda-{cuobjdump,nvdisasm}
# wheels, unpacked into build/tools; without them the test reports skipped.
tools="$root/build/tools"
if ! command -v cuobjdump >/dev/null && [ ! -x /usr/local/cuda/bin/cuobjdump ] && [ ! -x "$tools/cuobjdump" ]; then
  wheels=$(mktemp -d)
  if python3 -m pip download --quiet --no-deps -d "$wheels" "nvidia-cuda-cuobjdump>=13,<14" \
      "nvidia-cuda-nvdisasm>=13,<14" 2>/dev/null; then
    mkdir -p "$tools"
    python3 - "$wheels" "$tools" <<'PY' || echo "test: WARNING: the wheels lack a tool; sass_schedule will report skipped"
import glob, os, sys, zipfile
for wheel in glob.glob(os.path.join(sys.argv[1], "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.endswith(("/bin/cuobjdump", "/bin/nvdisasm")):
                dst = os.path.join(sys.argv[2], os.path.basename(name))
                with open(dst, "wb") as f:
                    f.write(z.read(name))
                os.chmod(dst, 0o755)
PY
  else
    echo "test: WARNING: pip could not fetch cuobjdump; sass_schedule will report skipped"
  fi
  rm -rf "$wheels"
fi
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
cd "$root/build"
ctest --output-on-failure -j "${TESSERA_TEST_JOBS:-2}" "$@"
