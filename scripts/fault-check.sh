#!/usr/bin/env bash
# Fault injection: a rank killed or stopped inside each strategy
# of each operator, the same without load/store reach, a corrupted tuning
# cache, and a wrong NCCL library. Needs >= 2 GPUs; with fewer it says so and
# runs nothing. Prints (and writes to $OUT/faults.txt) a table
#   fault | result | detected in | message
# where "detected in" is the time from the fault to the survivor's error, and
# checks after every case that no process of the job is left running (a
# leftover is listed, then killed by its pid).
#
#   scripts/fault-check.sh            (after a build: BUILD, default build-dev)
#   scripts/device-check.sh build faults
# FAULT_FILTER (a bash regex) runs only the cases whose name matches.
# FAULT_TIMEOUT_MS (default 5000) becomes TESSERA_WAIT_TIMEOUT_MS; a case
# that takes longer than CASE_LIMIT_S (default 60) counts as a hang.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
build="${BUILD:-$root/build-dev}"
mkdir -p "$out"
bin="$build/bin/tessera"
probe="$build/bin/tessera_fault_probe"
table="$out/faults.txt"
log="$out/faults.log"
: >"$log"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CUDA_MODULE_LOADING=EAGER
# Connections made at start-up, not lazily inside an enqueue behind a dead peer.
export NCCL_RUNTIME_CONNECT=0
# The survivors ignore the launcher's SIGTERM (fault_probe.cpp), so the
# grace before its SIGKILL must exceed the time they need to detect the fault.
export TESSERA_WAIT_TIMEOUT_MS="${FAULT_TIMEOUT_MS:-5000}" TESSERA_BOOTSTRAP_TIMEOUT_MS=30000
export TESSERA_RUN_GRACE_MS=$(( ${FAULT_TIMEOUT_MS:-5000} * 3 + 5000 ))
limit="${CASE_LIMIT_S:-60}"

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${ngpu:-0}" -lt 2 ]; then
  echo "fault-check: needs 2 GPUs, found ${ngpu:-0}: NOT RUN" | tee "$table"
  exit 0
fi
for f in "$bin" "$probe"; do
  [ -x "$f" ] || { echo "fault-check: $f missing (build first)" | tee "$table"; exit 1; }
done
n="${FAULT_RANKS:-2}"

printf "%-44s | %-8s | %-11s | %s\n" "fault" "result" "detected in" "message" | tee "$table"
printf -- "-------------------------------------------------------------------------------------------\n" | tee -a "$table"

# Processes of the probe or of its launcher still alive (by executable path).
leftovers() { pgrep -f -- "$probe" | grep -v "^$$\$" || true; }

row() { printf "%-44s | %-8s | %-11s | %s\n" "$1" "$2" "$3" "$4" | tee -a "$table"; }

# case NAME EXPECT ENV... -- ARGS...   (EXPECT: detect | ok)
run_case() {
  local name="$1" expect="$2"; shift 2
  if [ -n "${FAULT_FILTER:-}" ] && ! [[ "$name" =~ $FAULT_FILTER ]]; then return 0; fi
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local caselog="$out/fault-$(echo "$name" | tr -c 'a-zA-Z0-9_-' '_').log"
  local t0; t0=$(date +%s.%N)
  env "${envs[@]}" timeout -k 5 "$limit" "$bin" run -n "$n" -- "$probe" "$@" >"$caselog" 2>&1
  local rc=$?
  local secs; secs=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t0" "$(date +%s.%N)")
  local took="$secs s"
  # rc 137 is also `tessera run` reporting a rank killed by SIGKILL: a hang is
  # timeout's 124, or a run that lasted the whole limit.
  local hung=0
  { [ "$rc" -eq 124 ] || python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)" "$secs" "$limit"; } && hung=1
  cat "$caselog" >>"$log"
  local detected msg result left
  detected=$(grep -m1 -o "PROBE-DETECTED rank -\?[0-9]* after [0-9]* ms" "$caselog" | grep -o "after [0-9]* ms" | cut -d' ' -f2)
  msg=$(grep -m1 "PROBE-DETECTED" "$caselog" | sed 's/.*PROBE-DETECTED rank -\?[0-9]* after [0-9]* ms in //' | cut -c1-160)
  if [ "$hung" -eq 1 ]; then
    result="HANG"; msg="no result within ${limit} s (rc $rc)"
  elif [ "$expect" = ok ]; then
    if [ "$rc" -eq 0 ] && grep -q "PROBE-OK" "$caselog"; then result="ok"; msg=$(grep -m1 "PROBE-OK" "$caselog" | sed 's/.*PROBE-OK //')
    else result="FAILED"; msg=${msg:-$(grep -m1 -iE "error|differs" "$caselog" | cut -c1-160)}; fi
  elif [ -n "$detected" ]; then
    result="detected"
  elif grep -q "PROBE-OK" "$caselog"; then
    result="no-fault"; msg="ran normally: $(grep -m1 "PROBE-OK" "$caselog" | sed 's/.*PROBE-OK //')"
  else
    result="MISSED"; msg=${msg:-$(grep -m1 -iE "error|differs|tessera run:" "$caselog" | cut -c1-160)}
  fi
  left=$(leftovers)
  if [ -n "$left" ]; then
    result="$result+LEFT"; msg="left running: $(echo $left) | $msg"
    for p in $left; do kill -9 "$p" 2>/dev/null; done
  fi
  if [ -n "$detected" ]; then row "$name" "$result" "$detected ms" "$msg"; else row "$name" "$result" "$took" "$msg"; fi
}

