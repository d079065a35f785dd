#!/usr/bin/env bash
# scripts/gpu-check.sh dry-run: the `run` sequence here, as the GPU machine would run it,
# to prove that the kit is all the build needs. It
#   1. prepares the kit (network) and a Python like the GPU machine's (.venv with torch,
#      numpy, pytest, hypothesis, scikit-learn, tqdm, pybind11, scikit-build-core),
#   2. copies the tree as a device call sends it (tracked and untracked-not-ignored
#      files, plus the carried kit) to build-gpu-check/dry-run/tree,
#   3. runs `run --dry-run` there without network and with this machine's Eigen,
#      GoogleTest, Google Benchmark and CLI11 hidden (isolation.sh; where namespaces are
#      refused, CMake is told to ignore them instead, and the network stays),
#   4. checks that the summary and the archive came back.
# GPU tests skip here; everything else must pass. Extra arguments go to `run`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${here}/kit_layout.sh"
source "${here}/isolation.sh"
cd "$GPU_CHECK_ROOT"

bash "${here}/prepare.sh"

# A Python like the GPU machine's: the test command's virtual environment, completed.
python="${OPTEX_GPU_CHECK_PYTHON:-${GPU_CHECK_ROOT}/.venv/bin/python}"
if ! "$python" -c "import sys" 2>/dev/null; then
  rm -rf .venv
  python3 -m venv .venv
  python="${GPU_CHECK_ROOT}/.venv/bin/python"
fi
if ! "$python" -c "import torch, numpy, pytest, hypothesis, sklearn, tqdm, pybind11, scikit_build_core" 2>/dev/null; then
  "$python" -m pip install --quiet --disable-pip-version-check torch numpy pytest hypothesis \
    scikit-learn tqdm "pybind11>=2.11" "scikit-build-core>=0.8"
fi

dry="${GPU_CHECK_WORK}/dry-run"
tree="${dry}/tree"
out="${dry}/out"
rm -rf "$dry"
mkdir -p "$tree" "$out"
git ls-files -z --cached --others --exclude-standard |
  tar -c -f - --null --no-recursion --ignore-failed-read --files-from=- | tar -xf - -C "$tree"
for path in "${KIT_CARRY[@]}"; do
  cp -a "$path" "${tree}/${path}"
done
echo "dry-run: the tree as a device call sends it, in ${tree#"$GPU_CHECK_ROOT"/}: $(du -sh "$tree" | cut -f1)"

env_for_run=(OPTEX_GPU_CHECK_PYTHON="$python" OPTEX_GPU_CHECK_WORK="${tree}/build-gpu-check"
  OPTEX_GPU_CHECK_OUT="$out")
rc=0
if can_isolate; then
  echo "dry-run: no network; hidden: $(system_dependency_dirs | paste -sd ' ' -)"
  without_system_dependencies --no-network env "${env_for_run[@]}" \
    bash "${tree}/scripts/gpu-check.sh" run --dry-run "$@" || rc=$?
else
  echo "dry-run: namespaces refused here: the network stays, and CMake ignores the system's packages"
  env "${env_for_run[@]}" OPTEX_GPU_CHECK_CMAKE_ARGS="$(system_dependency_cmake_args)" \
    bash "${tree}/scripts/gpu-check.sh" run --dry-run "$@" || rc=$?
fi

archive=$(find "$out" -maxdepth 1 -name 'gpu-check-dry-run-*.tar.gz' | head -n 1)
if [ -z "$archive" ] || [ ! -s "${out}/gpu-check-summary.md" ]; then
  echo "dry-run: the run left no archive or no summary in ${out}" >&2
  exit 1
fi
echo "dry-run: archive ${archive#"$GPU_CHECK_ROOT"/} ($(du -h "$archive" | cut -f1)), status ${rc}"
exit "$rc"
