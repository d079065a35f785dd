#!/usr/bin/env bash
# scripts/gpu-check.sh run [--out DIR] [--dry-run]: the GPU check, tiers 0 to 4 (the
# tier*.sh files say what each runs and proves), within 8 minutes on a 16-core GPU
# machine. Every step has a time box and the run a deadline, so a hang costs its box
# and the other tiers still run. The archive of every log and report is refreshed
# after each tier (a run killed from outside still leaves the tiers it finished); the
# summary table comes last on stdout. Exit status 1 if any step failed, timed out or
# could not run.
#
# --dry-run (dry_run.sh passes it): no GPU is expected, GPU tests may skip, the time
# boxes grow with the missing cores (16 / nproc).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${here}/kit_layout.sh"
source "${here}/discover.sh"
source "${here}/steps.sh"
source "${here}/tier0_machine.sh"
source "${here}/tier1_build_and_test.sh"
source "${here}/tier2_sanitizers.sh"
source "${here}/tier3_benchmarks.sh"
source "${here}/tier4_python.sh"

out_dir="${OPTEX_GPU_CHECK_OUT:-${OUT:-${GPU_CHECK_WORK}/out}}"
dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out)
      [ $# -ge 2 ] || { echo "run: --out needs a folder" >&2; exit 2; }
      out_dir="$2"
      shift 2
      ;;
    --dry-run)
      dry_run=1
      shift
      ;;
    *)
      echo "run: unknown argument '$1' (expected --out DIR or --dry-run)" >&2
      exit 2
      ;;
  esac
done

if [ ! -f "$KIT_MANIFEST" ]; then
  echo "run: no kit at ${KIT}: run 'scripts/gpu-check.sh prepare' where there is a network," \
    "and carry ${KIT_CARRY[*]} with the call" >&2
  exit 2
fi
mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"
cd "$GPU_CHECK_ROOT" || exit 2

LOGS="${GPU_CHECK_WORK}/logs"
rm -rf "$LOGS"
mkdir -p "$LOGS"
exec > >(tee -a "${LOGS}/run.log") 2>&1

JOBS=$(nproc)
TIME_SCALE=1
REQUIRE_GPU=(OPTEX_REQUIRE_GPU=1)
if [ $dry_run -eq 1 ]; then
  TIME_SCALE=$(((16 + JOBS - 1) / JOBS))
  REQUIRE_GPU=()
fi
# Seconds on the GPU machine: the whole run, and what each tier is sure to keep.
TOTAL_SECONDS=480
FLOOR_TIER1=150 FLOOR_TIER2=60 FLOOR_TIER3=100 FLOOR_TIER4=80
DEADLINE=$(($(date +%s) + TOTAL_SECONDS * TIME_SCALE))

discover
archive_name="gpu-check-${GPU_SLUG}-$(date -u +%F).tar.gz"
[ $dry_run -eq 1 ] && archive_name="gpu-check-dry-run-$(date -u +%F).tar.gz"

snapshot() {
  "$PY_FOR_RESULTS" "${here}/results.py" summary-md "${LOGS}/summary.tsv" "${LOGS}/machine.txt" \
    >"${LOGS}/summary.md" 2>/dev/null || true
  # run.log grows while it is packed: tar's status 1 ("file changed") is expected.
  local rc=0
  tar -czf "${out_dir}/${archive_name}.tmp" --warning=no-file-changed -C "$GPU_CHECK_WORK" logs || rc=$?
  [ $rc -le 1 ] && mv "${out_dir}/${archive_name}.tmp" "${out_dir}/${archive_name}"
  cp "${LOGS}/summary.md" "${out_dir}/gpu-check-summary.md" 2>/dev/null || true
}

echo "[gpu-check] $([ $dry_run -eq 1 ] && echo "dry run" || echo run): ${JOBS} cores, time boxes x${TIME_SCALE}, deadline in $((TOTAL_SECONDS * TIME_SCALE)) s"
: >"${LOGS}/summary.tsv"
echo "== tier 0: machine"
tier0
snapshot
echo "== tier 1: build, GPU tests"
tier1
snapshot
echo "== tier 2: compute-sanitizer"
tier2
snapshot
echo "== tier 3: bench_cuda"
tier3
snapshot
echo "== tier 4: Python package, torch on CUDA"
tier4
snapshot

echo
echo "archive: ${out_dir}/${archive_name}"
echo "== summary ($(($(date +%s) - DEADLINE + TOTAL_SECONDS * TIME_SCALE)) s)"
"$PY_FOR_RESULTS" "${here}/results.py" summary "${LOGS}/summary.tsv"
if cut -f3 "${LOGS}/summary.tsv" | grep -qxE 'failed|timed out|not run'; then
  exit 1
fi
exit 0
