#!/usr/bin/env bash
# Idempotent machine setup: Debian packages and the project venv (.venv/) with
# LibTorch from the PyPI torch wheel. Does nothing when everything is present.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

TORCH_VERSION="2.11.0"
DEB_PACKAGES=(build-essential cmake ninja-build ccache pkg-config
  libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev libgtest-dev
  libsentencepiece-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev python3-venv
  openmpi-bin libopenmpi-dev libzstd-dev clang-format)
# sentencepiece 0.1.99 segments exactly as Debian's libsentencepiece (0.1.97)
# that we link; 0.2.x breaks some unigram ties the other way.
PY_PACKAGES=("torch==${TORCH_VERSION}" "numpy" "transformers" "tokenizers"
  "sentencepiece==0.1.99" "safetensors" "jinja2" "tensorboard" "megatron-core" "peft")

log() { printf '[setup] %s\n' "$*"; }

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PY" -m venv .venv
fi
# Every package, dependencies included, at the exact version of
# scripts/python-constraints.txt: the parity references must not change under
# a fresh clone when PyPI publishes a release. The stamp names the package
# list and the constraints, so editing either reinstalls.
CONSTRAINTS="$ROOT/scripts/python-constraints.txt"
stamp=".venv/.anvil-deps-$({ printf '%s\n' "${PY_PACKAGES[@]}"; cat "$CONSTRAINTS"; } | md5sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  log "installing Python packages into .venv: ${PY_PACKAGES[*]}"
  .venv/bin/python -m pip install -q -c "$CONSTRAINTS" --upgrade pip
  .venv/bin/python -m pip install -q -c "$CONSTRAINTS" "${PY_PACKAGES[@]}"
  .venv/bin/python -c "import torch; assert torch.__version__.startswith('${TORCH_VERSION}'), torch.__version__"
  touch "$stamp"
fi

# mosaicml-streaming's own MDSWriter writes the MDS folders the C++ tests read
# (tests/parity/mds_datasets.py). The package pins transformers<5, numpy<2.2
# and torchvision, which would downgrade .venv, so it goes into a folder of its
# own without its declared dependencies, with just the modules its writer
# imports; the script puts that folder on sys.path.
MDS_PACKAGES=("mosaicml-streaming==0.13.0" "zstd==1.5.7.2" "xxhash==3.8.2" "Brotli==1.2.1"
  "python-snappy==0.7.3" "cramjam==2.14.0" "catalogue==2.0.10")
mds_dir=".venv/mds-streaming"
mds_stamp="$mds_dir/.anvil-deps-$(printf '%s\n' "${MDS_PACKAGES[@]}" | md5sum | cut -c1-12)"
if [ ! -f "$mds_stamp" ]; then
  log "installing into $mds_dir: ${MDS_PACKAGES[*]}"
  rm -rf "$mds_dir"
  .venv/bin/python -m pip install -q --no-deps --target "$mds_dir" "${MDS_PACKAGES[@]}"
  touch "$mds_stamp"
fi
