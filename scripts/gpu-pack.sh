#!/usr/bin/env bash
# Packs what a GPU machine without Rust needs into .device/ (git-ignored): the release axle binary
# ($AXLE_BIN, default target/release/axle; build a portable one for a machine whose CPU differs)
# (gzip), the vendored llama.cpp source, the gguf wheel and the real models' sha256 sums; and the
# real models cut into chunks of CHUNK_MB (default 40) megabytes in .chunks/, numbered in order
# (MODELS=0: no real models, for runs on random-weight files only).
# Each device call carries one chunk in .devcall/ (`scripts/gpu-machine.sh chunks` appends it
# there): what travels in one call is limited to 64 MiB.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/.device"
models="$("$root/scripts/fetch-models.sh")"
rm -rf "$out" "$root/.chunks" && mkdir -p "$out" "$root/.chunks"
gzip -c "${AXLE_BIN:-$root/target/release/axle}" >"$out/axle.gz"
# The commit the binary was built from (the device's copy of the tree cannot say): artifacts
# written there are stamped with it (AXLE_GIT_COMMIT, set by gpu-bench.sh).
git -C "$root" rev-parse HEAD >"$out/commit"
# A vocabulary for the random 8B files on the device (fixtures are written by setup-tests.sh, not in git).
cp "$root/fixtures/llama-tiny.gguf" "$out/"
"$root/scripts/build-backend.sh" --pack "$out/llama-src.tgz"
# llama.cpp's own tools (llama-bench, llama-batched-bench, llama-server), the speed reference.
"$root/scripts/build-llama-tools.sh" --pack "$out/llama-tools-src.tgz"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$out" gguf==0.19.0
(cd "$models" && sha256sum SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf) >"$out/models.sha256"
i=0
[ "${MODELS:-1}" = 0 ] && { ls -la "$out"; exit 0; }
for m in SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf; do
  tmp="$(mktemp -d)"
  split -b "${CHUNK_MB:-40}M" -d -a 2 "$models/$m" "$tmp/p"
  for p in "$tmp"/p*; do
    mv "$p" "$root/.chunks/chunk-$(printf %02d $i)-${m%.gguf}"
    i=$((i + 1))
  done
  rm -rf "$tmp"
done
ls -la "$out" "$root/.chunks"
