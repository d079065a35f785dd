#!/usr/bin/env bash
# expect_exit_status.sh STATUS REGEX... -- COMMAND...: runs COMMAND and passes
# when it exits with STATUS and its output (stdout and stderr) matches every
# REGEX (grep -E). For command-line refusals whose exit status is promised.
set -u
expected=$1
shift
regexes=()
while [[ $# -gt 0 && $1 != "--" ]]; do regexes+=("$1"); shift; done
shift
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
if [[ $status -ne $expected ]]; then
  echo "expect_exit_status: exit status $status, expected $expected" >&2
  exit 1
fi
for regex in "${regexes[@]}"; do
  if ! grep -Eq -- "$regex" <<<"$output"; then
    echo "expect_exit_status: no line matches '$regex'" >&2
    exit 1
  fi
done
echo "expect_exit_status: exit status $status, every expected line present"
