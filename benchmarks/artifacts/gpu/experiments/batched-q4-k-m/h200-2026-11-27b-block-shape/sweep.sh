#!/usr/bin/env bash
# Q4_K_M block-shape sweep: AXLE_CI_SHAPE alternated, batched 16 and 64 sequences.
set -uo pipefail
w=/root/axle-gpu
export AXLE_BACKENDS_DIR=$w/bin/backends AXLE_MODEL_DIR=$w/models AXLE_GIT_COMMIT=$(cat .device/commit)
out=$1; shift
mkdir -p $out
for shape in "$@"; do
  echo "== shape $shape"
  if [ "$shape" = default ]; then unset AXLE_CI_SHAPE; else export AXLE_CI_SHAPE=$shape; fi
  $w/bin/axle bench batched --model $w/models/llama3-8b-q4_k_m.gguf --device cuda0 --threads 8 \
    --concurrency 16,64 --steps 16 --reps 1 --output-root $out/$shape 2>$out/$shape.log | tail -n 8
done
