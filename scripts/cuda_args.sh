# shellcheck shell=bash
# Sourced by scripts/test.sh and scripts/build.sh: the CUDA backend is compiled and
# linked wherever nvcc is (its tests skip without a GPU, and fail instead with
# OPTEX_REQUIRE_GPU=1). Sets the array `cuda` to the CMake arguments that say so.
cuda=(-DOPTEX_WITH_CUDA=OFF)
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -n "$nvcc" ]; then
  cuda=(-DOPTEX_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc")
else
  echo "note: no nvcc found, the CUDA backend is not built"
fi
