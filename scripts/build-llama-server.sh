#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (for `axle bench ngram --llama-server`, which compares Axle's
# n-gram speculation with llama-server's own n-gram modes). No hub access is needed: the source is
# the llama.cpp that the llama-cpp-python 0.3.36 source package vendors, from the Python registry.
# Prints the binary's path; about 10 minutes on 2 cores, once.
set -euo pipefail
cache="${XDG_CACHE_HOME:-$HOME/.cache}/axle"
bin="$cache/bin/llama-server"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
src="$cache/src"
mkdir -p "$src" "$cache/bin"
if [ ! -d "$src/llama_cpp_python-0.3.36" ]; then
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
    llama-cpp-python==0.3.36 -d "$src" >&2
  tar xzf "$src/llama_cpp_python-0.3.36.tar.gz" -C "$src"
fi
llama="$src/llama_cpp_python-0.3.36/vendor/llama.cpp"
cmake -S "$llama" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF >&2
cmake --build "$src/build" --target llama-server -j "$(nproc)" >&2
cp "$src/build/bin/llama-server" "$bin"
echo "$bin"
