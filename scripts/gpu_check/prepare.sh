#!/usr/bin/env bash
# scripts/gpu-check.sh prepare: fills .gpu-kit/ with what the GPU machine may lack
# (kit_layout.sh lists the pieces), then prints the kit's size, the size of the tree
# with it, and the ignored paths a device call must carry.
#
# Eigen's and CLI11's headers and CMake packages are copied from the Debian packages
# that scripts/install-deps.sh installs; GoogleTest's and Google Benchmark's sources are
# Debian's upstream tarballs, fetched with `apt-get source` through a private copy of
# apt's lists (the machine's own apt configuration is left as it is). The new kit is
# assembled beside the old one and swapped in whole, so a failed prepare leaves the old
# kit untouched. A kit whose recipe and files are unchanged is kept as it is.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/kit_layout.sh"
cd "$GPU_CHECK_ROOT"

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

bash scripts/install-deps.sh

installed_version() { dpkg-query -W -f='${Version}' "$1"; }

# The recipe: this script, the layout and the Debian versions it copies. A kit made
# by the same recipe, whose files still match their checksums, is up to date.
recipe="$(cat "${BASH_SOURCE[0]}" "$(dirname "${BASH_SOURCE[0]}")/kit_layout.sh" | sha256sum | cut -c1-16)"
recipe="${recipe} eigen3=$(installed_version libeigen3-dev) cli11=$(installed_version libcli11-dev)"
recipe="${recipe} gtest=$(installed_version libgtest-dev) benchmark=$(installed_version libbenchmark-dev)"

kit_is_current() {
  [ -f "$KIT_MANIFEST" ] && grep -qxF "# recipe ${recipe}" "$KIT_MANIFEST" &&
    (cd "$KIT" && grep -v '^#' MANIFEST | sha256sum --check --quiet --strict >/dev/null 2>&1)
}

record_commit() {
  {
    git -C "$GPU_CHECK_ROOT" rev-parse HEAD 2>/dev/null || echo "not a git checkout"
    echo "changed files: $(git -C "$GPU_CHECK_ROOT" status --porcelain 2>/dev/null | wc -l)"
    echo "sources: $(tree_fingerprint)"
  } >"$1/commit"
}

report() {
  local tree kit
  tree=$(device_tree_bytes)
  kit=$(kit_bytes)
  echo "kit: ${KIT#"$GPU_CHECK_ROOT"/} $(mib "$kit")"
  echo "tree as a device call sends it: $(mib "$tree"); with the kit: $(mib $((tree + kit))) of $(mib "$DEVICE_TREE_LIMIT_BYTES")"
  echo "carry: ${KIT_CARRY[*]}"
  if [ $((tree + kit)) -gt "$DEVICE_TREE_LIMIT_BYTES" ]; then
    echo "prepare: the tree with the kit is over the device call's limit" >&2
    exit 1
  fi
}

if kit_is_current; then
  record_commit "$KIT"
  echo "prepare: the kit is up to date"
  report
  exit 0
fi

staging="$(mktemp -d "${KIT}.new.XXXXXX")"
apt_state="$(mktemp -d)"
trap 'rm -rf "$staging" "$apt_state"' EXIT

# ---- Eigen and CLI11: header-only, copied with their relocatable CMake packages ----
copy_package_dir() { # package, path inside it, destination
  local from="$2"
  if [ ! -e "$from" ]; then
    echo "prepare: $1 has no $from (dpkg -L $1 lists what it has)" >&2
    exit 1
  fi
  mkdir -p "$(dirname "$3")"
  cp -a "$from" "$3"
}
copy_package_dir libeigen3-dev /usr/include/eigen3/Eigen "${staging}/eigen3/include/eigen3/Eigen"
copy_package_dir libeigen3-dev /usr/include/eigen3/signature_of_eigen3_matrix_library \
  "${staging}/eigen3/include/eigen3/signature_of_eigen3_matrix_library"
copy_package_dir libeigen3-dev /usr/share/eigen3/cmake "${staging}/eigen3/share/eigen3/cmake"
copy_package_dir libcli11-dev /usr/include/CLI "${staging}/cli11/include/CLI"
copy_package_dir libcli11-dev /usr/share/cmake/CLI11 "${staging}/cli11/share/cmake/CLI11"

# ---- GoogleTest and Google Benchmark: Debian's upstream source tarballs ----
# A private apt state whose sources are the machine's deb lines as deb-src lines.
mkdir -p "${apt_state}/lists/partial" "${apt_state}/parts" "${apt_state}/download"
for list in /etc/apt/sources.list.d/*.sources; do
  [ -f "$list" ] && sed -E 's/^Types:.*/Types: deb-src/' "$list" >"${apt_state}/parts/$(basename "$list")"
done
for list in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [ -f "$list" ] && sed -nE 's/^[[:space:]]*deb[[:space:]]/deb-src /p' "$list" >>"${apt_state}/parts/deb-src.list"
done
apt_options=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=${apt_state}/parts"
  -o "Dir::State::Lists=${apt_state}/lists" -o "APT::Sandbox::User=root")
$sudo apt-get "${apt_options[@]}" update -qq
(cd "${apt_state}/download" && $sudo apt-get "${apt_options[@]}" source --download-only -qq \
  libgtest-dev libbenchmark-dev >/dev/null)

unpack_source() { # Debian source package, destination
  local tarball
  tarball=$(find "${apt_state}/download" -maxdepth 1 -name "${1}_*.orig.tar.*" | head -n 1)
  if [ -z "$tarball" ]; then
    echo "prepare: apt-get source brought no upstream tarball of $1" >&2
    exit 1
  fi
  mkdir -p "$2"
  tar -xf "$tarball" -C "$2" --strip-components=1 --no-same-owner
  basename "$tarball"
}
gtest_tarball=$(unpack_source googletest "${staging}/src/googletest")
benchmark_tarball=$(unpack_source benchmark "${staging}/src/benchmark")

# ---- the manifest: what each piece is, then every file's checksum ----
{
  echo "# recipe ${recipe}"
  echo "# eigen3 $(installed_version libeigen3-dev) Debian libeigen3-dev (headers, CMake package)"
  echo "# cli11 $(installed_version libcli11-dev) Debian libcli11-dev (header, CMake package)"
  echo "# googletest ${gtest_tarball} Debian source package googletest"
  echo "# benchmark ${benchmark_tarball} Debian source package benchmark"
  (cd "$staging" && find . -type f ! -path ./MANIFEST ! -path ./commit -printf '%P\n' | LC_ALL=C sort |
    xargs -d '\n' sha256sum)
} >"${staging}/MANIFEST"
record_commit "$staging"
chmod -R u+rwX,go+rX "$staging"

# Swap the new kit in whole.
if [ -e "$KIT" ]; then
  old="$(mktemp -d "${KIT}.old.XXXXXX")"
  mv "$KIT" "${old}/kit"
  mv "$staging" "$KIT"
  rm -rf "$old"
else
  mv "$staging" "$KIT"
fi
echo "prepare: the kit is ready"
report
