#!/usr/bin/env bash
# Installs everything and runs every test:
#   1. formatting check (clang-format),
#   2. Release build with warnings as errors, the whole ctest suite (unit tests,
#      the find_package install test with the README quickstart),
#   3. the C++ tests again under AddressSanitizer + UndefinedBehaviorSanitizer
#      (CPU build: the sanitizers do not instrument device code).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)

echo "== clang-format"
git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs -r clang-format --dry-run --Werror

# The CUDA backend is compiled and linked wherever nvcc is (its tests skip
# without a GPU, and fail instead with OPTEX_REQUIRE_GPU=1).
cuda=(-DOPTEX_WITH_CUDA=OFF)
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -n "$nvcc" ]; then
  cuda=(-DOPTEX_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc")
else
  echo "note: no nvcc found, the CUDA backend is not built"
fi

echo "== Release, warnings as errors"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DOPTEX_WARNINGS_AS_ERRORS=ON "${cuda[@]}" >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

echo "== AddressSanitizer + UndefinedBehaviorSanitizer"
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOPTEX_SANITIZE=ON \
  -DOPTEX_WARNINGS_AS_ERRORS=ON -DOPTEX_BUILD_BENCHMARKS=OFF -DOPTEX_BUILD_EXAMPLES=OFF \
  -DOPTEX_WITH_CUDA=OFF -DOPTEX_WITH_NCCL=OFF >/dev/null
cmake --build build-sanitize -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-sanitize --output-on-failure -j"$jobs" -LE install
