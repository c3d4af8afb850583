#!/usr/bin/env bash
# Builds Tessera on a lent GPU machine and runs every GPU test and benchmark
# in one call, leaving logs under $OUT (default ./device-out).
#
#   scripts/device-check.sh [step...]     steps: build cpu tests sanitize moe moeep attention ringattn comm gemm
#                                          gemmgap mlp mlprandom asynctp commir commirattn commirtune kernels signal
#                                          python decoder graph
#                                          readme faults
#                                          (default: build tests comm gemm), run in the order given
# sanitize: compute-sanitizer memcheck, racecheck and synccheck over every
# one-process GPU test (SANITIZE_TESTS: a ctest -R filter; SANITIZE_EXCLUDE: a
# ctest -E filter, by default the test whose kernel traps on purpose, which
# memcheck counts as an error; SANITIZE_TOOLS, SANITIZE_TIMEOUT per run,
# SANITIZE_JOBS runs at once; SANITIZE_SPLIT: a regex of ctest names run as
# one job per gtest case, by default kernels_gemm, whose sweeps are slow
# under synccheck).
# TESTS_ARGS adds ctest options to the tests step (e.g. -E kernels_).
# BUILD_TARGETS limits the build step to those ninja targets.
# CUDA_VISIBLE_DEVICES=0,1 runs every multi-GPU step at R = 2 on a larger machine.
# Clocks, power and throttle reasons are sampled throughout (clocks.csv) and
# summarised per step at the end of summary.txt (scripts/clock-summary.py).
# MLP_SHAPES (default 1,2,3,4,5,6) picks the MLP shapes for mlp / asynctp;
# ASYNCTP_SHAPES overrides it for asynctp. MLP_ARGS, ASYNCTP_ARGS, SIGNAL_ARGS, KERNELS_ARGS, COMMIR_ARGS, GEMM_ARGS
# add options to those benchmarks (e.g. MLP_ARGS=--no-variants; MLP_RANDOM_ARGS to mlprandom's, e.g.
# --automatic-late); MOE_ARGS to bench moe in moe / moeep
# (e.g. MOE_ARGS="--queued-us 300"). attention: ATTN_SEQS (16384,32768,65536),
# ATTN_CASES (all six), ATTN_ARGS / ATTN_TORCH_ARGS (options of the bench / the PyTorch script), ATTN_TIMEOUT
# (300 s for each half). ringattn: bench ring-attention (ring, Ulysses, two-level and AG-KV); RING_ARGS,
# RING_TIMEOUT (300 s). commirattn: bench commir --attention (COMMIR_ATTN_ARGS, e.g. --seq 32768;
# COMMIR_ATTN_TIMEOUT, 300 s). commirtune: bench commir-tuner (COMMIR_TUNER_ARGS, COMMIR_TUNER_TIMEOUT 240 s).
# TRACE_STEPS=moe,decoder records those steps' GPU timelines (CUPTI, tools/kernel_trace) and writes
# trace-<step>.md (scripts/trace_summary.py; TRACE_SUMMARY_ARGS adds its options) and trace-<step>.tgz.
#
# DEVICE_BUILD_DIR (default build-dev) puts the build elsewhere, e.g. outside a
# carried tree, so that the next call on the warm machine reuses it.
# Carry .deps (scripts/vendor-deps.sh): the GPU machines cannot install
# packages. Multi-GPU tests run with one process per visible GPU.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CUDA_MODULE_LOADING=EAGER
export PATH="$PATH:/usr/local/cuda/bin"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(build tests comm gemm)

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
# CUDA_VISIBLE_DEVICES=0,1 on a machine of 4 runs the R = 2 steps there.
[ -n "${CUDA_VISIBLE_DEVICES:-}" ] && ngpu=$(awk -F, '{print NF}' <<<"$CUDA_VISIBLE_DEVICES")
jobs=$(nproc 2>/dev/null || echo 16)
build="${DEVICE_BUILD_DIR:-$root/build-dev}"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
# The tree sent to a lent machine may be newer than the .git beside it:
# tracked files that differ from HEAD mark the commit "-dirty" (then pass
# TESSERA_COMMIT=<sha> for the figures' provenance).
commit="${TESSERA_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null)}"
if [ -z "${TESSERA_COMMIT:-}" ] && [ -n "$commit" ] && ! git -C "$root" diff --quiet HEAD -- 2>/dev/null; then
  commit="$commit-dirty"
