#!/usr/bin/env bash
# Axle against llama.cpp's own tools on a lent GPU machine prepared by `scripts/gpu-machine.sh
# start 8b` (backend and tools built, random 8B files written), same session, same files:
#
#   scripts/gpu-reference.sh OUT_DIR single [TYPE...]   llama-bench pp512 / pp4096 / tg128 /
#                                                     tg128 at depth 8192, then `axle bench
#                                                     compare` on the same file
#   scripts/gpu-reference.sh OUT_DIR batched PROMPT SEQS [TYPE...]
#                                                     llama-batched-bench -npp PROMPT -ntg 32
#                                                     -npl SEQS, then `axle bench batched` with
#                                                     the same prompt, steps and concurrency
# TYPE: q4_0 (default) and/or q4_k_m. Outputs: OUT_DIR/*.json (tools) and *.txt (logs).
# $AXLE_ARGS: more options for `axle bench batched` (e.g. --device-attention rows);
# $LLAMA_ARGS: more options for llama-batched-bench (e.g. -ctk q8_0 -ctv q8_0).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
w="${AXLE_GPU_WORK:-/root/axle-gpu}"
out="${1:?usage: $0 OUT_DIR single|batched ...}"
what="${2:?usage: $0 OUT_DIR single|batched ...}"
shift 2
mkdir -p "$out"
export AXLE_BACKENDS_DIR="$w/bin/backends"
tools="$w/bin/llama-tools"
axle="$w/bin/axle"
cat "$tools/COMMIT" >"$out/reference-source.txt" 2>/dev/null
# The commit the axle binary was built from (the device's copy of the tree cannot say).
if [ -s "$root/.device/commit" ]; then
  AXLE_GIT_COMMIT="$(cat "$root/.device/commit")"
  export AXLE_GIT_COMMIT
  cp "$root/.device/commit" "$out/axle-commit.txt"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$out/device.txt"
status=0
case "$what" in
  single)
    types=("$@")
    [ ${#types[@]} -gt 0 ] || types=(q4_0)
    for t in "${types[@]}"; do
      m="$w/models/llama3-8b-$t.gguf"
      "$tools/llama-bench" -m "$m" -ngl 99 -fa 1 -p 512,4096 -n 128 -r 3 -o json \
        >"$out/llama-bench-$t.json" 2>"$out/llama-bench-$t.txt" || status=1
      "$tools/llama-bench" -m "$m" -ngl 99 -fa 1 -p 0 -n 128 -d 8192 -r 2 -o json \
        >"$out/llama-bench-d8192-$t.json" 2>>"$out/llama-bench-$t.txt" || status=1
      "$axle" bench compare --model "$m" --device cuda0 --prefill 512,4096 --decode 128 --reps 3 \
        --output-root "$out" 2>&1 | grep -v "CUDA Graph id" >"$out/axle-compare-$t.txt" || status=1
    done
    ;;
  batched)
    prompt="${1:?PROMPT}" seqs="${2:?SEQS}"
    shift 2
    types=("$@")
    [ ${#types[@]} -gt 0 ] || types=(q4_0)
    for t in "${types[@]}"; do
      m="$w/models/llama3-8b-$t.gguf"
      ctx=$(( (prompt + 64) * ${seqs//,*/} ))
      for s in ${seqs//,/ }; do [ $(( (prompt + 64) * s )) -gt $ctx ] && ctx=$(( (prompt + 64) * s )); done
      "$tools/llama-batched-bench" -m "$m" -ngl 99 -fa 1 -c "$ctx" -b 2048 -ub 512 ${LLAMA_ARGS:-} \
        -npp "$prompt" -ntg 32 -npl "$seqs" --output-format jsonl \
        >"$out/llama-batched-bench-$t-p$prompt.jsonl" 2>"$out/llama-batched-bench-$t-p$prompt.txt" || status=1
      "$axle" bench batched --model "$m" --device cuda0 --prompt "$prompt" --steps 32 --reps 1 ${AXLE_ARGS:-} \
        --concurrency "$seqs" --output-root "$out" 2>&1 | grep -v "CUDA Graph id" \
        >"$out/axle-batched-$t-p$prompt.txt" || status=1
    done
    ;;
  *) echo "unknown step $what" >&2; exit 2 ;;
esac
ls -la "$out"
exit $status
