#!/usr/bin/env bash
# expect_failure.sh REGEX... -- COMMAND...: runs COMMAND and passes when it
# exits non-zero and its output (stdout and stderr) matches every REGEX
# (grep -E). For programs whose failure is the behaviour under test.
set -u
regexes=()
while [[ $# -gt 0 && $1 != "--" ]]; do regexes+=("$1"); shift; done
shift
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
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
