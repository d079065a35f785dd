#!/usr/bin/env bash
# One command builds everything: installs the dependencies (scripts/install-deps.sh,
# as scripts/test.sh and scripts/demo.sh do), configures one Release build directory
# with the tools, examples, benchmarks and tests ON, warnings as errors, and builds
# it with every core. Run scripts/build.sh --help for the flags.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<USAGE
Usage: scripts/build.sh [--build-dir DIR] [--jobs N] [--help]

Builds everything optex has in one build directory: the library, the tools
(optex-plan), the examples (optex_quickstart, optex_demo, optex_distributed), the
benchmarks (optex-bench, ...) and the test suite; the CUDA backend where nvcc is
found (as scripts/test.sh decides), the MPI communicator and optex_distributed
where MPI is found, NCCL where CUDA and NCCL are, and the Python module where
pybind11 (>= 2.11) is found (otherwise scripts/test.sh builds it with pip). It
installs the missing Debian/Ubuntu packages first (scripts/install-deps.sh, may
ask for sudo). Then run the tests with: ctest --test-dir DIR --output-on-failure

  --build-dir DIR  the build directory (default: build, or \$BUILD_DIR; the
                   directory scripts/test.sh and scripts/demo.sh use); an
                   existing one is reconfigured and built incrementally
  --jobs N         parallel compile jobs (default: every core, $(nproc) here, or \$JOBS)
  --help           this help; builds nothing

A clean build compiles for a while: measured on a 2-core VM, about 8 minutes for
the library and the demo alone, more for the whole tree (tests and benchmarks).
USAGE
}

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
while [ $# -gt 0 ]; do
  case $1 in
    --help | -h) usage; exit 0 ;;
    --build-dir) [ $# -ge 2 ] || { echo "build.sh: --build-dir needs a directory" >&2; exit 2; }
      build_dir=$2; shift 2 ;;
    --jobs | -j) [ $# -ge 2 ] || { echo "build.sh: --jobs needs a number" >&2; exit 2; }
      jobs=$2; shift 2 ;;
    *) echo "build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "build.sh: --jobs: must be a positive integer, got '$jobs'" >&2; exit 2; }

start=$SECONDS
bash scripts/install-deps.sh

# The CUDA backend wherever nvcc is (as scripts/test.sh). MPI, NCCL and Python follow
# what CMake finds (CMakeLists.txt).
source scripts/cuda_args.sh

cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DOPTEX_WARNINGS_AS_ERRORS=ON \
  -DOPTEX_BUILD_TOOLS=ON -DOPTEX_BUILD_EXAMPLES=ON -DOPTEX_BUILD_BENCHMARKS=ON \
  -DOPTEX_BUILD_TESTS=ON "${cuda[@]}" | grep -E "^-- optex" || true
cmake --build "$build_dir" -j"$jobs"
echo "build.sh: built everything in $build_dir in $((SECONDS - start)) s;" \
  "tests: ctest --test-dir $build_dir --output-on-failure"
