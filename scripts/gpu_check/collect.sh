#!/usr/bin/env bash
# scripts/gpu-check.sh collect ARCHIVE [RESULTS]: unpacks the archive of a GPU run into
# RESULTS/gpu-<model>-<date>/ (RESULTS: bench/results; the model and date from the
# archive's name), ready
# to commit: summary.md, machine.txt, the test reports, bench_cuda's JSON and table, the
# torch round cost, and every log. An archive of a dry run is refused: no GPU figure
# may be committed that no GPU measured.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${here}/kit_layout.sh"

if [ $# -lt 1 ] || [ $# -gt 2 ] || [ ! -f "$1" ]; then
  echo "collect: expected the path of one archive (gpu-check-<model>-<date>.tar.gz), then optionally" \
    "the results folder" >&2
  exit 2
fi
results="${2:-${GPU_CHECK_ROOT}/bench/results}"
name="$(basename "$1")"
if [[ ! "$name" =~ ^gpu-check-([a-z0-9-]+)-([0-9]{4}-[0-9]{2}-[0-9]{2})\.tar\.gz$ ]]; then
  echo "collect: '${name}' is not named gpu-check-<model>-<date>.tar.gz" >&2
  exit 2
fi
model="${BASH_REMATCH[1]}" date="${BASH_REMATCH[2]}"
if [ "$model" = "dry-run" ] || [ "$model" = "no-gpu" ]; then
  echo "collect: '${name}' comes from a run without a GPU; nothing to commit" >&2
  exit 2
fi

destination="${results}/gpu-${model}-${date}"
unpacked="$(mktemp -d)"
trap 'rm -rf "$unpacked"' EXIT
if ! tar -xzf "$1" -C "$unpacked" --no-same-owner 2>/dev/null || [ ! -f "${unpacked}/logs/summary.tsv" ]; then
  echo "collect: '${name}' is not a GPU check's archive (a readable tar.gz with logs/summary.tsv)" >&2
  exit 2
fi
# Only plain files and folders under logs/: nothing that points elsewhere.
if [ -n "$(find "$unpacked" ! -type f ! -type d -print -quit)" ] || [ -n "$(find "$unpacked" -mindepth 1 -maxdepth 1 ! -name logs)" ]; then
  echo "collect: '${name}' holds links, special files or more than logs/; refused" >&2
  exit 2
fi
rm -rf "$destination"
mkdir -p "$destination"
cp -a "${unpacked}/logs/." "$destination/"
echo "collect: ${destination#"$GPU_CHECK_ROOT"/}: $(find "$destination" -type f | wc -l) files"
