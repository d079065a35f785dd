# shellcheck shell=bash
# Time-boxed steps and the rows of the summary table, for run.sh and its tiers.
# Sourced; expects LOGS, TIME_SCALE (1 on the GPU machine, more on a slower dry run)
# and DEADLINE (epoch seconds by which the whole run ends).
#
# A step's time box is its cap, cut so that the tiers after it keep their floor
# (seconds each is sure to get): a step that hangs costs its own box and no more, and
# the run as a whole ends by the deadline whatever hangs.

RESULTS_PY="$(dirname "${BASH_SOURCE[0]}")/results.py"

# step_box CAP RESERVE: the seconds a step may take (caps and reserves are
# GPU-machine seconds, scaled by TIME_SCALE); 0 when none are left.
step_box() {
  local cap=$(($1 * TIME_SCALE)) left=$((DEADLINE - $(date +%s) - $2 * TIME_SCALE))
  [ "$left" -lt 0 ] && left=0
  [ "$cap" -lt "$left" ] && echo "$cap" || echo "$left"
}

# boxed SECONDS LOG command...: runs the command for at most SECONDS, its output
# appended to LOG; returns its status, 124 when the box closed on it (the command and
# its children are then ended: TERM, KILL 10 s later).
boxed() {
  local seconds=$1 log=$2
  shift 2
  if [ "$seconds" -le 0 ]; then
    echo "not run: no time left in the run's budget" >>"$log"
    return 124
  fi
  echo "\$ $*" >>"$log"
  timeout --kill-after=10 "$seconds" "$@" >>"$log" 2>&1
}

# record TIER STEP STATUS PASSED FAILED SKIPPED SECONDS NOTE: one row of the summary.
record() {
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"${LOGS}/summary.tsv"
  echo "[gpu-check] tier $1, $2: $3 (passed $4, failed $5, skipped $6, $7 s)${8:+; $8}"
}

# status_of RC [PASSED FAILED SKIPPED]: the row's status from the exit status and, for
# a step that runs tests, their counts: a step in which no test ran has failed.
status_of() {
  local rc=$1
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "timed out"
  elif [ $# -lt 4 ]; then
    [ "$rc" -eq 0 ] && echo "passed" || echo "failed"
  elif [ "$rc" -ne 0 ] || [ "$3" -gt 0 ] || [ $(($2 + $3 + $4)) -eq 0 ]; then
    echo "failed"
  elif [ "$2" -eq 0 ]; then
    echo "skipped"
  else
    echo "passed"
  fi
}

# counts KIND FILE...: "passed failed skipped" read from test reports (junit: ctest,
# GoogleTest and pytest XML; gbench: Google Benchmark JSON). A report that is missing
# or unreadable counts as one failure, so that a step cannot pass without its report.
counts() {
  "$PY_FOR_RESULTS" "$RESULTS_PY" counts "$@" 2>>"${LOGS}/results-errors.txt" || echo "0 1 0"
}

# A Python for reading reports: any python3 will do.
PY_FOR_RESULTS="$(command -v python3 || echo python)"
