#!/usr/bin/env bash
# Builds the grouped GEMM development harness (scripts/grouped_harness.cu)
# with nvcc directly, without the library's CMake: grouped kernels, the
# engine's host helpers, cuBLASLt baseline and the plain bf16/NK engine GEMM.
# Usage: scripts/grouped_harness.sh OUTDIR [-DWITH_DENSE]
set -euo pipefail
out=${1:?outdir}; shift || true
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin
NV="nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Iinclude -I.deps/include -DFMT_HEADER_ONLY"
CXX="g++ -std=c++20 -O2 -Iinclude -I.deps/include -I/usr/local/cuda/include -DFMT_HEADER_ONLY"
pids=()
for f in src/kernels/grouped_gemm_kernels_{nk,kn}_{plain,swiglu}.cu; do
  $NV -c "$f" -o "$out/$(basename "$f" .cu).o" & pids+=($!)
done
if [[ " $* " == *" -DWITH_DENSE "* ]]; then
  $NV -c src/kernels/gemm_plain_bf16_nk.cu -o "$out/gemm_plain_bf16_nk.o" & pids+=($!)
fi
for f in src/kernels/grouped_gemm.cpp src/kernels/gemm_host.cpp src/kernels/cublaslt_ref.cpp; do
  $CXX -c "$f" -o "$out/$(basename "$f" .cpp).o" & pids+=($!)
done
$NV "$@" -c scripts/grouped_harness.cu -o "$out/harness.o" & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done
$NV -o "$out/grouped_harness" "$out"/*.o -lcuda -lcublasLt
