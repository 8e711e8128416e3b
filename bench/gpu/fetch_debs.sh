#!/usr/bin/env bash
# Downloads, on a Debian bookworm machine with a package registry, the .deb
# files bench/gpu/run.sh unpacks where there is none (a lent GPU machine):
# the libraries Anvil builds against that such a machine lacks, and pkgconf.
# They land in .gpudeps/debs (git-ignored, about 4.5 MB); a device call sends
# them when it names .gpudeps in `carry`. Does nothing when they are there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PKGS=(libyaml-cpp-dev libyaml-cpp0.7 libcli11-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libsentencepiece-dev libsentencepiece0 nlohmann-json3-dev libpcre2-dev libpcre2-8-0 libpcre2-16-0
  libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2 libzstd-dev libzstd1 pkgconf pkgconf-bin libpkgconf3)
mkdir -p .gpudeps/debs
cd .gpudeps/debs
missing=()
for p in "${PKGS[@]}"; do compgen -G "${p}_*.deb" >/dev/null || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && { echo "[fetch_debs] all ${#PKGS[@]} packages present in .gpudeps/debs"; exit 0; }
echo "[fetch_debs] downloading ${missing[*]}"
apt-get download "${missing[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true
for p in "${missing[@]}"; do compgen -G "${p}_*.deb" >/dev/null || { echo "[fetch_debs] $p was not downloaded" >&2; exit 1; }; done
