#!/usr/bin/env bash
# Builds ggml backends as libraries the axle binary loads at run time, from exactly the llama.cpp
# source that the llama-cpp-sys-2 crate vendors: same ggml commit, so the backend API matches the
# one compiled into axle. BACKENDS is a comma-separated list:
#   cuda  libggml-cuda.so (needs the CUDA toolkit)
#   rpc   libggml-rpc.so, ggml's RPC client and server: `axle --rpc host:port` attaches devices
#         that `axle rpc-server` (or llama.cpp's rpc-server) serves on other machines
# Each comes with the libggml-base.so it links against.
#
#   scripts/build-backend.sh BACKENDS [--src DIR|FILE.tgz] [--out DIR] [--arch LIST]
#   scripts/build-backend.sh --pack FILE.tgz     # pack the vendored source (to build elsewhere)
#
# --src  the vendored llama.cpp (default: the crate's copy under ~/.cargo/registry), or a tarball
#        made with --pack (for a GPU machine with nvcc but no Rust).
# --out  where the libraries go (default: target/release/backends, where target/release/axle
#        looks; any folder works with AXLE_BACKENDS_DIR=DIR).
# $AXLE_BACKEND_CMAKE_ARGS: more cmake options (for experiments, e.g. -DGGML_CUDA_GRAPHS=OFF).
# --arch CMAKE_CUDA_ARCHITECTURES (default: native, the GPUs of this machine; 90-real = H100/H200).
# cuda: about 5 minutes on 16 cores for one arch. rpc: about 2 minutes on 2 cores, no toolkit.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version=0.1.161
src="" out="$root/target/release/backends" arch=native pack="" backends=""
while [ $# -gt 0 ]; do
  case "$1" in
    cuda|rpc|cuda,rpc|rpc,cuda) backends="$1"; shift ;;
    --src) src="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --tools)
      echo "error: the vendored llama.cpp has no sources for its tools; build them with scripts/build-llama-tools.sh" >&2
      exit 2 ;;
    --pack) pack="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

vendored() {
  local d
  for d in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/llama-cpp-sys-2-$version/llama.cpp; do
    [ -d "$d" ] && { echo "$d"; return 0; }
  done
  echo "error: llama-cpp-sys-2 $version's source is not in the cargo registry; run 'cargo fetch' first" >&2
  return 1
}

if [ -n "$pack" ]; then
  d="$(vendored)"
  tar czf "$pack" -C "$d" --exclude=./models --exclude=./docs --exclude=./tests \
    --exclude=./gguf-py --exclude=./tools/ui --exclude='./build*' .
  echo "packed $d -> $pack ($(du -h "$pack" | cut -f1))"
  exit 0
fi

[ -n "$src" ] || src="$(vendored)"
copied=0
if [ -f "$src" ]; then
  dir="$(mktemp -d)/llama.cpp"
  mkdir -p "$dir"
  tar xzf "$src" -C "$dir"
  src="$dir"
  copied=1
fi
[ -n "$backends" ] || { echo "usage: $0 cuda|rpc|cuda,rpc [options]" >&2; exit 2; }
cuda=OFF rpc=OFF
case ",$backends," in *,cuda,*) cuda=ON ;; esac
case ",$backends," in *,rpc,*) rpc=ON ;; esac
if [ $cuda = ON ]; then
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || {
    echo "error: nvcc not found (install the CUDA toolkit)" >&2; exit 1; }
  export PATH="$PATH:/usr/local/cuda/bin"
fi
# The CUDA backend carries Axle's column-invariant quantized products (crates/axle-kernels/cuda/: one kernel
# and a hook that runs it only for products that ask for it, so libllama and llama.cpp's tools
# are unchanged), added to a copy of the source. AXLE_BACKEND_PLAIN=1 builds ggml as vendored.
if [ $cuda = ON ] && [ "${AXLE_BACKEND_PLAIN:-0}" != 1 ]; then
  if [ $copied = 0 ]; then
    dir="$(mktemp -d)/llama.cpp"
    mkdir -p "$dir"
    tar -C "$src" --exclude='./build*' -cf - . | tar -C "$dir" -xf -
    src="$dir"
  fi
  python3 "$root/crates/axle-kernels/cuda/apply.py" "$src"
fi
build="${AXLE_BACKEND_BUILD_DIR:-$src/build-axle-${backends/,/-}}"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
# GGML_BACKEND_DL: the backend is a loadable module exporting ggml_backend_init. $ORIGIN: it
# finds the libggml-base.so beside it wherever the folder is copied.
cmake -S "$src" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_CUDA=$cuda -DGGML_RPC=$rpc -DGGML_BACKEND_DL=ON -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DCMAKE_BUILD_RPATH='$ORIGIN' -DCMAKE_INSTALL_RPATH='$ORIGIN' \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TOOLS=OFF ${AXLE_BACKEND_CMAKE_ARGS:-} >/dev/null
targets=()
[ $cuda = ON ] && targets+=(ggml-cuda)
[ $rpc = ON ] && targets+=(ggml-rpc)
cmake --build "$build" --config Release -j "$(nproc)" --target "${targets[@]}"
mkdir -p "$out"
for b in ${backends//,/ }; do
  find "$build" -name "libggml-$b.so*" -exec cp -a {} "$out/" \;
done
find "$build" -name 'libggml-base.so*' -exec cp -a {} "$out/" \;
echo "backends ($backends) in $out:"
ls -la "$out"
echo "run axle from target/release, or set AXLE_BACKENDS_DIR=$out, then: axle doctor"
