#!/usr/bin/env bash
# Issue 52's measurements on a GPU machine prepared by `scripts/gpu-machine.sh start 8b`, in parts
# that each fit one device call (at most 10 minutes), all against llama.cpp's own tools in the
# same session (scripts/gpu-reference.sh), Axle with ggml's per-row attention and with its paged
# attention:
#
#   scripts/gpu-issue52.sh OUT kernels     the standalone kernel test and timing table
#   scripts/gpu-issue52.sh OUT single      llama-bench pp512/pp4096/tg128/tg128@8192 and Axle's compare
#   scripts/gpu-issue52.sh OUT batched P [MODES]  llama-batched-bench and Axle at P-token prompts,
#                                          1/16/64/128 sequences (P: 512, 2048 or 8192), with each
#                                          --device-attention mode of MODES (default paged; e.g. rows,paged)
#   scripts/gpu-issue52.sh OUT kv P SEQS                  the KV types at P-token prompts: llama-batched-bench
#                                          and `axle bench batched` with F16 KV, then both with
#                                          Q8_0 KV (-ctk/-ctv q8_0, --kv-type q8_0); SEQS e.g. 1,16
#   scripts/gpu-issue52.sh OUT kv-check    `axle bench device-check --kv-type q8_0` on the Q4_0
#                                          file: Q8_0 KV's greedy output against F16 KV's, and
#                                          speculation on == off with Q8_0 KV
#   scripts/gpu-issue52.sh OUT serve C P [T] [MODEL]  axle bench serve: C streaming clients with
#                                          P-token prompts and T new tokens (default 128) against
#                                          `axle serve` and llama.cpp's `llama-server` (MODEL:
#                                          q4_0 or q4_k_m, default q4_0; llama-server caps each slot
#                                          at the file's trained context, 8192: P + T at most that)
#
# Then: scripts/gpu-reference-table.py OUT/<part> --doc docs/gpu.md --section NAME.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:?usage: $0 OUT kernels|single|batched P [MODES]}"
part="${2:?usage: $0 OUT kernels|single|batched P [MODES]}"
case "$part" in
  kernels)
    mkdir -p "$out"
    "$root/scripts/gpu-machine.sh" kernels | tee "$out/paged-attention-test.txt"
    ;;
  single)
    "$root/scripts/gpu-reference.sh" "$out/single" single q4_0
    ;;
  batched)
    p="${3:?prompt length}"
    seqs=1,16,64,128
    [ "$p" -ge 8192 ] && seqs=1,16,64
    for mode in $(echo "${4:-paged}" | tr , ' '); do
      AXLE_ARGS="--device-attention $mode" \
        "$root/scripts/gpu-reference.sh" "$out/batched-p$p-$mode" batched "$p" "$seqs" q4_0
    done
    ;;
  kv)
    p="${3:?prompt length}" seqs="${4:?sequences}"
    "$root/scripts/gpu-reference.sh" "$out/kv-p$p-f16" batched "$p" "$seqs" q4_0
    AXLE_ARGS="--kv-type q8_0" LLAMA_ARGS="-ctk q8_0 -ctv q8_0" \
      "$root/scripts/gpu-reference.sh" "$out/kv-p$p-q8_0" batched "$p" "$seqs" q4_0
    ;;
  kv-check)
    w="${AXLE_GPU_WORK:-/root/axle-gpu}"
    mkdir -p "$out"
    [ -s "$root/.device/commit" ] && export AXLE_GIT_COMMIT="$(cat "$root/.device/commit")"
    AXLE_BACKENDS_DIR="$w/bin/backends" "$w/bin/axle" bench device-check \
      --model "$w/models/llama3-8b-q4_0.gguf" --device cuda0 --kv-type q8_0 \
      --output "$out/device-check-q8_0.json" 2>&1 | grep -v "CUDA Graph id" | tee "$out/device-check-q8_0.txt"
    ;;
  serve)
    c="${3:?clients}" p="${4:?prompt length}" t="${5:-128}" q="${6:-q4_0}"
    w="${AXLE_GPU_WORK:-/root/axle-gpu}"
    mkdir -p "$out"
    [ -s "$root/.device/commit" ] && export AXLE_GIT_COMMIT="$(cat "$root/.device/commit")"
    AXLE_BACKENDS_DIR="$w/bin/backends" "$w/bin/axle" bench serve \
      --model "$w/models/llama3-8b-$q.gguf" --clients "$c" --prompt "$p" --tokens "$t" \
      --llama-server "$w/bin/llama-tools/llama-server" \
      --llama-arg=-ngl --llama-arg=999 --llama-arg=-fa --llama-arg=on \
      --axle-arg=--threads --axle-arg=8 \
      --output "$out/serve-$q-c$c-p$p-t$t.json"
    ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
