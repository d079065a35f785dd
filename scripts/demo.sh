#!/usr/bin/env bash
# Installs everything, builds, and runs the demo: OptEx against plain Adam and the
# best same-budget baseline on the eight SFU test problems. Extra arguments go to
# the demo (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target optex_demo
./build/examples/optex_demo "$@"
