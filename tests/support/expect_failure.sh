#!/usr/bin/env bash
# expect_failure.sh [--status N] REGEX... -- COMMAND...: runs COMMAND and passes
# when it exits non-zero (exactly N with --status, for refusals whose exit status is
# promised) and its output matches every REGEX. For programs whose failure is the
# behaviour under test; expect_output.sh does the checking.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ ${1:-} == "--status" ]]; then
  [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "expect_failure: --status needs a non-zero status" >&2; exit 1; }
  exec "$here/expect_output.sh" "$@"
fi
exec "$here/expect_output.sh" --fails "$@"
