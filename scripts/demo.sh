#!/usr/bin/env bash
# Installs everything, builds, and runs the demo: OptEx against plain Adam and the
# best same-budget baseline on the eight SFU test problems. Extra arguments go to
# the demo (see --help).
#
# How long it takes, measured on a 2-core VM: the first time about 3 to 8 minutes,
# most of it the build (a clean clone with the packages installed: 197 s in all on
# a quiet machine; the build alone 7m51s on 2 cores shared with other builds); the demo itself then runs about 45 s
# (d = 10000, 3 seeds; 41 s measured). Once built, the script takes 1 to 2 minutes
# (99 s measured on the same busy machine, 46 CPU-seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
bash scripts/install-deps.sh
if [ ! -x build/examples/optex_demo ]; then
  echo "demo: the first run builds the library: about 2-7 minutes on 2 cores," \
    "then about 45 s for the demo"
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target optex_demo
./build/examples/optex_demo "$@"
echo "demo: $((SECONDS - start)) s in all (build included)"
