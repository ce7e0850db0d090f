#!/usr/bin/env bash
# Steps run on a lent GPU machine that has nvcc but no Rust and no package registry (see README,
# "GPU"). What it needs travels in .device/ (made here by `scripts/gpu-pack.sh`): the axle binary,
# the vendored llama.cpp source, the gguf wheel and the real models in chunks. Work happens in
# $AXLE_GPU_WORK (default /root/axle-gpu), which lives as long as the machine.
#
#   scripts/gpu-machine.sh start [8b|8b-q4_0|draft|70b|gpt-oss|none]  unpack, build the CUDA backend and
#                                     llama.cpp's own tools (the reference) in the background,
#                                     write the random-weight 8B files (or the 70B
#                                     Q4_K_M one for the several-GPU benchmarks, or a gpt-oss-20b
#                                     one) in the background
#   scripts/gpu-machine.sh chunks     append the model chunks carried in .devcall/ to the models
#   scripts/gpu-machine.sh wait [S]   wait up to S seconds for the background work, print its state
#   scripts/gpu-machine.sh models     assemble and sha256-check the real models, write the fixtures
#   scripts/gpu-machine.sh rebuild    rebuild the CUDA backend after a change to crates/axle-kernels/cuda/ only
#   scripts/gpu-machine.sh kernels    build and run the standalone kernel tests (paged attention)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
w="${AXLE_GPU_WORK:-/root/axle-gpu}"
mkdir -p "$w/models" "$w/logs" "$w/bin"
cmd="${1:-}"
shift || true
case "$cmd" in
  start)
    size="${1:-8b}"
    rm -f "$w/logs/"*.rc "$w/models/llama3-"*
    cp "$root/.device/llama-src.tgz" "$root/.device/models.sha256" "$w/"
    gunzip -c "$root/.device/axle.gz" >"$w/bin/axle" && chmod +x "$w/bin/axle"
    python3 -m pip install -q --no-index --no-deps --target "$w/site" "$root"/.device/gguf-*.whl
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
    setsid nohup bash -c "'$root/scripts/build-backend.sh' cuda --src '$w/llama-src.tgz' \
      --out '$w/bin/backends' --arch 90-real >'$w/logs/build.log' 2>&1; echo \$? >'$w/logs/build.rc'" \
      >/dev/null 2>&1 &
    # llama.cpp's own tools, the reference (scripts/build-llama-tools.sh --pack made the source).
    rm -f "$w/logs/tools.rc"
    if [ -s "$root/.device/llama-tools-src.tgz" ]; then
      setsid nohup bash -c "'$root/scripts/build-llama-tools.sh' --src '$root/.device/llama-tools-src.tgz' \
        --out '$w/bin/llama-tools' --arch 90-real >'$w/logs/tools.log' 2>&1; echo \$? >'$w/logs/tools.rc'" \
        >/dev/null 2>&1 &
    else
      echo "no .device/llama-tools-src.tgz: llama.cpp's tools are not built" | tee "$w/logs/tools.log"
      echo 1 >"$w/logs/tools.rc"
    fi
    # A byte-level BPE vocabulary for the random 8B files (the fixtures are not in git).
    vocab="$root/.device/llama-tiny.gguf"
    setsid nohup bash "$root/scripts/gpu-machine.sh" gen "$size" "$vocab" >/dev/null 2>&1 &
    echo "started: build and $size files in the background"
    ;;
  gen)
    size="$1" vocab="$2"
    case "$size" in
      8b) files=("llama3-8b q4_0" "llama3-8b q4_k_m") extra=() ;;
      8b-q4_0) files=("llama3-8b q4_0") extra=() ;;
      # A target and a draft model of one vocabulary (the draft model's step cost on the GPU).
      draft) files=("llama3-8b q4_0" "llama3-1b q4_0") extra=() ;;
      # 40 GiB: the same random bytes in every layer (--reuse-layers), written in about a minute.
      70b) files=("llama3-70b q4_k_m") extra=(--reuse-layers) ;;
      # 12 GiB, MXFP4 experts (the writer's gpt-oss shapes ignore --type).
      gpt-oss) files=("gpt-oss-20b mxfp4") extra=(--reuse-layers) ;;
      none) files=() extra=() ;;
      *) echo "unknown size $size" >&2; exit 2 ;;
    esac
    for f in ${files[@]+"${files[@]}"}; do
      read -r shape t <<<"$f"
      wt="$t"
      [ "$t" = mxfp4 ] && wt=q4_0
      PYTHONPATH="$w/site" python3 "$root/scripts/make-bench-model.py" --shape "$shape" --type "$wt" \
        "${extra[@]}" --vocab-from "$vocab" --out "$w/models/$shape-$t.gguf" \
        || { echo 1 >"$w/logs/models.rc"; exit 1; }
    done >"$w/logs/models.log" 2>&1
    echo 0 >"$w/logs/models.rc"
    ;;
  chunks)
    for f in "$root"/.devcall/chunk-*; do
      [ -e "$f" ] || continue
      name="$(basename "$f")"           # chunk-NN-MODEL
      model="${name#chunk-??-}"
      cat "$f" >>"$w/models/$model.part"
      echo "appended $name"
    done
    ls -la "$w/models"
    ;;
  wait)
    limit="${1:-540}"
    for ((i = 0; i < limit; i += 10)); do
      [ -e "$w/logs/build.rc" ] && [ -e "$w/logs/models.rc" ] && [ -e "$w/logs/tools.rc" ] && break
      sleep 10
    done
    echo "build rc: $(cat "$w/logs/build.rc" 2>/dev/null || echo running)"
    tail -n 3 "$w/logs/build.log" 2>/dev/null
    echo "tools rc: $(cat "$w/logs/tools.rc" 2>/dev/null || echo running)"
    tail -n 3 "$w/logs/tools.log" 2>/dev/null
    echo "models rc: $(cat "$w/logs/models.rc" 2>/dev/null || echo running)"
    tail -n 3 "$w/logs/models.log" 2>/dev/null
    ls -la "$w/bin/backends" "$w/models" 2>/dev/null
    ;;
  rebuild)
    # Rebuilds the CUDA backend after a change to crates/axle-kernels/cuda/ only: the ggml files it edits
    # come fresh from the packed source, the build reuses the first build's objects.
    src="$(dirname "$(ls -d /tmp/tmp.*/llama.cpp/build-axle-cuda | head -n 1)")"
    [ -d "$src" ] || { echo "no earlier build under /tmp: run start first" >&2; exit 1; }
    tar xzf "$w/llama-src.tgz" -C "$src" ./ggml/src/ggml-cuda/mmvq.cu ./ggml/src/ggml-cuda/mmvq.cuh \
      ./ggml/src/ggml-cuda/mmq.cu ./ggml/src/ggml-cuda/ggml-cuda.cu
    python3 "$root/crates/axle-kernels/cuda/apply.py" "$src"
    cmake --build "$src/build-axle-cuda" --config Release -j "$(nproc)" --target ggml-cuda >"$w/logs/rebuild.log" 2>&1 \
      || { tail -n 30 "$w/logs/rebuild.log"; exit 1; }
    find "$src/build-axle-cuda" -name 'libggml-cuda.so*' -exec cp -a {} "$w/bin/backends/" \;
    ls -la "$w/bin/backends"
    ;;
  models)
    cd "$w/models"
    for p in *.part; do
      [ -e "$p" ] || continue
      mv "$p" "${p%.part}.gguf"
    done
    sha256sum -c "$w/models.sha256"
    # The random-weight fixtures, from seeds (not in git; the same bytes as on the build machine).
    PYTHONPATH="$w/site" python3 "$root/scripts/make-fixtures.py" \
      --smollm2 "$w/models/SmolLM2-135M-Instruct.Q4_1.gguf" --out "$root/fixtures"
    ;;
  kernels)
    # Axle's standalone kernel tests on this GPU (no ggml, no Rust): paged attention against a
    # double-precision reference and bit for bit alone/batched/moved, then its timing table.
    export PATH="$PATH:/usr/local/cuda/bin"
    nvcc -O3 -use_fast_math -std=c++17 -arch=sm_90 -o "$w/bin/paged-attention-test" \
      "$root/crates/axle-kernels/cuda/paged-attention-test.cu" || exit 1
    "$w/bin/paged-attention-test"
    ;;
  *)
    echo "usage: $0 start|chunks|wait [S]|models|rebuild|kernels" >&2
    exit 2
    ;;
esac
