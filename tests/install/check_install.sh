#!/usr/bin/env bash
# Installs the build into a scratch prefix, builds the README's C++ quickstart
# as an outside project with find_package(optex), and runs it. Also checks the
# README's copy is the same program as examples/quickstart.cpp. Then builds every
# other ```cpp block of README.md and docs/guide/*.md the same way and runs it
# (tests/install/cpp_snippets.py; the conventions are in docs/guide/README.md).
# Usage: check_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The first ```cpp block after the "C++ quickstart" heading.
awk '/^## C\+\+ quickstart/{f=1} f&&/^```cpp/{p=1;next} p&&/^```/{exit} p' "$src/README.md" >"$work/main.cpp"
[ -s "$work/main.cpp" ] || { echo "no C++ quickstart block found in README.md"; exit 1; }
if ! diff <(grep -v '^//' "$src/examples/quickstart.cpp") <(grep -v '^//' "$work/main.cpp"); then
  echo "README quickstart and examples/quickstart.cpp differ"; exit 1
fi

cmake --install "$build" --prefix "$work/prefix" >/dev/null
cp "$src/tests/install/CMakeLists.txt" "$work/"
cmake -S "$work" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" >/dev/null
out=$("$work/build/quickstart")
echo "$out"
grep -q "target_loss" <<<"$out" || { echo "quickstart did not reach its target"; exit 1; }

# Every ```cpp block of the README and the user guide, against the same installed package:
# the MPI ones run on 2 ranks where optex was built with MPI, the GPU ones are compiled only.
mpi=OFF
if grep -q '^OPTEX_WITH_MPI:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then mpi=ON; fi
python3 "$src/tests/install/cpp_snippets.py" --source "$src" --prefix "$work/prefix" \
  --work "$work/snippets" --mpi "$mpi"
