#!/usr/bin/env bash
# expect_failure.sh [--status N] REGEX... -- COMMAND...: runs COMMAND and
# passes when it exits non-zero (exactly N with --status, for refusals whose
# exit status is promised) and its output (stdout and stderr) matches every
# REGEX (grep -E). For programs whose failure is the behaviour under test.
set -u
expected=""
if [[ ${1:-} == "--status" ]]; then
  expected=$2
  shift 2
fi
regexes=()
while [[ $# -gt 0 && $1 != "--" ]]; do regexes+=("$1"); shift; done
shift
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
if [[ -n $expected && $status -ne $expected ]]; then
  echo "expect_failure: exit status $status, expected $expected" >&2
  exit 1
fi
if [[ $status -eq 0 ]]; then
  echo "expect_failure: the command succeeded (exit status 0); expected a failure" >&2
  exit 1
fi
for regex in "${regexes[@]}"; do
  if ! grep -Eq -- "$regex" <<<"$output"; then
    echo "expect_failure: no line matches '$regex'" >&2
    exit 1
  fi
done
echo "expect_failure: exit status $status, every expected line present"
