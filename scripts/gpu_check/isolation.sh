# shellcheck shell=bash
# Keeping a build away from this machine's own Eigen, GoogleTest, Google Benchmark and
# CLI11, so that it can only succeed with the kit: what `check` and `dry-run` use to
# prove that a GPU machine without them can build. Sourced; needs kit_layout.sh.

# Where Debian puts those packages' headers, sources and CMake packages.
system_dependency_dirs() {
  local d
  for d in /usr/include/eigen3 /usr/share/eigen3 /usr/include/CLI /usr/share/cmake/CLI11 \
    /usr/include/gtest /usr/include/gmock /usr/src/googletest /usr/src/gtest /usr/src/gmock \
    /usr/include/benchmark /usr/lib/*/cmake/GTest /usr/lib/*/cmake/benchmark \
    /usr/lib/cmake/GTest /usr/lib/cmake/benchmark; do
    [ -d "$d" ] && [ ! -L "$d" ] && echo "$d"
  done
  return 0
}

# The same as CMake arguments, for where directories cannot be hidden: CMake then
# ignores the packages' config files there (FindGTest's header search as well).
system_dependency_cmake_args() {
  local dirs
  # Not recursive: a package's cmake/ subfolder is named as well.
  dirs=$(system_dependency_dirs | sed 'p; s|$|/cmake|' | paste -sd ';' -)
  [ -n "$dirs" ] && echo "-DCMAKE_IGNORE_PATH=${dirs}"
  return 0
}

# Whether this process may make private mount (and network) namespaces.
can_isolate() { unshare --mount --net true 2>/dev/null; }

# without_system_dependencies [--no-network] command...: runs the command with every
# system_dependency_dirs folder hidden behind an empty tmpfs in a private mount
# namespace (and, with --no-network, in a network namespace of its own, loopback
# only). Returns 125 if namespaces are not available; callers test can_isolate first.
without_system_dependencies() {
  local flags=(--mount)
  if [ "${1:-}" = "--no-network" ]; then
    flags+=(--net)
    shift
  fi
  can_isolate || return 125
  # shellcheck disable=SC2016
  OPTEX_HIDE="$(system_dependency_dirs | tr '\n' ' ')" unshare "${flags[@]}" bash -c '
    set -e
    for d in $OPTEX_HIDE; do mount -t tmpfs -o ro,size=4k none "$d"; done
    command -v ip >/dev/null && ip link set lo up 2>/dev/null || true
    exec "$@"' gpu-check-isolated "$@"
}
