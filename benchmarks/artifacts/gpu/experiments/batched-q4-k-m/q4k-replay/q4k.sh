#!/usr/bin/env bash
# Q4_K replay: exactness (device-check, wide products) and speed (batched, wide and default).
set -uo pipefail
# The runs below were made while the Q4_K replay was on by default; it is opt-in now.
export AXLE_WIDE_REPLAY_Q4K=1
w=/root/axle-gpu
export AXLE_BACKENDS_DIR=$w/bin/backends AXLE_MODEL_DIR=$w/models AXLE_GIT_COMMIT=$(cat .device/commit)
out=$1; step=$2
mkdir -p $out
m=$w/models/llama3-8b-q4_k_m.gguf
case $step in
  dc) AXLE_DEVICE_PRODUCTS=wide $w/bin/axle bench device-check --model $m --device cuda0 --threads 8 \
        --output $out/dc-llama3-8b-q4_k_m-wide.json 2>$out/dc.log | tail -n 14 ;;
  batched) for p in wide default; do
      echo "== products $p"
      extra=(); [ $p = wide ] && extra=(--device-products wide)
      $w/bin/axle bench batched --model $m --device cuda0 --threads 8 --concurrency ${3:-1,4,16,64} --steps 16 \
        --reps 1 "${extra[@]}" --output-root $out/$p 2>$out/batched-$p.log | tail -n 9
    done ;;
esac
