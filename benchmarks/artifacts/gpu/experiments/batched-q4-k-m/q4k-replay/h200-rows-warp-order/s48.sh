#!/usr/bin/env bash
# Session 48 device steps. usage: s48.sh OUT STEP [args]
set -uo pipefail
w=/root/axle-gpu
export AXLE_BACKENDS_DIR=$w/bin/backends AXLE_MODEL_DIR=$w/models AXLE_GIT_COMMIT=$(cat .device/commit)
out=$1; step=$2; shift 2
mkdir -p $out
m4k=$w/models/llama3-8b-q4_k_m.gguf
m40=$w/models/llama3-8b-q4_0.gguf
dc() { # name model [env...]
  local name=$1 model=$2; shift 2
  env "$@" AXLE_DEVICE_PRODUCTS=wide $w/bin/axle bench device-check --model $model --device cuda0 --threads 8 \
    --output $out/dc-$name.json 2>$out/dc-$name.log | tail -n 14
}
batched() { # name model products conc [env...]
  local name=$1 model=$2 p=$3 conc=$4; shift 4
  local extra=(); [ $p = wide ] && extra=(--device-products wide)
  echo "== $name products $p"
  env "$@" $w/bin/axle bench batched --model $model --device cuda0 --threads 8 --concurrency $conc --steps 16 \
    --reps 1 "${extra[@]}" --output-root $out/$name-$p 2>$out/batched-$name-$p.log | tail -n 9
}
case $step in
  dc40) dc llama3-8b-q4_0-wide $m40 ;;
  dc4k) dc llama3-8b-q4_k_m-wide $m4k AXLE_WIDE_REPLAY_Q4K=1 ;;
  dc4kd) dc llama3-8b-q4_k_m-wide-default-replay $m4k ;;
  b4k) batched q4k $m4k wide ${1:-1,4,16,64} AXLE_WIDE_REPLAY_Q4K=1
       batched q4k $m4k default ${1:-1,4,16,64} AXLE_WIDE_REPLAY_Q4K=1 ;;
  b4kw) batched q4k $m4k wide ${1:-1,4,16,64} AXLE_WIDE_REPLAY_Q4K=1 ;;
  b40w) batched q40 $m40 wide ${1:-1,4,16,64} ;;
  *) echo "unknown $step"; exit 2 ;;
esac
