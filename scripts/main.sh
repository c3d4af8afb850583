#!/usr/bin/env bash
# The main job: set up (install what is missing, build) and run Tessera.
#  - with >= 2 GPUs: the communication microbenchmarks across all GPUs, the
#    TP MLP (MLP-1..3: sequential, decomposition, fused, ideal) and, where
#    PyTorch is importable, PyTorch async-TP against Tessera in one process;
#  - with >= 1 GPU: the GEMM engine against cuBLASLt;
#  - without GPUs: the CommIR planner on a built-in machine profile (attention
#    on a 2x4 H100 mesh and the TP MLP on 2 H200s), which needs no GPU.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
bin="$root/build/bin/tessera"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "$ngpu" -ge 2 ]; then
  "$bin" run -n "$ngpu" -- "$bin" bench comm
  "$bin" run -n "$ngpu" -- "$bin" bench mlp --shapes 1,2,3 --no-variants
  if command -v torchrun >/dev/null && python3 -c "import torch" 2>/dev/null; then
    TESSERA_C_LIB="$root/build/lib/libtessera_c.so" torchrun --nproc-per-node "$ngpu" \
        "$root/scripts/bench_async_tp.py" --shapes 1,2,3
  fi
fi
if [ "$ngpu" -ge 1 ]; then
  "$bin" bench gemm
else
  echo "no GPU here: planning with the CommIR autotuner instead"
  "$bin" plan attention --mesh 2x4 --machine h100 --seq 32768 --heads 32 --layout ring --top 5
  "$bin" plan mlp --mesh 2 --machine h200x2 --top 4
fi
