#!/usr/bin/env bash
# Idempotent machine setup. Does nothing when everything is present.
#   scripts/setup.sh               everything: what building Anvil needs, plus what
#                                  the test suite, the parity references and the
#                                  layout check need (scripts/test.sh runs this)
#   scripts/setup.sh --quickstart  only what building Anvil and training need:
#                                  Debian packages and .venv/ with LibTorch from
#                                  the PyPI torch wheel (scripts/quickstart.sh)
# Running the full setup after --quickstart adds the rest; either order ends in
# the same .venv/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
case "${1:-}" in
  "") FULL=1 ;;
  --quickstart) FULL=0 ;;
  *) echo "usage: scripts/setup.sh [--quickstart]" >&2; exit 2 ;;
esac

TORCH_VERSION="2.11.0"
# What configuring and building every target needs. libgtest-dev and OpenMPI
# are here too: scripts/build.sh configures build/ once, CMake requires GTest
# for the test targets and records whether OpenMPI is there, so a build/ the
# quickstart configured serves scripts/test.sh as it is.
BUILD_DEB_PACKAGES=(build-essential cmake ninja-build ccache pkg-config
  libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev libgtest-dev
  libsentencepiece-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev python3-venv
  openmpi-bin libopenmpi-dev libzstd-dev)
# scripts/format.sh --check (scripts/test.sh runs it).
TEST_DEB_PACKAGES=(clang-format)
# LibTorch (and scripts/build.sh's torch.utils.cmake_prefix_path) is all that
# building and training need from Python; numpy only keeps `import torch` from
# warning that it is missing.
BUILD_PY_PACKAGES=("torch==${TORCH_VERSION}" "numpy")
# The parity references, the tests' data makers and the benchmarks' peers.
# sentencepiece 0.1.99 segments exactly as Debian's libsentencepiece (0.1.97)
# that we link; 0.2.x breaks some unigram ties the other way.
TEST_PY_PACKAGES=("transformers" "tokenizers" "sentencepiece==0.1.99" "safetensors" "jinja2"
  "tensorboard" "megatron-core" "peft")
DEB_PACKAGES=("${BUILD_DEB_PACKAGES[@]}")
if [ "$FULL" = 1 ]; then DEB_PACKAGES+=("${TEST_DEB_PACKAGES[@]}"); fi

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
# a fresh clone when PyPI publishes a release. Each stamp names its package
# list and the constraints, so editing either reinstalls.
CONSTRAINTS="$ROOT/scripts/python-constraints.txt"
pip_stamp() { echo ".venv/.anvil-$1-$({ printf '%s\n' "${@:2}"; cat "$CONSTRAINTS"; } | md5sum | cut -c1-12)"; }
stamp=$(pip_stamp deps "${BUILD_PY_PACKAGES[@]}")
if [ ! -f "$stamp" ]; then
  log "installing Python packages into .venv: ${BUILD_PY_PACKAGES[*]}"
  .venv/bin/python -m pip install -q -c "$CONSTRAINTS" --upgrade pip
  .venv/bin/python -m pip install -q -c "$CONSTRAINTS" "${BUILD_PY_PACKAGES[@]}"
  .venv/bin/python -c "import torch; assert torch.__version__.startswith('${TORCH_VERSION}'), torch.__version__"
  touch "$stamp"
fi
[ "$FULL" = 1 ] || exit 0

stamp=$(pip_stamp test-deps "${TEST_PY_PACKAGES[@]}")
if [ ! -f "$stamp" ]; then
  log "installing the test suite's Python packages into .venv: ${TEST_PY_PACKAGES[*]}"
  .venv/bin/python -m pip install -q -c "$CONSTRAINTS" "${TEST_PY_PACKAGES[@]}"
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

# TRL's own ORPOTrainer and KTOTrainer run the parity references of
# tests/parity/trl_reference.py. They go into a folder of their own, without
# their declared dependencies, so that .venv keeps exactly the versions of
# scripts/python-constraints.txt that the other references were made with;
# the folder holds just the modules TRL and datasets import that .venv lacks,
# and the script puts it first on sys.path.
TRL_PACKAGES=("trl==1.16.0" "datasets==5.2.0" "pyarrow==26.0.1" "pandas==3.1.1" "python-dateutil==4.0.0"
  "dill==0.4.1" "multiprocess==0.70.19" "xxhash==3.8.2")
trl_dir=".venv/trl"
trl_stamp="$trl_dir/.anvil-deps-$(printf '%s\n' "${TRL_PACKAGES[@]}" | md5sum | cut -c1-12)"
if [ ! -f "$trl_stamp" ]; then
  log "installing into $trl_dir: ${TRL_PACKAGES[*]}"
  rm -rf "$trl_dir"
  .venv/bin/python -m pip install -q --no-deps --target "$trl_dir" "${TRL_PACKAGES[@]}"
  touch "$trl_stamp"
fi

# llama.cpp's corpus of chat templates, each as a model folder's
# tokenizer_config.json has it (models/templates, vendored in the
# llama-cpp-python sdist): tests/parity/chat_template_corpus.py renders them
# with transformers, tests/chat/template_corpus_test.cpp with Anvil. Only that
# folder of the sdist is kept; the hash pins the corpus.
LLAMA_CPP_PYTHON="llama-cpp-python==0.3.36"
LLAMA_CPP_PYTHON_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
templates_dir=".venv/llama-cpp-templates"
templates_stamp="$templates_dir/.anvil-$(printf '%s\n' "$LLAMA_CPP_PYTHON" "$LLAMA_CPP_PYTHON_SHA256" | md5sum | cut -c1-12)"
if [ ! -f "$templates_stamp" ]; then
  log "extracting models/templates of the $LLAMA_CPP_PYTHON sdist into $templates_dir"
  rm -rf "$templates_dir"
  sdist_dir="$(mktemp -d)"
  printf '%s --hash=sha256:%s\n' "$LLAMA_CPP_PYTHON" "$LLAMA_CPP_PYTHON_SHA256" >"$sdist_dir/requirements.txt"
  .venv/bin/python -m pip download -q --no-deps --no-binary :all: --require-hashes \
    -r "$sdist_dir/requirements.txt" -d "$sdist_dir"
  mkdir -p "$templates_dir"
  tar -xzf "$sdist_dir"/llama_cpp_python-*.tar.gz -C "$templates_dir" --strip-components=3 --wildcards \
    '*/vendor/llama.cpp/models/templates/*'
  rm -rf "$sdist_dir"
  touch "$templates_stamp"
fi