ops_strategies=("ag_gemm sequential" "ag_gemm decomposition" "ag_gemm fused_ce" "ag_gemm fused_sm"
                "gemm_rs sequential" "gemm_rs decomposition" "gemm_rs fused_sm" "gemm_rs fused_ce"
                "gemm_ar sequential" "gemm_ar fused_ce"
                "sp_attention sequential" "sp_attention fused_ce" "sp_attention_causal fused_ce")
[ "$n" -gt 2 ] && ops_strategies+=("gemm_rs ring")

for os in "${ops_strategies[@]}"; do
  set -- $os
  run_case "kill rank 1: $1 $2" detect FAULT=kill FAULT_RANK=1 FAULT_AT=3 -- "$1" "$2"
done
for os in "ag_gemm sequential" "gemm_rs fused_sm" "gemm_ar fused_ce" "sp_attention fused_ce"; do
  set -- $os
  run_case "stall rank 1 (SIGSTOP): $1 $2" detect FAULT=stall FAULT_RANK=1 FAULT_AT=3 -- "$1" "$2"
done

# No load/store reach (and no P2P in NCCL): the NCCL strategy runs, the
# others are refused clearly; a dead peer is still detected.
for op in ag_gemm gemm_rs gemm_ar; do
  run_case "no P2P/LSA: $op auto" ok NCCL_P2P_DISABLE=1 TESSERA_NO_LSA=1 -- "$op" auto 4
  run_case "no P2P/LSA: kill rank 1: $op sequential" detect NCCL_P2P_DISABLE=1 TESSERA_NO_LSA=1 FAULT=kill \
      FAULT_RANK=1 FAULT_AT=2 -- "$op" sequential
done
run_case "no P2P/LSA: fused_sm is refused" detect NCCL_P2P_DISABLE=1 TESSERA_NO_LSA=1 -- ag_gemm fused_sm 2

# A corrupted tuning cache: ignored with a warning and re-tuned, or a clear error.
cache="${TMPDIR:-/tmp}/tessera-fault-cache"
rm -rf "$cache"; mkdir -p "$cache"
printf '{"version": 2, "entries": {"x": {"strategy": "fused_sm"' >"$cache/ops.json"  # truncated JSON
run_case "corrupted cache (truncated JSON)" ok TESSERA_CACHE_DIR="$cache" -- gemm_rs auto 3
python3 -c 'print("[" * 100000)' >"$cache/ops.json"  # deeply nested
run_case "corrupted cache (deeply nested JSON)" ok TESSERA_CACHE_DIR="$cache" -- gemm_rs auto 3

# A wrong NCCL library: every other libnccl.so.2 on the machine, first in the
# loader's path; Tessera must refuse it by version (or it is the same one).
found=0
while IFS= read -r dir; do
  [ "$found" -lt 3 ] || break
  found=$((found + 1))
  run_case "NCCL from $dir" detect LD_LIBRARY_PATH="$dir" -- ag_gemm sequential 2
done < <(find / -xdev -name 'libnccl.so.2*' -not -path "*/proc/*" -printf '%h\n' 2>/dev/null | sort -u)
[ "$found" -gt 0 ] || row "wrong NCCL library" "skipped" "-" "no other libnccl.so.2 on this machine"

echo "table: $table; logs: $out/fault-*.log"
left=$(leftovers)
[ -z "$left" ] && echo "nothing left running" | tee -a "$table" || echo "LEFT RUNNING: $left" | tee -a "$table"
