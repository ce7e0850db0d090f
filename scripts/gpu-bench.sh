#!/usr/bin/env bash
# Runs the GPU checks and benchmarks on a lent GPU machine prepared by `scripts/gpu-machine.sh`
# (backend built, models assembled), writing reports and artifacts to OUT_DIR. Each step fits in
# one device call; run them one by one or together:
#
#   scripts/gpu-bench.sh OUT_DIR dc [MODEL...]   device-check (logits vs libllama, speculation and
#                                               batching identity) of the real models and fixtures,
#                                               on $DC_DEVICE (default cuda0; cuda0,cuda1 splits)
#   scripts/gpu-bench.sh OUT_DIR scenario NAME...  the manifests benchmarks/manifests/gpu/NAME.toml
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
w="${AXLE_GPU_WORK:-/root/axle-gpu}"
out="${1:?usage: $0 OUT_DIR dc|scenario ...}"
step="${2:?usage: $0 OUT_DIR dc|scenario ...}"
shift 2
mkdir -p "$out" "$w/logs"
export AXLE_BACKENDS_DIR="$w/bin/backends" AXLE_MODEL_DIR="$w/models"
if [ -s "$root/.device/commit" ]; then
  AXLE_GIT_COMMIT="$(cat "$root/.device/commit")"
  export AXLE_GIT_COMMIT
fi
axle="$w/bin/axle"
status=0
case "$step" in
  dc)
    models=("$@")
    [ ${#models[@]} -gt 0 ] || models=(smollm2 gemma3 llama-tiny qwen2-tiny qwen3-tiny mistral-swa-tiny)
    for m in "${models[@]}"; do
      case "$m" in
        smollm2) f="$w/models/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
        gemma3) f="$w/models/gemma-3-270m-q4_k_m.gguf" ;;
        *) f="$root/fixtures/$m.gguf"; [ -e "$f" ] || f="$root/.device/$m.gguf" ;;
      esac
      echo "== device-check $m" >&2
      "$axle" bench device-check --model "$f" --device "${DC_DEVICE:-cuda0}" --threads 8 \
        --output "$out/dc-$m${DC_SUFFIX:-}.json" 2>"$w/logs/dc-$m.log" | tail -n 12 || status=1
    done
    ;;
  scenario)
    for n in "$@"; do
      echo "== scenario $n" >&2
      "$axle" bench scenario --manifest "$root/benchmarks/manifests/gpu/$n.toml" \
        --output-root "$out" 2>"$w/logs/$n.log" | tail -n 30 || status=1
    done
    ;;
  *)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
exit $status
