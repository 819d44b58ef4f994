#!/usr/bin/env bash
# Fetches, with apt-get download, the Debian 12 packages headscope's build needs besides libtorch, for
# a machine that has none of them (the GPU machine of scripts/device_check.sh: nvcc, cmake, ninja and a
# CUDA PyTorch, no -dev packages, no network). They land in .device/debs/ (ignored by git; ~20 MiB),
# which the device run carries (with .device/testdata, a copy of ../shared/testdata); device_check.sh unpacks them into a prefix with dpkg-deb (or Python
# when dpkg-deb is absent). Idempotent: packages already there are not fetched again.
#   bash scripts/device_debs.sh [DIR]
# What is fetched: the -dev packages (headers, CMake and pkg-config files, the unversioned .so links;
# CLI11, doctest and nlohmann-json are header-only), pkgconf (CMake's FindPkgConfig needs a pkg-config
# for PCRE2), and the runtime libraries they link with, recursively, except the C/C++ runtime (libc6,
# libgcc-s1, libstdc++6), which must come from the machine itself: device_check.sh compares the GLIBC_ /
# GLIBCXX_ versions these libraries need with the machine's and names what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.device/debs}"
mkdir -p "$out"
dev=(libhdf5-dev libfmt-dev libyaml-cpp-dev libcli11-dev doctest-dev nlohmann-json3-dev libpcre2-dev libssl-dev
     pkgconf pkgconf-bin)
runtime_roots=(libhdf5-103-1 libfmt9 libyaml-cpp0.7 libpcre2-8-0 libssl3 libpkgconf3)
base='^(libc6|libgcc-s1|libstdc\+\+6|gcc-12-base|debconf|libcrypt1)$'
[ -n "$(ls /var/lib/apt/lists/*_Packages 2>/dev/null | head -1)" ] || apt-get update -q
runtime=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
            --no-enhances --no-pre-depends "${runtime_roots[@]}" | grep -v '^[ <]' | sort -u | grep -Ev "$base")
# shellcheck disable=SC2206
pkgs=("${dev[@]}" $runtime)
need=()
for p in "${pkgs[@]}"; do
  ls "$out/${p}_"*.deb >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  (cd "$out" && apt-get download "${need[@]}")
fi
# The manifest device_check.sh reads: package, version, file.
for p in "${pkgs[@]}"; do ls "$out/${p}_"*.deb; done | sort -u | while read -r f; do
  echo "$(dpkg-deb -f "$f" Package) $(dpkg-deb -f "$f" Version) $(basename "$f")"
done > "$out/MANIFEST"
# The shared test checkpoints too (the device gets the repository, not ../shared): .device/testdata.
carry="\"$out\""
for td in ../shared/testdata shared/testdata; do
  if [ -d "$td" ]; then
    rm -rf .device/testdata && cp -r "$td" .device/testdata && carry="$carry, \".device/testdata\""
    break
  fi
done
echo "device_debs.sh: $(wc -l < "$out/MANIFEST") packages in $out ($(du -sh "$out" | cut -f1)); test data: $(du -sh .device/testdata 2>/dev/null | cut -f1 || echo none)"
echo "  carry them: run(carry=[$carry], command=\"bash scripts/device_check.sh\")"
