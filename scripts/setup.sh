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
  openmpi-bin libopenmpi-dev)
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
# The stamp names the package list, so editing the list reinstalls.
stamp=".venv/.anvil-deps-$(printf '%s\n' "${PY_PACKAGES[@]}" | md5sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  log "installing Python packages into .venv: ${PY_PACKAGES[*]}"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "${PY_PACKAGES[@]}"
  .venv/bin/python -c "import torch; assert torch.__version__.startswith('${TORCH_VERSION}'), torch.__version__"
  touch "$stamp"
fi
