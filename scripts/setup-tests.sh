#!/usr/bin/env bash
# Sets up what the tests need on top of scripts/setup.sh: a virtualenv with the pinned openai
# client, the random-weight fixtures, llama-cpp-python's server (the delegated-route tests'
# upstream) and the axle Python package. The test command runs it; the main job does not need it.
# Idempotent.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/setup.sh"

if ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
  echo "installing: python3-venv" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null
fi

# The chat page's test runs a real headless browser: Chromium and its driver from the system's
# packages.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "installing: chromium chromium-driver" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
fi

# The server tests use the official openai client, pinned, in a virtualenv of their own.
venv="${AXLE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/axle/venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/../tests/python/requirements.txt"

# The random-weight fixtures of the architectures with no fetchable weights (fixtures/*.gguf, 22
# files, about 120 MB): written from seeds by scripts/make-fixtures.py (about 10 s), byte for byte
# the same on every machine, rather than kept in git.
models="$("$here/fetch-models.sh")"
fixtures="$here/../fixtures"
if [ "$(ls "$fixtures"/*-tiny*.gguf 2>/dev/null | wc -l)" -lt "$("$venv/bin/python" "$here/make-fixtures.py" --count)" ]; then
  "$venv/bin/python" "$here/make-fixtures.py" --smollm2 "$models/SmolLM2-135M-Instruct.Q4_1.gguf" \
    --out "$fixtures" >/dev/null
fi
# Safetensors folders written from those fixtures, each beside a GGUF twin of the same numbers
# (fixtures/hf, about 1.1 GB with the real Gemma 3 270M as bf16, about 30 seconds).
if [ "$(ls -d "$fixtures"/hf/*/ 2>/dev/null | wc -l)" -lt "$("$venv/bin/python" "$here/make-hf-fixtures.py" --count)" ]; then
  "$venv/bin/python" "$here/make-hf-fixtures.py" --fixtures "$fixtures" --models "$models" >/dev/null
fi

# The delegated-route tests run llama.cpp's server as llama-cpp-python packages it. PyPI has its
# source only, so its wheel is built once (about 6 minutes on 2 cores, host CPU features, no
# llava or tools) into the cache and installed from there.
if ! "$venv/bin/python" -c "import llama_cpp.server" >/dev/null 2>&1; then
  wheels="${XDG_CACHE_HOME:-$HOME/.cache}/axle/wheels"
  if ! ls "$wheels"/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1; then
    echo "building llama-cpp-python 0.3.36 (once; about 6 minutes)" >&2
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" \
      CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      "$venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$wheels" llama-cpp-python==0.3.36
  fi
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --find-links "$wheels" \
    -r "$here/../tests/python/requirements-upstream.txt"
fi
# The Python package (`import axle`, crates/axle-py) into the test virtualenv: maturin builds it
# with cargo in this workspace's target folder (a first build compiles llama.cpp, a few minutes;
# later ones take seconds).
echo "installing the axle Python package (crates/axle-py) into $venv" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$here/../crates/axle-py"
# ggml's RPC backend (libggml-rpc.so) beside target/release/axle, for the test that splits a model
# across `axle rpc-server` processes (crates/axle/tests/rpc_split.rs): about 20 s, from the same
# vendored ggml source as the binary (fetched first, so that the source is in the registry).
if [ ! -e "$here/../target/release/backends/libggml-rpc.so" ]; then
  (cd "$here/.." && cargo fetch --locked -q)
  "$here/build-backend.sh" rpc >/dev/null
fi
echo "test setup done; models in $("$here/fetch-models.sh")" >&2