fi
note "device-check $(date -u +%FT%TZ) commit $commit gpus=$ngpu"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv >>"$summary" 2>&1
[ "$ngpu" -gt 1 ] && nvidia-smi topo -m >>"$summary" 2>&1

bin="$build/bin/tessera"

step_build() {
  t0=$(date +%s)
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_TEST_RANKS="$ngpu" -DTESSERA_GPU_TEST_TIMEOUT="${TESSERA_GPU_TEST_TIMEOUT:-90}" \
      >"$out/configure.log" 2>&1 || { note "configure FAILED"; tail -40 "$out/configure.log"; exit 1; }
  grep -E "tessera: using NCCL|fmt header-only" "$out/configure.log" | tee -a "$summary"
  # Keep going past a failing target so one broken test does not hide the rest.
  # BUILD_TARGETS (e.g. "tessera kernels_gemm_gpu_test") builds only those.
  if ninja -C "$build" -j"$jobs" -k 0 ${BUILD_TARGETS:-} >"$out/build.log" 2>&1; then
    note "build ok in $(( $(date +%s) - t0 )) s"
  else
    note "build FAILED in $(( $(date +%s) - t0 )) s:"; grep -E "^FAILED" "$out/build.log" | tee -a "$summary"
    grep -E "error" "$out/build.log" | head -20
  fi
}

step_cpu() {
  (cd "$build" && ctest -LE gpu --output-on-failure -j16 >"$out/cpu-tests.log" 2>&1)
  note "cpu tests: $(grep -E 'tests passed|tests failed' "$out/cpu-tests.log")"
}

step_tests() {
  (cd "$build" && timeout "${TESTS_TIMEOUT:-500}" ctest -L gpu ${TESTS_ARGS:-} --output-on-failure >"$out/gpu-tests.log" 2>&1)
  note "gpu tests: $(grep -E 'tests passed|tests failed' "$out/gpu-tests.log")"
  grep -E "^\s*[0-9]+/[0-9]+ Test" "$out/gpu-tests.log" | tee -a "$summary"
}

