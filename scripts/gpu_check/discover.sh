# shellcheck shell=bash
# What this machine has for the GPU check: the GPU, nvcc, cuBLAS/cuSOLVER, NCCL, MPI,
# compute-sanitizer, the Python to test with. Sourced by run.sh; `discover` sets the
# variables below and never fails (what is missing stays empty, and tier 0 says so).
#
#   GPU_COUNT GPU_NAME GPU_SLUG DRIVER_VERSION   from nvidia-smi (GPU_COUNT=0 without one)
#   CUDA_ARCH            the first GPU's compute capability as CMake spells it (90), else
#                        $OPTEX_GPU_CHECK_CUDA_ARCH, else 90 (H100/H200)
#   NVCC CUDA_ROOT       the compiler and the toolkit around it
#   CUDA_LIBRARY_ARGS    CMake arguments pointing at cuBLAS/cuSOLVER in the pip wheels
#                        when the toolkit lacks them (empty otherwise)
#   NCCL_INCLUDE NCCL_LIB NCCL_ORIGIN   NCCL's header and library; origin system|wheel|
#                        (empty: none); $OPTEX_GPU_CHECK_NCCL=wheel prefers the wheel
#   MPICXX MPIRUN        an MPI compiler wrapper and launcher, if any
#   SANITIZER            compute-sanitizer, if any
#   PY                   the Python with torch ($OPTEX_GPU_CHECK_PYTHON, else python3)
#   GENERATOR            Ninja where ninja is, else Unix Makefiles

first_existing() {
  local p
  for p in "$@"; do
    if [ -n "$p" ] && [ -e "$p" ]; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# site-packages folders of $PY, one a line.
python_site_dirs() {
  "$PY" -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path[1:]))' 2>/dev/null |
    awk 'NF && !seen[$0]++'
}

# The first file matching a name pattern under the nvidia/ folder of any site-packages.
wheel_file() {
  local dir
  while read -r dir; do
    [ -d "${dir}/nvidia" ] || continue
    find "${dir}/nvidia" -name "$1" \( -type f -o -type l \) 2>/dev/null | sort | head -n 1
  done < <(python_site_dirs) | head -n 1
}

nccl_from_system() {
  local header lib root="${CUDA_ROOT:-/nonexistent}"
  header=$(first_existing "${root}/include/nccl.h" /usr/include/nccl.h /usr/local/include/nccl.h) || return 1
  lib=$(first_existing "${root}/lib64/libnccl.so" "${root}/lib/libnccl.so" /usr/lib/*/libnccl.so \
    /usr/local/lib64/libnccl.so /usr/local/lib/libnccl.so) || return 1
  NCCL_INCLUDE="$(dirname "$header")" NCCL_LIB="$lib" NCCL_ORIGIN=system
}

nccl_from_wheel() {
  local header lib
  header=$(wheel_file nccl.h)
  lib=$(wheel_file 'libnccl.so*')
  [ -n "$header" ] && [ -n "$lib" ] || return 1
  NCCL_INCLUDE="$(dirname "$header")" NCCL_LIB="$lib" NCCL_ORIGIN=wheel
}

discover() {
  PY="${OPTEX_GPU_CHECK_PYTHON:-python3}"
  GENERATOR="Unix Makefiles"
  command -v ninja >/dev/null && GENERATOR="Ninja"

  GPU_COUNT=0 GPU_NAME="" GPU_SLUG="no-gpu" DRIVER_VERSION=""
  if command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi -L >/dev/null 2>&1; then
    GPU_COUNT=$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    GPU_NAME=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
    DRIVER_VERSION=$(timeout 20 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    GPU_SLUG=$(echo "$GPU_NAME" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '-' | sed 's/^-//; s/-$//')
  fi
  CUDA_ARCH="${OPTEX_GPU_CHECK_CUDA_ARCH:-90}"
  if [ "$GPU_COUNT" -gt 0 ]; then
    local cap
    cap=$(timeout 20 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
    [[ "$cap" =~ ^[0-9]+$ ]] && CUDA_ARCH="$cap"
  fi

  NVCC=$(command -v nvcc || first_existing /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc || true)
  [ -z "$NVCC" ] && NVCC=$(wheel_file nvcc || true)
  CUDA_ROOT=""
  [ -n "$NVCC" ] && CUDA_ROOT="$(cd "$(dirname "$(readlink -f "$NVCC")")/.." && pwd)"

  # cuBLAS and cuSOLVER: the toolkit's, else the wheels' (their headers too).
  CUDA_LIBRARY_ARGS=()
  local lib
  if [ -n "$CUDA_ROOT" ] && ! first_existing "$CUDA_ROOT"/lib64/libcublas.so "$CUDA_ROOT"/lib/libcublas.so \
    "$CUDA_ROOT"/targets/*/lib/libcublas.so >/dev/null; then
    local include_dirs=()
    for lib in cublas cublasLt cusolver; do
      local found
      found=$(wheel_file "lib${lib}.so*" || true)
      if [ -n "$found" ]; then
        CUDA_LIBRARY_ARGS+=("-DCUDA_${lib}_LIBRARY=${found}")
        include_dirs+=("$(dirname "$(dirname "$found")")/include")
      fi
    done
    if [ ${#include_dirs[@]} -gt 0 ]; then
      local flags
      flags=$(printf -- '-I%s ' "${include_dirs[@]}" | sed 's/ $//')
      CUDA_LIBRARY_ARGS+=("-DCMAKE_CXX_FLAGS=${flags}" "-DCMAKE_CUDA_FLAGS=${flags}")
    fi
  fi

  # NCCL: beside the toolkit or the system's, else the wheel's (nvidia-nccl-cu13).
  NCCL_INCLUDE="" NCCL_LIB="" NCCL_ORIGIN=""
  if [ "${OPTEX_GPU_CHECK_NCCL:-}" = wheel ]; then
    nccl_from_wheel || nccl_from_system || true
  else
    nccl_from_system || nccl_from_wheel || true
  fi

  MPICXX=$(command -v mpicxx || true)
  MPIRUN=$(command -v mpirun || command -v mpiexec || true)
  SANITIZER=$(command -v compute-sanitizer || first_existing "${CUDA_ROOT:-/nonexistent}/bin/compute-sanitizer" \
    "${CUDA_ROOT:-/nonexistent}/compute-sanitizer/compute-sanitizer" || true)
}
