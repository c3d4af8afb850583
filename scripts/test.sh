#!/usr/bin/env bash
# The test command: builds (via setup.sh) and runs every ctest test. GPU tests
# (label gpu) report skipped on a machine without enough GPUs.
#   scripts/test.sh [ctest args...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
cd "$root/build"
ctest --output-on-failure -j "${TESSERA_TEST_JOBS:-2}" "$@"
