#!/usr/bin/env bash
# Installs what building and testing optex needs, from Debian/Ubuntu packages.
# Safe to run again: it installs only what is missing.
set -euo pipefail
packages=(cmake make g++ libeigen3-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
  clang-format libopenmpi-dev openmpi-bin)
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