step_sanitize() {
  # The one-process GPU tests, as ctest runs them (multi-rank tests start
  # through `tessera run` and are left to the tests step), under each tool;
  # SANITIZE_JOBS runs at once (they share the GPU; the tools are CPU-bound).
  (cd "$build" && ctest -L gpu ${SANITIZE_TESTS:+-R "$SANITIZE_TESTS"} -E "${SANITIZE_EXCLUDE:-^test_wait_timeout_gpu$}" \
      --show-only=json-v1 2>"$out/sanitize-ctest.err") | python3 -c '
import json, re, subprocess, sys
tools, split = sys.argv[1].split(), re.compile(sys.argv[2])
def cases(cmd):
    """The gtest cases of a test binary (--gtest_list_tests), death tests left out."""
    try:
        out = subprocess.run(cmd + ["--gtest_list_tests"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:  # the whole binary as one job instead
        print(f"sanitize: cannot list the cases of {cmd[0]}: {e}", file=sys.stderr)
        return []
    suite, names = "", []
    for line in out.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            first = line.split()[0]
            suite = first if first.endswith(".") else ""  # not a suite: e.g. "Running main() ..."
        elif suite:
            names.append(suite + line.split()[0])
    return [n for n in names if "DeathTest" not in n]
for t in json.load(sys.stdin)["tests"]:
    cmd = t.get("command") or []
    if not cmd or any(c.endswith("/tessera") for c in cmd[:1]):
        continue
    # Death tests trap on purpose (and fork): never under a sanitizer.
    runs = [(t["name"], "-*DeathTest*")]
    if split.search(t["name"]):
        runs = [(t["name"] + "." + c, c) for c in cases(cmd)] or runs
    for name, filt in runs:
        for tool in tools:
            print(name + "\t" + tool + "\t" + filt + "\t" + " ".join(cmd))' \
      "${SANITIZE_TOOLS:-memcheck racecheck synccheck}" "${SANITIZE_SPLIT:-^kernels_gemm\$}" >"$out/sanitize-runs.txt"
  # API errors are not reported: NCCL probes kernels of other architectures
  # at init and frees memory it may not own at destroy, which memcheck would
  # count; CUDA errors of our own calls are checked by the tests themselves.
  # One line per run: name tool rc summary (rc 124: timed out, not clean).
  [ -s "$out/sanitize-runs.txt" ] || { note "sanitize: no tests selected (sanitize-ctest.err)"; return; }
  export SANITIZE_TIMEOUT="${SANITIZE_TIMEOUT:-300}" out
  xargs -r -P "${SANITIZE_JOBS:-1}" -d '\n' -n 1 bash -c '
    IFS=$'"'"'\t'"'"' read -r name tool filt cmd <<<"$1"
    log="$out/sanitize-${name//\//_}-$tool.log"  # parameterized gtest names hold slashes
    # Every report is printed (--print-limit 0): racecheck reports are classified below.
    timeout "$SANITIZE_TIMEOUT" compute-sanitizer --tool "$tool" --error-exitcode 86 --report-api-errors no \
        --print-limit 0 $cmd "--gtest_filter=$filt" >"$log" 2>&1
    rc=$?
    summ=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1)
    # A multi-rank test at one rank skips every case and makes no CUDA call.
    if [ $rc -ne 0 ] && grep -q "terminated before first instrumented API call" "$log" \
        && ! grep -q "^\[       OK \]" "$log" && grep -q "^\[  SKIPPED \]" "$log" && ! grep -q "^\[  FAILED  \]" "$log"; then
      summ="no GPU work at this world size (every case skipped)"; rc=0
    fi
    # Racecheck hazards inside cuBLAS kernels (the references of the tests) are not ours.
    total=$(grep -c "Race reported between" "$log")
    ours=$(grep -E "Race reported between" "$log" | grep -vcE "between [A-Za-z]+ access at (nvjet_|cutlass|sm90_xmma|cublas)")
    if [ "$tool" = racecheck ] && [ $rc -eq 86 ] && [ "$total" -gt 0 ] && [ "$ours" -eq 0 ]; then
      summ="clean in our kernels; $total hazard reports, all in cuBLAS kernels"; rc=0
    fi
    echo "sanitize $name $tool rc=$rc ${summ:-no summary}"' _ <"$out/sanitize-runs.txt" | sort | tee -a "$summary" \
      >"$out/sanitize-results.txt"
  local failed timedout
  failed=$(grep -vc " rc=0 " "$out/sanitize-results.txt")
  timedout=$(grep -c " rc=124 " "$out/sanitize-results.txt")
  (cd "$out" && tar czf sanitize-logs.tgz sanitize-*.log 2>/dev/null && rm -f sanitize-*.log)
  note "sanitize: $(wc -l <"$out/sanitize-results.txt") runs, $failed not clean ($timedout of them timed out)"
}

# The TP MoE layer and the PyTorch sequential layer on the same shapes and routing.
step_moe() {
  if [ "$ngpu" -gt 1 ]; then
    timeout "${MOE_TIMEOUT:-300}" torchrun --nproc-per-node "$ngpu" "$root/scripts/bench_moe_torch.py" \
        --shapes "${MOE_SHAPES:-1,2,3,4,5,6}" >"$out/moe-torch.jsonl" 2>"$out/moe-torch.err"
  else
    timeout "${MOE_TIMEOUT:-300}" python3 "$root/scripts/bench_moe_torch.py" \
        --shapes "${MOE_SHAPES:-1,2,3,4,5,6}" >"$out/moe-torch.jsonl" 2>"$out/moe-torch.err"
  fi
  note "moe torch baseline rc=$?"
  timeout "${MOE_TIMEOUT:-300}" "$bin" run -n "$ngpu" -- "$bin" bench moe --shapes "${MOE_SHAPES:-1,2,3,4,5,6}" \
      --torch-json "$out/moe-torch.jsonl" --json "$out/moe.json" ${MOE_ARGS:-} >"$out/bench-moe.log" 2>&1
  note "bench moe rc=$?"; grep -v "^\[rank [1-9]" "$out/bench-moe.log" | tail -20 | tee -a "$summary"
}

# The EP MoE layer (sequential vs pipelined) and the PyTorch all-to-all layer.
step_moeep() {
  if [ "$ngpu" -gt 1 ]; then
    timeout "${MOE_TIMEOUT:-300}" torchrun --nproc-per-node "$ngpu" "$root/scripts/bench_moe_torch.py" --ep \
        --shapes "${MOE_SHAPES:-1,2,3,4,5,6}" >"$out/moe-ep-torch.jsonl" 2>"$out/moe-ep-torch.err"
  else
    timeout "${MOE_TIMEOUT:-300}" python3 "$root/scripts/bench_moe_torch.py" --ep \
        --shapes "${MOE_SHAPES:-1,2,3,4,5,6}" >"$out/moe-ep-torch.jsonl" 2>"$out/moe-ep-torch.err"
  fi
  note "moe ep torch baseline rc=$?"
  timeout "${MOE_TIMEOUT:-300}" "$bin" run -n "$ngpu" -- "$bin" bench moe --ep --shapes "${MOE_SHAPES:-1,2,3,4,5,6}" \
      --torch-json "$out/moe-ep-torch.jsonl" --json "$out/moe-ep.json" ${MOE_ARGS:-} >"$out/bench-moe-ep.log" 2>&1
  note "bench moe --ep rc=$?"; grep -v "^\[rank [1-9]" "$out/bench-moe-ep.log" | tail -20 | tee -a "$summary"
}

# Sequence-parallel attention: the PyTorch baselines (all-gather + cuDNN SDPA, context_parallel) first, then
# bench sp-attention on the same cases with their figures side by side; sp-attention.json is a bench/results file.
step_attention() {
  local seqs="${ATTN_SEQS:-16384,32768,65536}" cases="${ATTN_CASES:-32h-causal,32h,64h-causal,64h,gqa-causal,gqa}"
  timeout "${ATTN_TIMEOUT:-300}" torchrun --nproc-per-node "$ngpu" "$root/scripts/bench_sp_attention_torch.py" \
      --seqs "$seqs" --cases "$cases" ${ATTN_TORCH_ARGS:-} >"$out/sp-attention-torch.jsonl" 2>"$out/sp-attention-torch.err"
  note "sp-attention torch baselines rc=$?"; tee -a "$summary" <"$out/sp-attention-torch.jsonl"
  TESSERA_COMMIT="${commit:-unknown}" timeout "${ATTN_TIMEOUT:-300}" "$bin" run -n "$ngpu" -- "$bin" bench sp-attention \
      --seqs "$seqs" --cases "$cases" --torch-json "$out/sp-attention-torch.jsonl" --json "$out/sp-attention.json" \
      ${ATTN_ARGS:-} >"$out/bench-sp-attention.log" 2>&1
  note "bench sp-attention rc=$?"; grep -v "^\[rank [1-9]" "$out/bench-sp-attention.log" | tail -30 | tee -a "$summary"
}

# Ring and Ulysses attention beside AG-KV (bench ring-attention); ring-attention.json is a bench/results file.
step_ringattn() {
  TESSERA_COMMIT="${commit:-unknown}" timeout "${RING_TIMEOUT:-300}" "$bin" run -n "$ngpu" -- "$bin" bench ring-attention \
      --json "$out/ring-attention.json" ${RING_ARGS:-} >"$out/bench-ring-attention.log" 2>&1
  note "bench ring-attention rc=$?"; grep -v "^\[rank [1-9]" "$out/bench-ring-attention.log" | tail -45 | tee -a "$summary"
}

step_comm() {
  timeout 300 "$bin" run -n "$ngpu" -- "$bin" bench comm --markdown "$out/comm.md" >"$out/bench-comm.log" 2>&1
  note "bench comm rc=$?"; grep -v "^\[rank [1-9]" "$out/bench-comm.log" | tail -30 | tee -a "$summary"
}

# bench gemm into log $1 with extra options $2...
run_bench_gemm() {
  local log="$1"; shift
  timeout "${GEMM_TIMEOUT:-300}" "$bin" bench gemm "$@" ${GEMM_ARGS:-} >"$out/$log" 2>&1
  note "bench gemm $* rc=$?"; tail -25 "$out/$log" | tee -a "$summary"
}
step_gemm() { run_bench_gemm bench-gemm.log; }
# The same at boost clocks: every run after a drain and GEMM_GAP_MS (5) idle.
step_gemmgap() { run_bench_gemm bench-gemm-gap.log --gap-ms "${GEMM_GAP_MS:-5}"; }

step_mlp() {
  timeout "${MLP_TIMEOUT:-240}" "$bin" run -n "$ngpu" -- "$bin" bench mlp --shapes ${MLP_SHAPES:-1,2,3,4,5,6} ${MLP_ARGS:-} \
      --markdown "$out/mlp.md" >"$out/bench-mlp.log" 2>&1
  note "bench mlp rc=$?"; grep -v "^\[rank [1-9]" "$out/bench-mlp.log" | tail -40 | tee -a "$summary"
}

# bench mlp --random: the operators' automatic choice against sequential on
# drawn shapes (issue 19: never slower). MLP_RANDOM shapes (20), MLP_SEED (1),
# MLP_RANDOM_BUDGET_S (300: no new shape after it; the JSON keeps every finished one).
step_mlprandom() {
  TESSERA_COMMIT="${commit:-unknown}" timeout "${MLP_RANDOM_TIMEOUT:-420}" "$bin" run -n "$ngpu" -- "$bin" bench mlp \
      --random "${MLP_RANDOM:-20}" --seed "${MLP_SEED:-1}" --budget-s "${MLP_RANDOM_BUDGET_S:-300}" \
      --no-variants --no-kernel-only --reps 10 --warmup 3 ${MLP_RANDOM_ARGS:-} \
      --json "$out/mlp-random.json" >"$out/bench-mlp-random.log" 2>&1
  note "bench mlp --random rc=$?"; grep -v "^\[rank [1-9]" "$out/bench-mlp-random.log" | tail -12 | tee -a "$summary"
}

step_asynctp() {
  TESSERA_C_LIB="$build/lib/libtessera_c.so" timeout "${ASYNCTP_TIMEOUT:-120}" torchrun --nproc-per-node "$ngpu" "$root/scripts/bench_async_tp.py" \
      --shapes "${ASYNCTP_SHAPES:-${MLP_SHAPES:-1,2,3,4,5,6}}" ${ASYNCTP_ARGS:-} --markdown "$out/asynctp.md" >"$out/bench-asynctp.log" 2>&1
  note "async-TP rc=$?"; tail -20 "$out/bench-asynctp.log" | tee -a "$summary"
}

# The tessera Python package's GPU tests under torchrun, one process per GPU
# (tests/python/gpu), against this build's libtessera_c; then python -m tessera.env.
step_python() {
  TESSERA_C_LIB="$build/lib/libtessera_c.so" PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" \
    timeout "${PYTHON_TIMEOUT:-300}" torchrun --nproc-per-node "$ngpu" -m pytest "$root/tests/python/gpu" -q -rs \
      -p no:cacheprovider >"$out/python-gpu.log" 2>&1
  note "python gpu tests rc=$?"; grep -E "passed|failed|SKIPPED|Error" "$out/python-gpu.log" | tail -20 | tee -a "$summary"
  TESSERA_C_LIB="$build/lib/libtessera_c.so" PYTHONPATH="$root/python" python3 -m tessera.env >>"$summary" 2>&1
}

# The README's Python example, as written (its first ```python block), under torchrun.
step_readme() {
  awk '/^```python$/{f=1;next} /^```$/{if(f){exit}} f' "$root/README.md" >"$out/readme_example.py"
  TESSERA_C_LIB="$build/lib/libtessera_c.so" PYTHONPATH="$root/python" timeout "${README_TIMEOUT:-180}" \
    torchrun --nproc-per-node "$ngpu" "$out/readme_example.py" >"$out/readme-example.log" 2>&1
  note "README python example rc=$? ($(wc -l <"$out/readme_example.py") lines)"; tail -5 "$out/readme-example.log" | tee -a "$summary"
}

# scripts/bench_graph_capture.py: the TP MLP layer eager and replayed from CUDA graphs (GRAPH_ARGS).
step_graph() {
  TESSERA_C_LIB="$build/lib/libtessera_c.so" PYTHONPATH="$root/python" timeout "${GRAPH_TIMEOUT:-240}" \
    torchrun --nproc-per-node "$ngpu" "$root/scripts/bench_graph_capture.py" ${GRAPH_ARGS:-} \
      >"$out/graph.jsonl" 2>"$out/bench-graph.log"
  note "bench graph capture rc=$?"; grep "^#" "$out/bench-graph.log" | tee -a "$summary"
}

# python/examples/bench_decoder_layer.py: the decoder-layer training step, Tessera vs plain PyTorch TP.
step_decoder() {
  TESSERA_C_LIB="$build/lib/libtessera_c.so" PYTHONPATH="$root/python" timeout "${DECODER_TIMEOUT:-300}" \
    torchrun --nproc-per-node "$ngpu" "$root/python/examples/bench_decoder_layer.py" --json "$out/decoder.json" \
      ${DECODER_ARGS:-} >"$out/bench-decoder.log" 2>&1
  note "bench decoder rc=$?"; tail -8 "$out/bench-decoder.log" | tee -a "$summary"
}

step_commir() {
  timeout "${COMMIR_TIMEOUT:-240}" "$bin" run -n "$ngpu" -- "$bin" bench commir --shapes ${MLP_SHAPES:-1,2,3} ${COMMIR_ARGS:-} \
      --markdown "$out/commir.md" >"$out/bench-commir.log" 2>&1
  note "bench commir rc=$?"; grep -v "^\[rank [1-9]" "$out/bench-commir.log" | tail -20 | tee -a "$summary"
}

# The measured CommIR autotuner (bench commir-tuner): model top-k, calibration, pick vs the best measured.
step_commirtune() {
  TESSERA_COMMIT="${commit:-unknown}" timeout "${COMMIR_TUNER_TIMEOUT:-240}" "$bin" run -n "$ngpu" -- "$bin" bench commir-tuner \
      --json "$out/commir-tuner.json" ${COMMIR_TUNER_ARGS:-} >"$out/bench-commir-tuner.log" 2>&1
  note "bench commir-tuner rc=$?"; grep -v "^\[rank [1-9]" "$out/bench-commir-tuner.log" | tail -40 | tee -a "$summary"
}

step_commirattn() {  # the CommIR attention plans beside ops::sp_attention
  timeout "${COMMIR_ATTN_TIMEOUT:-300}" "$bin" run -n "$ngpu" -- "$bin" bench commir --attention ${COMMIR_ATTN_ARGS:-} \
      --markdown "$out/commir-attention.md" --json "$out/commir-attention.json" >"$out/bench-commir-attention.log" 2>&1
  note "bench commir --attention rc=$?"; grep -v "^\[rank [1-9]" "$out/bench-commir-attention.log" | tail -20 | tee -a "$summary"
}

step_kernels() {
  timeout "${KERNELS_TIMEOUT:-120}" "$bin" bench signal-kernels ${KERNELS_ARGS:-} >"$out/bench-signal-kernels.log" 2>&1
  note "bench signal-kernels rc=$?"; tail -60 "$out/bench-signal-kernels.log" | tee -a "$summary"
}

step_faults() {  # fault injection (scripts/fault-check.sh; needs 2 GPUs)
  OUT="$out" BUILD="$build" timeout "${FAULTS_TIMEOUT:-1500}" "$root/scripts/fault-check.sh" >"$out/faults-run.log" 2>&1
  note "faults rc=$?"; tee -a "$summary" <"$out/faults.txt"
}

step_signal() {
  timeout "${SIGNAL_TIMEOUT:-300}" "$bin" run -n "$ngpu" -- "$bin" bench signal ${SIGNAL_ARGS:-} >"$out/bench-signal.log" 2>&1
  note "bench signal rc=$?"; grep -v "^\[rank [1-9]" "$out/bench-signal.log" | tail -40 | tee -a "$summary"
}

# Clock and power sampler: every 100 ms per GPU, so a figure can be read
# against the clocks it ran at (a power-capped GEMM runs 10-20 % slower).
# scripts/clock-summary.py condenses it per step.
sampler=""
if command -v nvidia-smi >/dev/null; then
  q=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
  nvidia-smi --query-gpu=$q --format=csv,noheader,nounits -lms 100 >"$out/clocks.csv" 2>"$out/clocks.err" &
  sampler=$!
  trap 'kill "$sampler" 2>/dev/null' EXIT
fi
: >"$out/steps.txt"
for s in "${steps[@]}"; do
  declare -F "step_$s" >/dev/null || { note "unknown step '$s' (steps: build cpu tests sanitize moe moeep attention ringattn comm gemm gemmgap mlp mlprandom asynctp commir commirattn commirtune kernels signal python readme decoder graph faults)"; continue; }
  echo "$s start $(date +%s.%N)" >>"$out/steps.txt"
  if [[ ",${TRACE_STEPS:-}," == *",$s,"* ]] && [ -f "$build/lib/libtessera_kernel_trace.so" ]; then
    # The step's GPU timeline (tools/kernel_trace): one trace per process, condensed by trace_summary.py.
    mkdir -p "$out/trace-$s"
    CUDA_INJECTION64_PATH="$build/lib/libtessera_kernel_trace.so" TESSERA_KERNEL_TRACE_DIR="$out/trace-$s" "step_$s"
    python3 "$root/scripts/trace_summary.py" --timeline ${TRACE_SUMMARY_ARGS:-} "$out/trace-$s"/trace-*.json \
        >"$out/trace-$s.md" 2>&1
    note "trace of step $s: trace-$s.md ($(ls "$out/trace-$s" | wc -l) processes)"
    tar czf "$out/trace-$s.tgz" -C "$out" "trace-$s" && rm -rf "$out/trace-$s"
  else
    "step_$s"
  fi
  echo "$s end $(date +%s.%N)" >>"$out/steps.txt"
done
if [ -n "$sampler" ]; then
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
  python3 "$root/scripts/clock-summary.py" "$out/clocks.csv" "$out/steps.txt" 2>&1 | tee -a "$summary"
fi
# The device tool returns at most 8 files: keep the summary and the results
# (*.json, *.md), pack every log into logs.tgz.
(cd "$out" && find . -maxdepth 1 -type f ! -name summary.txt ! -name '*.json' ! -name '*.md' ! -name logs.tgz -printf '%P\n' \
   | tar czf logs.tgz -T - --remove-files 2>/dev/null)
