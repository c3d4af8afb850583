#!/usr/bin/env bash
# scripts/ab-bench.sh — the same benchmarks from two builds in one device
# call, runs alternating, so a change is judged against its base under the
# same clocks and neighbours.
#
#   scripts/ab-bench.sh prepare BASE_REF      (here) source of BASE_REF into .ab-base/
#   scripts/ab-bench.sh build                 (device) build-ab-base/bin/tessera, in the background
#   scripts/ab-bench.sh run [bench...]        (device) benches: gemm mlp signal sp-attention moe
#                                             grouped (default gemm mlp signal)
#   AB_ENV=VAR scripts/ab-bench.sh run [bench...]
#                                             (device) one build, VAR=0 as "base" and VAR=1 as
#                                             "head" (e.g. TESSERA_GEMM_TMA_STORE): no base build
#
# `run` needs build-dev/bin/tessera (scripts/device-check.sh build) and, without AB_ENV, the
# base build (this call's, or on a warm machine an earlier call's). Carry
# .ab-base beside .deps. Each bench runs AB_ROUNDS times
# per build (default 2), base and head alternating, logs under
# $OUT/ab/<bench>-<base|head>-<round>.log; scripts/ab_summary.py turns them
# into a bench/results file (head / base per row, geomean per bench).
# GEMM_AB_ARGS, MLP_AB_ARGS, SIGNAL_AB_ARGS, SP_AB_ARGS, MOE_AB_ARGS, GROUPED_AB_ARGS replace each
# bench's options.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}/ab"  # a folder of its own: device-check packs and removes $OUT's files
base_src="$root/.ab-base"
base_build="$root/build-ab-base"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CUDA_MODULE_LOADING=EAGER

cmd="${1:-}"
shift || true
case "$cmd" in
  prepare)
    ref="${1:?usage: ab-bench.sh prepare BASE_REF}"
    rm -rf "$base_src" && mkdir -p "$base_src"
    git -C "$root" archive --format=tar "$ref" | tar -x -C "$base_src" || exit 1
    git -C "$root" rev-parse --short "$ref" >"$base_src/.ab-commit"
    echo "ab-bench: $(cat "$base_src/.ab-commit") in $base_src (carry .ab-base)"
    ;;
  build)
    [ -d "$base_src" ] || { echo "ab-bench: no $base_src (run prepare here and carry it)"; exit 1; }
    ln -sfn "$root/.deps" "$base_src/.deps"
    mkdir -p "$out"
    # A finished earlier build must not start `run`. The status is also kept
    # in the build folder, which stays on a warm machine, so a later call
    # (a fresh $OUT) can run against this build.
    rm -f "$out/ab-base-build.rc" "$base_build/ab-base-build.rc"
    (cmake -S "$base_src" -B "$base_build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_BUILD_TESTS=OFF \
        >"$out/ab-base-configure.log" 2>&1 &&
      ninja -C "$base_build" -j"$(nproc)" tessera_cli >"$out/ab-base-build.log" 2>&1
     rc=$?
     echo "ab-bench: base build rc=$rc" >"$out/ab-base-build.rc"
     [ -d "$base_build" ] && echo "ab-bench: base build rc=$rc" >"$base_build/ab-base-build.rc") &
    echo "ab-bench: building the base in the background (pid $!)"
    ;;
  run)
    mkdir -p "$out"
    declare -A bins=([base]="$base_build/bin/tessera" [head]="$root/build-dev/bin/tessera")
    declare -A envs=([base]="" [head]="")
    if [ -n "${AB_ENV:-}" ]; then
      # One build, a switch: the process environment tells base from head.
      bins[base]="$root/build-dev/bin/tessera"
      envs[base]="$AB_ENV=0"
      envs[head]="$AB_ENV=1"
      echo "ab-bench: $AB_ENV=0 (base) against $AB_ENV=1 (head), one build"
    else
      # This call's build status, else the one kept in the build folder (a
      # later call on the warm machine, or a `run` given another $OUT than
      # `build`): wait for whichever appears first.
      rcf=""
      w=0
      while [ $w -lt "${AB_BUILD_WAIT_S:-600}" ]; do
        for f in "$out/ab-base-build.rc" "$base_build/ab-base-build.rc"; do
          [ -f "$f" ] && { rcf="$f"; break 2; }
        done
        sleep 2
        w=$((w + 2))
      done
      [ -n "$rcf" ] || { echo "ab-bench: the base build did not finish"; exit 1; }
      cat "$rcf"
      # A failed build may leave an older base binary in place: never time it.
      grep -q "rc=0$" "$rcf" || { echo "ab-bench: the base build failed (ab-base-build.log)"; exit 1; }
      echo "ab-bench: base $(cat "$base_src/.ab-commit" 2>/dev/null || echo unknown) against the working tree"
    fi
    for b in base head; do
      [ -x "${bins[$b]}" ] || { echo "ab-bench: no ${bins[$b]}"; exit 1; }
    done
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    [ "${ngpu:-0}" -ge 1 ] || { echo "ab-bench: no GPU (nvidia-smi -L lists none)"; exit 1; }
    # CUDA_VISIBLE_DEVICES=0,1 on a larger machine runs the multi-GPU benches at R = 2 (as device-check.sh).
    [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && ngpu=$(awk -F, '{print NF}' <<<"$CUDA_VISIBLE_DEVICES")
    benches=("$@")
    [ ${#benches[@]} -gt 0 ] || benches=(gemm mlp signal)
    for bench in "${benches[@]}"; do
      for ((r = 1; r <= ${AB_ROUNDS:-2}; ++r)); do
        order=(base head)
        [ $((r % 2)) -eq 0 ] && order=(head base)
        for b in "${order[@]}"; do
          t="${bins[$b]}"
          # `env` with no assignment runs the command as it is.
          e=(env ${envs[$b]})
          log="$out/$bench-$b-$r.log"
          case "$bench" in
            gemm) "${e[@]}" timeout 120 "$t" bench gemm ${GEMM_AB_ARGS-} >"$log" 2>&1 ;;
            mlp) "${e[@]}" timeout 150 "$t" run -n "$ngpu" -- "$t" bench mlp ${MLP_AB_ARGS---no-variants} >"$log" 2>&1 ;;
            signal) "${e[@]}" timeout 150 "$t" run -n "$ngpu" -- "$t" bench signal ${SIGNAL_AB_ARGS---no-sweep --budget-s 30} \
                >"$log" 2>&1 ;;
            sp-attention) "${e[@]}" timeout 150 "$t" run -n "$ngpu" -- "$t" bench sp-attention \
                ${SP_AB_ARGS---seqs 16384,32768 --cases 32h-causal,32h,64h-causal,gqa-causal} >"$log" 2>&1 ;;
            moe) "${e[@]}" timeout 200 "$t" run -n "$ngpu" -- "$t" bench moe ${MOE_AB_ARGS---routing uniform} >"$log" 2>&1 ;;
            grouped) "${e[@]}" timeout 200 "$t" bench grouped ${GROUPED_AB_ARGS---tp 2 --routing uniform} >"$log" 2>&1 ;;
            *) echo "ab-bench: unknown bench $bench (gemm mlp signal sp-attention moe grouped)"; continue 2 ;;
          esac
          echo "ab-bench: $bench $b round $r rc=$?"
        done
      done
    done
    ;;
  *)
    sed -n '2,18p' "$0"
    exit 2
    ;;
esac
