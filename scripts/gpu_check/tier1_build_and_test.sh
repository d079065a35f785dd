# shellcheck shell=bash
# Tier 1: GoogleTest and Google Benchmark built from the kit, optex configured for this
# GPU's architecture (NCCL from the system or the wheel, MPI only where there is one),
# only the targets the GPU tests and bench_cuda need built, then `ctest -L gpu` (the
# CUDA suites, the /cuda instances of the device suites and the NCCL world-of-one
# tests) with OPTEX_REQUIRE_GPU=1, and with MPI the NCCL example under mpirun -np 1.
# Sourced by run.sh; starts tier 4's wheel build once the library has built.

OPTEX_BUILD="${GPU_CHECK_WORK}/optex"
DEPS_PREFIX="${GPU_CHECK_WORK}/deps"

# Builds and installs one kit source tree into DEPS_PREFIX: build_dependency NAME ARGS...
build_dependency() {
  local name=$1 log="${LOGS}/deps.log" rc=0
  shift
  boxed "$(step_box 90 "$TIER1_RESERVE")" "$log" env CMAKE_POLICY_VERSION_MINIMUM=3.5 \
    cmake -S "${KIT}/src/${name}" -B "${GPU_CHECK_WORK}/deps-build/${name}" -G "$GENERATOR" \
    -DCMAKE_BUILD_TYPE=Release "-DCMAKE_INSTALL_PREFIX=${DEPS_PREFIX}" \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON "$@" || return $?
  boxed "$(step_box 120 "$TIER1_RESERVE")" "$log" \
    cmake --build "${GPU_CHECK_WORK}/deps-build/${name}" --target install -j "$JOBS" || rc=$?
  return $rc
}

optex_configure_args() {
  local args=(-S "$GPU_CHECK_ROOT" -B "$OPTEX_BUILD" -G "$GENERATOR" -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_PREFIX_PATH=${KIT_EIGEN};${KIT_CLI11};${DEPS_PREFIX}"
    -DOPTEX_WITH_CUDA=ON "-DCMAKE_CUDA_COMPILER=${NVCC}" "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH}"
    -DOPTEX_WITH_PYTHON=OFF -DOPTEX_BUILD_TESTS=ON -DOPTEX_BUILD_BENCHMARKS=ON
    -DOPTEX_WARNINGS_AS_ERRORS=OFF "${CUDA_LIBRARY_ARGS[@]}")
  if [ -n "$NCCL_ORIGIN" ]; then
    args+=(-DOPTEX_WITH_NCCL=ON "-DNCCL_INCLUDE_DIR=${NCCL_INCLUDE}" "-DNCCL_LIBRARY=${NCCL_LIB}")
  else
    args+=(-DOPTEX_WITH_NCCL=OFF)
  fi
  if [ -n "$MPICXX" ]; then
    args+=(-DOPTEX_WITH_MPI=ON "-DMPI_CXX_COMPILER=${MPICXX}")
  else
    args+=(-DOPTEX_WITH_MPI=OFF)
  fi
  # Extra arguments from the caller (the dry run's fallback when it cannot hide folders).
  # shellcheck disable=SC2206
  [ -n "${OPTEX_GPU_CHECK_CMAKE_ARGS:-}" ] && args+=(${OPTEX_GPU_CHECK_CMAKE_ARGS})
  printf '%s\n' "${args[@]}"
}

optex_targets() {
  # optex_gpu_tests: every test executable with GPU cases (tests/CMakeLists.txt).
  local targets=(optex_gpu_tests bench_cuda)
  [ -n "$MPICXX" ] && [ -n "$NCCL_ORIGIN" ] && targets+=(optex_distributed)
  printf '%s\n' "${targets[@]}"
}

