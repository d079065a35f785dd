#!/usr/bin/env bash
# expect_output.sh REGEX... [--absent REGEX...] -- COMMAND...: runs COMMAND and
# passes when it exits 0, its output (stdout and stderr) matches every REGEX
# (grep -E) and no --absent REGEX. For the examples' command lines: a --help
# that must show the defaults and must not run the program (ctest's
# PASS_REGULAR_EXPRESSION alone would ignore the exit status).
set -u
present=()
absent=()
list=present
while [[ $# -gt 0 && $1 != "--" ]]; do
  if [[ $1 == "--absent" ]]; then
    list=absent
  elif [[ $list == present ]]; then
    present+=("$1")
  else
    absent+=("$1")
  fi
  shift
done
shift
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
if [[ $status -ne 0 ]]; then
  echo "expect_output: exit status $status, expected 0" >&2
  exit 1
fi
for regex in "${present[@]}"; do
  if ! grep -Eq -- "$regex" <<<"$output"; then
    echo "expect_output: no line matches '$regex'" >&2
    exit 1
  fi
done
for regex in "${absent[@]}"; do
  if grep -Eq -- "$regex" <<<"$output"; then
    echo "expect_output: a line matches '$regex', which must be absent" >&2
    exit 1
  fi
done
echo "expect_output: exit status 0, every expected line present, none of the absent ones"
