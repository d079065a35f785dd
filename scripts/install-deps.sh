#!/usr/bin/env bash
# Installs what building and testing optex needs, from Debian/Ubuntu packages.
# Safe to run again: it installs only what is missing.
set -euo pipefail
# python3-venv and python3-dev: the Python package's virtual environment and the
# headers its extension compiles against (scripts/test.sh); the rest of what it
# needs (scikit-build-core, pybind11, numpy, pytest) comes from PyPI through pip.
# Open MPI (libopenmpi-dev, openmpi-bin) serves the C++ MPI tests and mpi4py, whose
# wheel (the test extra) loads the system's libmpi and runs under its mpirun.
packages=(cmake make g++ libeigen3-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
  clang-format libopenmpi-dev openmpi-bin python3-venv python3-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
