#!/usr/bin/env bash
# scripts/gpu-check.sh check: the cheap part of the dry run, which ctest runs
# (gpu_check_kit) so that the kit keeps up with the project. It checks that
#   1. the kit is whole: every file matches the checksum its MANIFEST gives;
#   2. every find_package in the project's CMake files names a package the kit, the
#      GPU machine or nobody-needs-it provides (kit_layout.sh, KIT_PROVIDER);
#   3. the tree as a device call sends it, with the kit, fits in 64 MiB;
#   4. optex configures with the kit alone (the system's Eigen and CLI11 hidden or
#      ignored) and finds Eigen and CLI11 there, and the kit's GoogleTest and Google
#      Benchmark sources configure with this CMake.
# Without a kit it exits 77 (ctest: skipped), unless OPTEX_REQUIRE_GPU_KIT=1 (as
# scripts/test.sh sets), where a missing kit is a failure.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${here}/kit_layout.sh"
source "${here}/isolation.sh"
cd "$GPU_CHECK_ROOT"

fail() {
  echo "check: $*" >&2
  exit 1
}

if [ ! -f "$KIT_MANIFEST" ]; then
  if [ "${OPTEX_REQUIRE_GPU_KIT:-0}" != 0 ] && [ -n "${OPTEX_REQUIRE_GPU_KIT:-}" ]; then
    fail "no kit at ${KIT}: run scripts/gpu-check.sh prepare (OPTEX_REQUIRE_GPU_KIT is set)"
  fi
  echo "check: no kit at ${KIT} (scripts/gpu-check.sh prepare makes one); skipped"
  exit 77
fi

# 1. Whole.
(cd "$KIT" && grep -v '^#' MANIFEST | sha256sum --check --quiet --strict) ||
  fail "the kit differs from its MANIFEST: run scripts/gpu-check.sh prepare again"
for file in "${KIT_EIGEN}/share/eigen3/cmake/Eigen3Config.cmake" "${KIT_EIGEN}/include/eigen3/Eigen/Dense" \
  "${KIT_CLI11}/share/cmake/CLI11/CLI11Config.cmake" "${KIT_CLI11}/include/CLI/CLI.hpp" \
  "${KIT_GTEST_SRC}/CMakeLists.txt" "${KIT_GTEST_SRC}/googletest/include/gtest/gtest.h" \
  "${KIT_GTEST_SRC}/googlemock/include/gmock/gmock.h" \
  "${KIT_BENCHMARK_SRC}/CMakeLists.txt" "${KIT_BENCHMARK_SRC}/include/benchmark/benchmark.h"; do
  [ -f "$file" ] || fail "the kit lacks ${file#"$GPU_CHECK_ROOT"/}"
done
echo "check: the kit is whole ($(grep -c -v '^#' "$KIT_MANIFEST") files)"

# 2. Every package the build looks for has a provider on the GPU machine.
mapfile -t cmake_files < <(git ls-files '*CMakeLists.txt' '*.cmake' '*.cmake.in' 2>/dev/null ||
  find . \( -path ./.gpu-kit -o -path './build*' -o -path ./.git \) -prune -o \
    \( -name CMakeLists.txt -o -name '*.cmake' -o -name '*.cmake.in' \) -print)
mapfile -t unknown < <(unknown_packages "${cmake_files[@]}")
if [ ${#unknown[@]} -gt 0 ]; then
  fail "find_package of ${unknown[*]}: no provider on a GPU machine is known. Add each to the kit" \
    "(prepare.sh) or, if the GPU machine has it or the GPU build does not need it, to KIT_PROVIDER" \
    "in scripts/gpu_check/kit_layout.sh"
fi
echo "check: every find_package has a provider ($(cmake_packages "${cmake_files[@]}" | paste -sd ' ' -))"

# 3. The tree with the kit fits in a device call.
if git rev-parse --git-dir >/dev/null 2>&1; then
  tree=$(device_tree_bytes)
  kit=$(kit_bytes)
  [ $((tree + kit)) -le "$DEVICE_TREE_LIMIT_BYTES" ] ||
    fail "the tree ($(mib "$tree")) with the kit ($(mib "$kit")) is over $(mib "$DEVICE_TREE_LIMIT_BYTES")"
  echo "check: tree $(mib "$tree") + kit $(mib "$kit") = $(mib $((tree + kit))) of $(mib "$DEVICE_TREE_LIMIT_BYTES")"
else
  echo "check: not a git checkout, the tree's size is not checked"
fi

# 4. Configures with the kit alone.
work="${GPU_CHECK_WORK}/check"
rm -rf "$work"
mkdir -p "$work"
configure() { # log, cmake arguments...
  local log="$1"
  shift
  if can_isolate; then
    without_system_dependencies cmake "$@" >"$log" 2>&1
  else
    # shellcheck disable=SC2046
    cmake $(system_dependency_cmake_args) "$@" >"$log" 2>&1
  fi
}
configure "${work}/optex.log" -S "$GPU_CHECK_ROOT" -B "${work}/optex" -DOPTEX_WITH_CUDA=OFF \
  -DOPTEX_WITH_PYTHON=OFF -DOPTEX_WITH_MPI=OFF -DOPTEX_BUILD_TESTS=OFF -DOPTEX_BUILD_BENCHMARKS=OFF \
  "-DCMAKE_PREFIX_PATH=${KIT_EIGEN};${KIT_CLI11}" ||
  fail "optex does not configure with the kit alone: ${work}/optex.log says $(tail -n 5 "${work}/optex.log")"
eigen_dir=$(sed -n 's/^Eigen3_DIR:PATH=//p' "${work}/optex/CMakeCache.txt")
cli11_dir=$(sed -n 's/^CLI11_DIR:PATH=//p' "${work}/optex/CMakeCache.txt")
[[ "$eigen_dir" == "$KIT_EIGEN"/* ]] || fail "CMake found Eigen in '${eigen_dir}', not in the kit"
[[ "$cli11_dir" == "$KIT_CLI11"/* ]] || fail "CMake found CLI11 in '${cli11_dir}', not in the kit"
echo "check: optex configures with the kit's Eigen and CLI11"
configure "${work}/googletest.log" -S "$KIT_GTEST_SRC" -B "${work}/googletest" -DBUILD_GMOCK=ON ||
  fail "the kit's GoogleTest does not configure: see ${work}/googletest.log"
configure "${work}/benchmark.log" -S "$KIT_BENCHMARK_SRC" -B "${work}/benchmark" -DBENCHMARK_ENABLE_TESTING=OFF \
  -DCMAKE_DISABLE_FIND_PACKAGE_Git=ON ||
  fail "the kit's Google Benchmark does not configure: see ${work}/benchmark.log"
echo "check: the kit's GoogleTest and Google Benchmark configure"
echo "check: passed"
