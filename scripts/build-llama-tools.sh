#!/usr/bin/env bash
# llama.cpp's own tools, the speed reference users run: `llama-bench`, `llama-batched-bench` and
# `llama-server`, built plainly (no Axle patches) from a complete llama.cpp tree. The crate's
# vendored copy has no sources for its tools; the llama-cpp-python 0.3.36 source package on the
# Python registry vendors a complete one (ggml 0.25.3).
#
#   scripts/build-llama-tools.sh --pack FILE.tgz    here: fetch the source package, pack its llama.cpp
#                                                   without models, docs, tests and the web UI's
#                                                   sources (~10 MB; llama-server serves no UI)
#   scripts/build-llama-tools.sh --src FILE.tgz [--out DIR] [--arch LIST] [--cpu]
#                                                   there: build the tools into DIR (default
#                                                   ./llama-tools) for CUDA (--arch, default
#                                                   90-real: H100/H200), or for the CPU (--cpu)
# On a 16-core GPU machine the CUDA build takes about 9 minutes. DIR/COMMIT names the source.
set -euo pipefail
pack="" src="" out="llama-tools" arch="90-real" cuda=ON
while [ $# -gt 0 ]; do
  case "$1" in
    --pack) pack="$2"; shift 2 ;;
    --src) src="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --cpu) cuda=OFF; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
version=0.3.36
if [ -n "$pack" ]; then
  tmp="$(mktemp -d)"
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$version" -d "$tmp"
  tar xzf "$tmp/llama_cpp_python-$version.tar.gz" -C "$tmp"
  tree="$tmp/llama_cpp_python-$version/vendor/llama.cpp"
  echo "llama-cpp-python $version sdist, vendor/llama.cpp (ggml $(sed -n 's/.*GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$tree/ggml/CMakeLists.txt" | paste -sd.))" >"$tree/COMMIT"
  tar czf "$pack" -C "$tree" --exclude=./models --exclude=./docs --exclude=./tests \
    --exclude=./gguf-py --exclude=./examples --exclude=./tools/ui/src --exclude=./tools/ui/static \
    --exclude=./tools/ui/tests --exclude=./tools/ui/package-lock.json --exclude='./build*' --exclude=./.git .
  rm -rf "$tmp"
  echo "packed -> $pack ($(du -h "$pack" | cut -f1))"
  exit 0
fi
[ -f "$src" ] || { echo "usage: $0 --pack FILE.tgz | --src FILE.tgz [--out DIR] [--arch LIST] [--cpu]" >&2; exit 2; }
if [ $cuda = ON ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
  command -v nvcc >/dev/null 2>&1 || { echo "error: nvcc not found (install the CUDA toolkit)" >&2; exit 1; }
fi
dir="$(mktemp -d)/llama.cpp"
mkdir -p "$dir" "$out"
tar xzf "$src" -C "$dir"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
cmake -S "$dir" -B "$dir/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=$cuda \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >/dev/null
cmake --build "$dir/build" --config Release -j "$(nproc)" \
  --target llama-bench llama-batched-bench llama-server
cp "$dir/build/bin/llama-bench" "$dir/build/bin/llama-batched-bench" "$dir/build/bin/llama-server" "$out/"
cp "$dir/COMMIT" "$out/COMMIT" 2>/dev/null || echo "llama-cpp-python $version" >"$out/COMMIT"
echo "tools in $out: $(ls "$out" | paste -sd' ')"
