#!/usr/bin/env bash
# expect_output.sh [--status N | --fails] REGEX... [--absent REGEX...] -- COMMAND...:
# runs COMMAND and passes when it exits with status N (0 unless told; with --fails,
# any non-zero status), its output (stdout and stderr) matches every REGEX (grep -E)
# and no --absent REGEX. ctest's PASS_REGULAR_EXPRESSION alone would ignore the exit
# status: a --help that must not run the program, a refusal whose status is promised.
set -u
expected=0
fails=false
case ${1:-} in
  --status) expected=$2; shift 2 ;;
  --fails) fails=true; shift ;;
esac
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
if $fails; then
  if [[ $status -eq 0 ]]; then
    echo "expect_output: the command succeeded (exit status 0); expected a failure" >&2
    exit 1
  fi
elif [[ $status -ne $expected ]]; then
  echo "expect_output: exit status $status, expected $expected" >&2
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
echo "expect_output: exit status $status, every expected line present, none of the absent ones"
