# shellcheck shell=bash
# Tier 3: bench_cuda as Google Benchmark JSON: the device-to-device copy and one plain
# Adam step (the references, measured in the same binary), the proxy step at
# d in {1e7, 1e8}, T0 in {16, 32, 64}, fp32 and bf16 history, SGD and Adam; the fit at
# T0 in {16, 32, 64} (its cost does not grow with d); the whole round (Engine ask, the
# objective, tell) at the same d, T0 and precisions. Three runs, each with its own JSON
# and time box, so that a slow one leaves the others' numbers whole. bench_cuda.md
# gathers them in one table. Sourced by run.sh after tier 2.

# name;benchmark filter;cap (s)
BENCH_RUNS=(
  "proxy;^BM_(DeviceCopy|PlainAdamStep|ProxyStep)/d:10{7,8}/;120"
  "fit;^BM_Fit/;40"
  "round;^BM_Iteration/d:10{7,8}/;100"
)

tier3() {
  local entry name filter cap start rc json passed failed skipped jsons=() later
  later=${#BENCH_RUNS[@]}
  for entry in "${BENCH_RUNS[@]}"; do
    later=$((later - 1))
    IFS=';' read -r name filter cap <<<"$entry"
    local step="bench_cuda ${name}"
    if [ ! -x "${OPTEX_BUILD}/bench/bench_cuda" ]; then
      record 3 "$step" "not run" - - - 0 "bench_cuda was not built"
      continue
    fi
    start=$SECONDS rc=0
    json="${LOGS}/bench_cuda-${name}.json"
    # Each later run keeps 20 s, tier 4 its floor.
    boxed "$(step_box "$cap" $((FLOOR_TIER4 + 20 * later)))" "${LOGS}/bench_cuda-${name}.log" \
      "${OPTEX_BUILD}/bench/bench_cuda" "--benchmark_filter=${filter}" "--benchmark_out=${json}" \
      --benchmark_out_format=json --benchmark_counters_tabular=true || rc=$?
    read -r passed failed skipped < <(counts gbench "$json")
    # Without a GPU every benchmark skips ("no CUDA device"): that is the dry run's pass.
    [ -f "$json" ] && jsons+=("$json")
    record 3 "$step" "$(status_of $rc "$passed" "$failed" "$skipped")" "$passed" "$failed" "$skipped" \
      $((SECONDS - start)) "$(basename "$json")"
  done
  if [ ${#jsons[@]} -gt 0 ]; then
    "$PY_FOR_RESULTS" "$RESULTS_PY" bench-table "${jsons[@]}" >"${LOGS}/bench_cuda.md" 2>>"${LOGS}/results-errors.txt" || true
  fi
}
