# shellcheck shell=bash
# Where the GPU check keeps things, and what its kit (.gpu-kit/) holds. Sourced by
# every gpu_check script; defines paths only.
#
# The kit holds what the build finds with find_package and a GPU machine may lack,
# each piece as an install prefix (so that CMAKE_PREFIX_PATH finds it) or a source
# tree built there in seconds:
#   eigen3/   Eigen's headers and its relocatable CMake package (Eigen3::Eigen)
#   cli11/    CLI11's header and CMake package (CLI11::CLI11)
#   src/googletest/, src/benchmark/
#             GoogleTest 1.12 and Google Benchmark 1.7 sources, Debian's upstream
#             tarballs (apt checks their signatures), built by tier 1 into
#             build-gpu-check/deps with the machine's own compiler
#   MANIFEST  one line a piece (name, version, origin), then the sha256 of every file
#   commit    the commit and the count of changed files the kit was prepared beside

GPU_CHECK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# OPTEX_GPU_CHECK_KIT moves it (the scripts' own tests use a scratch kit).
KIT="${OPTEX_GPU_CHECK_KIT:-${GPU_CHECK_ROOT}/.gpu-kit}"
KIT_EIGEN="${KIT}/eigen3"
KIT_CLI11="${KIT}/cli11"
KIT_GTEST_SRC="${KIT}/src/googletest"
KIT_BENCHMARK_SRC="${KIT}/src/benchmark"
KIT_MANIFEST="${KIT}/MANIFEST"

# What a device call may take along: the tree (tracked and untracked-not-ignored files)
# plus these ignored paths, 64 MiB in all.
KIT_CARRY=(.gpu-kit)
DEVICE_TREE_LIMIT_BYTES=$((64 * 1024 * 1024))

# Every package the project's CMake files look for, and who provides it on a GPU
# machine: "kit" (this folder), "device" (its CUDA toolkit and Python), "optional"
# (used where present). A find_package of a name not listed here fails `check`, so a
# new dependency cannot silently leave the kit incomplete.
declare -A KIT_PROVIDER=(
  [Eigen3]=kit [CLI11]=kit [GTest]=kit [benchmark]=kit
  [CUDAToolkit]=device [NCCL]=device [Python3]=device [Python]=device [pybind11]=device
  [Threads]=device [MPI]=optional [optex]=optional
)

# The check's build and logs (git-ignored: /build*/).
GPU_CHECK_WORK="${OPTEX_GPU_CHECK_WORK:-${GPU_CHECK_ROOT}/build-gpu-check}"

# The bytes of the tree as a device call sends it, without carried paths; needs git.
device_tree_bytes() {
  git -C "$GPU_CHECK_ROOT" ls-files -z --cached --others --exclude-standard |
    (cd "$GPU_CHECK_ROOT" && xargs -0 -r stat -c %s -- 2>/dev/null) |
    awk '{ s += $1 } END { printf "%d\n", s }'
}

# The bytes under the carried paths.
kit_bytes() {
  local total=0 path
  for path in "${KIT_CARRY[@]}"; do
    [ -e "${GPU_CHECK_ROOT}/${path}" ] || continue
    total=$((total + $(find "${GPU_CHECK_ROOT}/${path}" -type f -printf '%s\n' | awk '{ s += $1 } END { printf "%d", s }')))
  done
  echo "$total"
}

# unknown_packages FILE...: the packages that find_package (or find_dependency) names
# in these CMake files and KIT_PROVIDER does not list, one a line.
# cmake_packages FILE...: every package they name, once each.
cmake_packages() {
  grep -hoE 'find_(package|dependency)\([[:space:]]*[A-Za-z0-9_]+' "$@" | sed -E 's/.*\([[:space:]]*//' | sort -u
}

unknown_packages() {
  local package
  cmake_packages "$@" | while read -r package; do
    [ -n "${KIT_PROVIDER[$package]:-}" ] || echo "$package"
  done
}

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# A short hash of the sources as they are now, so that a run can tell whether the
# tree it received is the one the kit was prepared beside (the device's copy has no
# git history to ask).
tree_fingerprint() {
  (cd "$GPU_CHECK_ROOT" && find CMakeLists.txt pyproject.toml cmake cuda include src python tests bench \
    scripts examples tools -type f ! -path '*/__pycache__/*' -print0 2>/dev/null |
    sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
}