tier1() {
  local start rc configure_args targets
  TIER1_RESERVE=$((FLOOR_TIER2 + FLOOR_TIER3 + FLOOR_TIER4))

  # GoogleTest and Google Benchmark (git is kept out of Benchmark's configure, which
  # would otherwise read this repository's tags as its version).
  start=$SECONDS rc=0
  build_dependency googletest -DBUILD_GMOCK=ON -DINSTALL_GTEST=ON || rc=$?
  [ $rc -eq 0 ] && { build_dependency benchmark -DBENCHMARK_ENABLE_TESTING=OFF \
    -DBENCHMARK_ENABLE_GTEST_TESTS=OFF -DBENCHMARK_ENABLE_WERROR=OFF -DBENCHMARK_INSTALL_DOCS=OFF \
    -DBENCHMARK_ENABLE_INSTALL=ON -DCMAKE_DISABLE_FIND_PACKAGE_Git=ON || rc=$?; }
  record 1 "GoogleTest + Benchmark from the kit" "$(status_of $rc)" - - - $((SECONDS - start)) "deps.log"

  # optex with the GPU's architecture: the GPU test targets and bench_cuda.
  start=$SECONDS
  mapfile -t configure_args < <(optex_configure_args)
  mapfile -t targets < <(optex_targets)
  [ $rc -eq 0 ] && { boxed "$(step_box 90 "$TIER1_RESERVE")" "${LOGS}/configure.log" cmake "${configure_args[@]}" || rc=$?; }
  [ $rc -eq 0 ] && { boxed "$(step_box 300 "$TIER1_RESERVE")" "${LOGS}/build.log" \
    cmake --build "$OPTEX_BUILD" -j "$JOBS" --target "${targets[@]}" || rc=$?; }
  local warnings
  warnings=$(grep -c 'warning:' "${LOGS}/build.log" 2>/dev/null || true)
  record 1 "configure + build (sm_${CUDA_ARCH})" "$(status_of $rc)" - - - $((SECONDS - start)) \
    "$(grep -o 'optex [0-9.]*: CPU core.*' "${LOGS}/configure.log" 2>/dev/null | head -n 1 | sed 's/ *| */, /g'); ${warnings:-0} warnings; targets: ${targets[*]}"
  local built=$rc

  # Tier 4's wheel compiles meanwhile: tiers 1-3 keep the GPU busy, not the cores.
  start_wheel_build

  # The GPU suites: they must not pass by skipping (OPTEX_REQUIRE_GPU=1) on a GPU run.
  start=$SECONDS rc=0
  if [ $built -eq 0 ]; then
    boxed "$(step_box 180 "$TIER1_RESERVE")" "${LOGS}/ctest-gpu.log" env "${REQUIRE_GPU[@]}" \
      ctest --test-dir "$OPTEX_BUILD" -L gpu --no-tests=error --output-on-failure -j 4 --timeout 170 \
      --output-junit "${LOGS}/ctest-gpu.xml" || rc=$?
    read -r passed failed skipped < <(counts junit "${LOGS}/ctest-gpu.xml")
    record 1 "ctest -L gpu (${REQUIRE_GPU[*]:-GPU optional})" "$(status_of $rc "$passed" "$failed" "$skipped")" \
      "$passed" "$failed" "$skipped" $((SECONDS - start)) "ctest-gpu.log"
  else
    record 1 "ctest -L gpu" "not run" - - - 0 "the build failed"
  fi

  # The mpirun example on NCCL, one rank on the one GPU.
  start=$SECONDS rc=0
  if [ -z "$MPICXX" ] || [ -z "$NCCL_ORIGIN" ]; then
    record 1 "mpirun -np 1 optex_distributed --backend nccl" "skipped" - - - 0 "no MPI library or no NCCL here"
  elif [ "$GPU_COUNT" -eq 0 ]; then
    record 1 "mpirun -np 1 optex_distributed --backend nccl" "skipped" - - - 0 "no GPU"
  elif [ $built -ne 0 ]; then
    record 1 "mpirun -np 1 optex_distributed --backend nccl" "not run" - - - 0 "the build failed"
  else
    boxed "$(step_box 60 "$TIER1_RESERVE")" "${LOGS}/mpirun-nccl.log" env OMPI_ALLOW_RUN_AS_ROOT=1 \
      OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$MPIRUN" -np 1 "${OPTEX_BUILD}/examples/optex_distributed" \
      --backend nccl --dim 1000000 --parallelism 4 --iterations 20 --timeout 30 || rc=$?
    [ $rc -eq 0 ] && ! grep -qE 'loss [0-9.e+-]+ after 20 rounds' "${LOGS}/mpirun-nccl.log" && rc=1
    record 1 "mpirun -np 1 optex_distributed --backend nccl" "$(status_of $rc)" - - - $((SECONDS - start)) "mpirun-nccl.log"
  fi
}
