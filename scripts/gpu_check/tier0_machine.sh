# shellcheck shell=bash
# Tier 0: what the machine is and has. Writes machine.txt (the GPU, driver, CUDA,
# compilers, Python packages, and which expected tools and libraries were found) and
# records one row. Sourced by run.sh after `discover`; the calls that could hang on a
# sick GPU (nvidia-smi, torch's CUDA start) have time boxes of their own.

# found NAME WHERE: one line of the found/missing list.
found() {
  if [ -n "$2" ]; then
    printf '  %-26s %s\n' "$1" "$2"
  else
    printf '  %-26s MISSING\n' "$1"
  fi
}

python_package_version() {
  "$PY" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true
}

first_line() { "$@" 2>&1 | head -n 1; }

machine_report() {
  echo "date (UTC): $(date -u '+%F %T')"
  echo "host: $(uname -srm), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) memory"
  echo "gpu: ${GPU_NAME:-none} (count ${GPU_COUNT}), driver ${DRIVER_VERSION:-none}, compute capability ${CUDA_ARCH}"
  local now then
  now=$(tree_fingerprint) then=$(sed -n 's/^sources: //p' "${KIT}/commit" 2>/dev/null)
  echo "tree: $(head -n 1 "${KIT}/commit" 2>/dev/null || echo unknown) when the kit was prepared" \
    "($(sed -n 2p "${KIT}/commit" 2>/dev/null || echo 'changed files: unknown') then);" \
    "sources ${now}, $([ "$now" = "$then" ] && echo "as prepared" || echo "changed since (${then:-unknown} then)")"
  echo
  echo "tools and libraries (expected ones; MISSING where not found):"
  found nvidia-smi "$(command -v nvidia-smi || true)"
  found nvcc "${NVCC:+${NVCC} ($("$NVCC" --version 2>/dev/null | grep -o 'release [0-9.]*' || true))}"
  found cmake "$(command -v cmake >/dev/null && first_line cmake --version)"
  found ninja "$(command -v ninja >/dev/null && echo "ninja $(ninja --version)")"
  found "c++ compiler" "$(command -v c++ >/dev/null && first_line c++ --version)"
  found "cuBLAS/cuSOLVER" "$([ -n "$CUDA_ROOT" ] && { [ ${#CUDA_LIBRARY_ARGS[@]} -eq 0 ] && echo "toolkit ${CUDA_ROOT}" || echo "pip wheels (${CUDA_LIBRARY_ARGS[*]})"; })"
  found NCCL "${NCCL_ORIGIN:+${NCCL_ORIGIN}: ${NCCL_LIB} ($(grep -hE '^#define NCCL_(MAJOR|MINOR|PATCH) ' "${NCCL_INCLUDE}/nccl.h" 2>/dev/null | awk '{ printf "%s%s", sep, $3; sep = "." }'))}"
  found "cuBLAS in loader's cache" "$(ldconfig -p 2>/dev/null | grep -o 'libcublas\.so\.[0-9]* ' | head -n 1)"
  found compute-sanitizer "$SANITIZER"
  found ncu "$(command -v ncu || true)"
  found "MPI (mpicxx, mpirun)" "${MPICXX:+${MPICXX}, ${MPIRUN}}"
  found python "$(command -v "$PY" >/dev/null && echo "$(command -v "$PY") ($(first_line "$PY" --version))")"
  local package
  for package in torch numpy pybind11 scikit-build-core pytest hypothesis tqdm scikit-learn mpi4py \
    nvidia-nccl-cu13 nvidia-cublas nvidia-cusolver; do
    found "  ${package}" "$(python_package_version "$package")"
  done
  found "  torch sees" "$(timeout 60 "$PY" -c 'import torch; print(f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s)" + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""))' 2>/dev/null || true)"
  echo
  echo "not expected there (the kit brings them); seen anyway:"
  found "  Eigen3" "$(first_existing /usr/include/eigen3/Eigen/Dense /usr/local/include/eigen3/Eigen/Dense || true)"
  found "  GoogleTest" "$(first_existing /usr/include/gtest/gtest.h /usr/local/include/gtest/gtest.h || true)"
  found "  Google Benchmark" "$(first_existing /usr/include/benchmark/benchmark.h /usr/local/include/benchmark/benchmark.h || true)"
  found "  CLI11" "$(first_existing /usr/include/CLI/CLI.hpp /usr/local/include/CLI/CLI.hpp || true)"
  echo
  if [ "$GPU_COUNT" -gt 0 ]; then
    echo "nvidia-smi:"
    timeout 30 nvidia-smi 2>&1
    timeout 30 nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,pstate --format=csv 2>&1
  fi
}

tier0() {
  local start=$SECONDS rc=0
  machine_report >"${LOGS}/machine.txt" 2>&1 || rc=$?
  cat "${LOGS}/machine.txt"
  local note="no GPU"
  [ "$GPU_COUNT" -gt 0 ] && note="${GPU_NAME}, driver ${DRIVER_VERSION}"
  [ -z "$NVCC" ] && note="${note}; no nvcc"
  record 0 "machine and tools" "$(status_of "$rc")" - - - $((SECONDS - start)) "$note"
}
