# shellcheck shell=bash
# Tier 2: the fast GPU tests again under compute-sanitizer: memcheck (out-of-bounds and
# misaligned accesses, leaks of device memory, CUDA API errors) on the kernels and on
# whole engine rounds, racecheck (shared-memory hazards) on the kernels. Each run has
# its own time box, so that a slow one still leaves the others their turn. Sourced by
# run.sh after tier 1.

# tool;executable;gtest filter;cap (s): fast suites, chosen so that all six fit.
SANITIZER_RUNS=(
  "memcheck;test_cuda_kernels;*;60"
  "memcheck;test_cuda_primitives;*;60"
  "memcheck;test_engine_invariants;*/cuda*;80"
  "memcheck;test_verified_mode;*/cuda*;60"
  "memcheck;test_cuda;Cuda.EstimatorMatchesTheCpuOnTheSameHistory:Cuda.NonFiniteCommitMatchesTheCpu:Cuda.ProxyModesMatchTheCpu;90"
  "racecheck;test_cuda_kernels;*;60"
)

tier2() {
  local entry tool executable filter cap start rc log xml errors passed failed skipped note later
  later=${#SANITIZER_RUNS[@]}
  for entry in "${SANITIZER_RUNS[@]}"; do
    later=$((later - 1))
    IFS=';' read -r tool executable filter cap <<<"$entry"
    local step="${tool}: ${executable}"
    if [[ "$filter" == *:* ]]; then
      step="${step} ($(($(tr -cd ':' <<<"$filter" | wc -c) + 1)) tests)"
    elif [ "$filter" != "*" ]; then
      step="${step} ${filter}"
    fi
    if [ "$GPU_COUNT" -eq 0 ]; then
      record 2 "$step" "skipped" - - - 0 "no GPU"
      continue
    fi
    if [ -z "$SANITIZER" ]; then
      record 2 "$step" "not run" - - - 0 "no compute-sanitizer"
      continue
    fi
    if [ ! -x "${OPTEX_BUILD}/tests/${executable}" ]; then
      record 2 "$step" "not run" - - - 0 "${executable} was not built"
      continue
    fi
    start=$SECONDS rc=0
    log="${LOGS}/sanitizer-${tool}-${executable}.log"
    xml="${LOGS}/sanitizer-${tool}-${executable}.xml"
    local options=(--tool "$tool" --error-exitcode 86 --print-limit 50)
    [ "$tool" = memcheck ] && options+=(--leak-check full)
    # Each later run keeps 20 s, the later tiers their floors.
    boxed "$(step_box "$cap" $((FLOOR_TIER3 + FLOOR_TIER4 + 20 * later)))" "$log" env "${REQUIRE_GPU[@]}" \
      "$SANITIZER" "${options[@]}" "${OPTEX_BUILD}/tests/${executable}" "--gtest_filter=${filter}" \
      "--gtest_output=xml:${xml}" || rc=$?
    read -r passed failed skipped < <(counts junit "$xml")
    errors=$("$PY_FOR_RESULTS" "$RESULTS_PY" sanitizer-errors "$log" 2>/dev/null || echo "no")
    note="${errors} sanitizer errors; $(basename "$log")"
    record 2 "$step" "$(status_of $rc "$passed" "$failed" "$skipped")" "$passed" "$failed" "$skipped" \
      $((SECONDS - start)) "$note"
  done
}
