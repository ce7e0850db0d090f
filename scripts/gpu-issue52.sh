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
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
