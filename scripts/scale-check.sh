#!/usr/bin/env bash
# The scale run: on a machine of 4 or 8 GPUs, builds, runs every
# multi-GPU test with one rank per GPU, then every benchmark at TP = R:
# bench comm, bench mlp (MLP-1..6, sequential and decomposition baselines in
# the same process) with PyTorch async-TP right after in the same call,
# bench commir (the CommIR GPU executor's TP plans) and bench signal.
# Logs under $OUT (scripts/device-check.sh writes them). Carry .deps.
#
# Defaults fit one device call of 10 minutes on nvidia-h200-x4; override the
# knobs of device-check.sh (MLP_SHAPES, SIGNAL_ARGS, ...) to change them.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "$ngpu" -lt 4 ]; then
  echo "scale-check: $ngpu GPU(s) visible; this run needs 4 or 8" >&2
  exit 2
fi
export TESSERA_GPU_TEST_TIMEOUT="${TESSERA_GPU_TEST_TIMEOUT:-120}" TESTS_TIMEOUT="${TESTS_TIMEOUT:-240}"
export MLP_SHAPES="${MLP_SHAPES:-1,2,3,4,5,6}" MLP_ARGS="${MLP_ARGS:---no-variants}" MLP_TIMEOUT="${MLP_TIMEOUT:-200}"
export ASYNCTP_TIMEOUT="${ASYNCTP_TIMEOUT:-120}" COMMIR_TIMEOUT="${COMMIR_TIMEOUT:-120}"
export SIGNAL_ARGS="${SIGNAL_ARGS:---budget-s 100}" SIGNAL_TIMEOUT="${SIGNAL_TIMEOUT:-150}"
# SCALE_STEPS overrides the steps, e.g. "build tests attention moe moeep decoder"
# for the sequence-parallel, MoE and decoder-layer runs.
# shellcheck disable=SC2086
exec "$root/scripts/device-check.sh" ${SCALE_STEPS:-build tests comm mlp asynctp commir signal}
