# shellcheck shell=bash
# Tier 4: the Python package built on the machine for its own Python, offline
# (pip install --no-build-isolation --no-deps --no-index, CUDA on, this GPU's
# architecture); the Python tests marked gpu (the CUDA engine through the binding, its
# DLPack rows, optex.torch on CUDA tensors) with OPTEX_REQUIRE_GPU=1; then one round of
# N = 4 on CUDA tensors, sequential and batched (BatchedClosure), against one
# torch.optim.Adam step on the same model, in wall-clock (bench/python/torch_round_cost.py).
# Sourced by run.sh; tier 1 starts the wheel build in the background.

WHEEL_SITE="${GPU_CHECK_WORK}/site"
WHEEL_RC="${GPU_CHECK_WORK}/wheel.rc"
WHEEL_PID=""

start_wheel_build() {
  rm -rf "$WHEEL_SITE" "$WHEEL_RC"
  local define args=(--no-build-isolation --no-deps --no-index --no-cache-dir --disable-pip-version-check
    -v --target "$WHEEL_SITE"
    "--config-settings=build-dir=${GPU_CHECK_WORK}/wheel-build"
    --config-settings=cmake.define.OPTEX_WITH_CUDA=ON
    "--config-settings=cmake.define.CMAKE_CUDA_COMPILER=${NVCC}"
    "--config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH}"
    "--config-settings=cmake.define.Eigen3_DIR=${KIT_EIGEN}/share/eigen3/cmake"
    # The module finds the toolkit's cuBLAS/cuSOLVER where it was linked against them,
    # also where the loader's cache does not list them (tier 0 says whether it does).
    --config-settings=cmake.define.CMAKE_INSTALL_RPATH_USE_LINK_PATH=ON)
  # Eigen3_DIR rather than CMAKE_PREFIX_PATH, which scikit-build-core fills with the
  # Python environment's CMake packages (pybind11's among them).
  # shellcheck disable=SC2206
  for define in "${CUDA_LIBRARY_ARGS[@]}" ${OPTEX_GPU_CHECK_CMAKE_ARGS:-}; do
    args+=("--config-settings=cmake.define.${define#-D}")
  done
  local box
  box=$(step_box 360 60)
  WHEEL_START=$SECONDS
  (
    rc=0
    boxed "$box" "${LOGS}/wheel.log" env CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
      "$PY" -m pip install "${args[@]}" "$GPU_CHECK_ROOT" || rc=$?
    echo "$rc" >"$WHEEL_RC"
  ) &
  WHEEL_PID=$!
}

tier4() {
  local start rc passed failed skipped
  # The wheel, built since tier 1.
  if [ -z "$WHEEL_PID" ]; then
    record 4 "pip install . (offline)" "not run" - - - 0 "tier 1 did not get to it"
    return
  fi
  wait "$WHEEL_PID" || true
  rc=$(cat "$WHEEL_RC" 2>/dev/null || echo 1)
  record 4 "pip install . (offline, $("$PY" --version 2>&1), sm_${CUDA_ARCH})" "$(status_of "$rc")" - - - \
    $((SECONDS - WHEEL_START)) "wheel.log; built beside tiers 1-3"
  if [ "$rc" -ne 0 ]; then
    record 4 "pytest -m gpu" "not run" - - - 0 "no wheel"
    record 4 "torch round cost" "not run" - - - 0 "no wheel"
    return
  fi

  # The tests marked gpu, against the wheel just built.
  local files
  mapfile -t files < <(cd "$GPU_CHECK_ROOT" && grep -l 'pytest.mark.gpu' tests/python/test_*.py)
  start=$SECONDS rc=0
  (cd "$GPU_CHECK_ROOT" && boxed "$(step_box 120 20)" "${LOGS}/pytest-gpu.log" env PYTHONPATH="$WHEEL_SITE" \
    PYTHONUNBUFFERED=1 "${REQUIRE_GPU[@]}" "$PY" -m pytest -m gpu -q -p no:cacheprovider -rs \
    "--junitxml=${LOGS}/pytest-gpu.xml" "${files[@]}") || rc=$?
  read -r passed failed skipped < <(counts junit "${LOGS}/pytest-gpu.xml")
  record 4 "pytest -m gpu (${#files[@]} files)" "$(status_of $rc "$passed" "$failed" "$skipped")" \
    "$passed" "$failed" "$skipped" $((SECONDS - start)) "pytest-gpu.log"

  # A round on CUDA tensors against a torch.optim.Adam step; on CPU tensors, briefly,
  # where there is no GPU (the dry run: the script and its timing run, nothing is shown).
  local device=cuda timing=(--repetitions 40 --block 5 --warmup 20)
  [ "$GPU_COUNT" -eq 0 ] && device=cpu timing=(--repetitions 3 --block 2 --warmup 2)
  start=$SECONDS rc=0
  (cd "$GPU_CHECK_ROOT" && boxed "$(step_box 90 5)" "${LOGS}/torch-round-cost.log" env PYTHONPATH="$WHEEL_SITE" \
    PYTHONUNBUFFERED=1 "$PY" bench/python/torch_round_cost.py --device "$device" --parallelism 4 "${timing[@]}" \
    --output "${LOGS}/torch-round-cost-${device}.md" --output "${LOGS}/torch-round-cost-${device}.json") || rc=$?
  record 4 "torch round cost, N = 4, ${device} tensors" "$(status_of $rc)" - - - $((SECONDS - start)) \
    "$(grep -o '^[a-z]*: a batched round costs [0-9.]* Adam steps (wall)' "${LOGS}/torch-round-cost.log" | paste -sd ';' -)"
}
