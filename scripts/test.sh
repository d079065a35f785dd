#!/usr/bin/env bash
# Installs everything and runs every test:
#   1. formatting check (clang-format),
#   2. Release build with warnings as errors, the whole ctest suite (unit tests,
#      the find_package install test with the README quickstart),
#   3. the C++ tests again under AddressSanitizer + UndefinedBehaviorSanitizer
#      (CPU build: the sanitizers do not instrument device code),
#   4. the Python package: `pip install .[test,bench,torch]` into .venv (the wheel
#      build with scikit-build-core; PyTorch from PyPI for optex.torch and for the
#      tests that compare every optimizer with torch.optim; Dask, Ray and mpi4py for
#      optex.minimize on cluster executors, started locally), then pytest, bit for
#      bit against the C++ engine through the reference program built in step 2,
#   5. the GPU check's dry run (scripts/gpu-check.sh): its sequence here, offline,
#      with the system's Eigen, GoogleTest, Benchmark and CLI11 hidden, so that the
#      kit it prepared (.gpu-kit/, which ctest checks in step 2) is all a GPU
#      machine needs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/gpu-check.sh prepare
jobs=$(nproc)

echo "== clang-format"
git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs -r clang-format --dry-run --Werror

source scripts/cuda_args.sh  # the CUDA backend wherever nvcc is

echo "== Release, warnings as errors"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DOPTEX_WARNINGS_AS_ERRORS=ON "${cuda[@]}" >/dev/null
cmake --build build -j"$jobs"
# OPTEX_REQUIRE_GPU_KIT=1: the kit's check (gpu_check_kit) fails rather than skips.
OPTEX_REQUIRE_GPU_KIT=1 ctest --test-dir build --output-on-failure -j"$jobs"

echo "== AddressSanitizer + UndefinedBehaviorSanitizer"
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOPTEX_SANITIZE=ON \
  -DOPTEX_WARNINGS_AS_ERRORS=ON -DOPTEX_BUILD_BENCHMARKS=OFF -DOPTEX_BUILD_EXAMPLES=OFF \
  -DOPTEX_WITH_CUDA=OFF -DOPTEX_WITH_NCCL=OFF >/dev/null
cmake --build build-sanitize -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-sanitize --output-on-failure -j"$jobs" -LE 'install|kit'

echo "== Python package: pip install .[test,bench,torch] into .venv, pytest"
python_start=$SECONDS
# A virtual environment of our own (git-ignored), made again if it is broken.
if ! .venv/bin/python -c "import sys" 2>/dev/null; then
  rm -rf .venv
  python3 -m venv .venv
fi
# The same CUDA choice and warnings policy as the C++ build; an isolated build
# environment, as `pip install .` gives a user.
wheel_cmake=("${cuda[@]/#-D/cmake.define.}")
CMAKE_BUILD_PARALLEL_LEVEL="$jobs" .venv/bin/python -m pip install --quiet \
  "${wheel_cmake[@]/#/--config-settings=}" --config-settings=cmake.define.OPTEX_WARNINGS_AS_ERRORS=ON \
  ".[test,bench,torch]"
# The C++ programs some tests drive: the reference trajectory and optex-bench.
# OPTEX_REQUIRE_TORCH=1: a test skipped for lack of PyTorch fails the run;
# OPTEX_REQUIRE_CLUSTER=1: so does one skipped for lack of Dask, Ray, mpi4py or mpirun.
OPTEX_REQUIRE_TORCH=1 OPTEX_REQUIRE_CLUSTER=1 OPTEX_REFERENCE_TRAJECTORY="$PWD/build/tests/python/optex_reference_trajectory" \
  OPTEX_BENCH="$PWD/build/bench/optex-bench" \
  .venv/bin/python -m pytest tests/python -q -p no:cacheprovider -rs
echo "Python step: $((SECONDS - python_start)) s"

echo "== GPU check: dry run (scripts/gpu-check.sh dry-run)"
dry_run_start=$SECONDS
# The test environment above, with its torch wheels' NCCL: the way a GPU machine's
# PyTorch brings NCCL, and so the link path its run takes.
OPTEX_GPU_CHECK_NCCL=wheel bash scripts/gpu-check.sh dry-run
echo "GPU check dry run: $((SECONDS - dry_run_start)) s"
