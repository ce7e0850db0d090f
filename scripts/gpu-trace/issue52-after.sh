#!/usr/bin/env bash
# Issue 52, after the gate-up fusion fix: Axle's own measurements as soon as the CUDA backend is
# built, then exactness and llama.cpp's references where its tools were built. Parts, each within
# one device call:
#   scripts/gpu-trace/issue52-after.sh axle    compare pp512/pp4096/tg128 with the host split of
#                                              each step; the scheduler's splits of a prefill
#                                              chunk (GGML_SCHED_DEBUG); a traced decode (the
#                                              fused gate-up kernel)
#   scripts/gpu-trace/issue52-after.sh rest    the device-check on the 8B file; llama-bench
#                                              pp512/pp4096/tg128 and one-sequence batched decode
#                                              at 512 and 2,048, llama.cpp's tools where built
#   scripts/gpu-trace/issue52-after.sh next    what the traces left open: ggml's mat-vec kernels'
#                                              registers in both builds, the device-check with
#                                              column-invariant products, a prefill chunk's
#                                              scheduler assignment
#   scripts/gpu-trace/issue52-after.sh vendored-bench  llama-bench built against the crate's
#                                              vendored tree (ggml 0.26.0) beside the sdist's
#                                              (0.25.3): the ggml version's share of the gap
# Outputs in $OUT.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device-env.sh"
SECONDS=0
logs=/tmp/alogs; mkdir -p $logs
S="$out/summary.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt" >>"$S"
cp "$root/.device/commit" "$out/axle-commit.txt"
left() { [ $SECONDS -lt "${BUDGET:-560}" ] || { echo "out of time at ${SECONDS}s" | tee -a "$S"; return 1; }; }
case "${1:?axle|rest|next|vendored-bench}" in
  axle)
    for ((i = 0; i < ${WAIT:-560}; i += 5)); do [ -e "$w/logs/build.rc" ] && break; sleep 5; done
    echo "backend rc $(cat $w/logs/build.rc 2>/dev/null || echo running) after ${SECONDS}s" | tee -a "$S"
    [ "$(cat $w/logs/build.rc 2>/dev/null)" = 0 ] || exit 1
    left && { "$axle" bench compare --model "$m" --device cuda0 --prefill 512,4096 --decode 128 --reps 3 \
      --output-root "$out" 2>&1 | grep -v "CUDA Graph" >"$out/axle-compare.txt"; tail -n 8 "$out/axle-compare.txt" | tee -a "$S"; }
    left && { GGML_SCHED_DEBUG=1 AXLE_GGML_LOG=1 "$axle" bench compare --model "$m" --device cuda0 --prefill 4096 \
      --decode 0 --reps 1 --output-root $logs/sd >$logs/sched.log 2>&1
      grep -E "SPLIT" $logs/sched.log | sort | uniq -c | sort -rn | head -n 12 | tee -a "$S"; }
    tr="$w/bin/libcupti-trace.so"
    left && [ -f "$tr" ] && { CUDA_INJECTION64_PATH="$tr" TRACE_OUT=/tmp/ax-tg2.tsv "$axle" bench batched --model "$m" \
      --device cuda0 --prompt 32 --steps 64 --reps 1 --concurrency 1 --output-root $logs/tg >$logs/tg.log 2>&1
      python3 "$here/analyze.py" /tmp/ax-tg2.tsv --label "axle 1 sequence, fused gate-up" --region axle_pa_chunk \
        --steps 32 2>&1 | head -n 22 | tee -a "$S"
      gzip -6 /tmp/ax-tg2.tsv && cp /tmp/ax-tg2.tsv.gz "$out/"; }
    ;;
  next)
    # What this session's traces left open (docs/gpu.md, "Where a step's time goes"):
    # registers and shared memory of ggml's mat-vec kernels in Axle's backend (ggml 0.26.0) and in
    # the tools' build (0.25.3); the device-check with the column-invariant products, whose one-
    # column steps take ggml's fused gate-up kernel; the scheduler's node assignment of a prefill
    # chunk.
    export PATH="$PATH:/usr/local/cuda/bin"
    for lib in "$w/bin/backends/libggml-cuda.so" "$(find "$w/bin/llama-tools" /tmp -name 'libggml-cuda*' \
        -o -name 'llama-bench' 2>/dev/null | grep -v backends | head -n 1)"; do
      [ -e "$lib" ] || continue
      echo "== $lib" | tee -a "$S"
      cuobjdump -res-usage "$lib" 2>/dev/null | grep -A1 'mul_mat_vec_q' | grep -oE 'REG:[0-9]+|SHARED:[0-9]+' \
        | paste -sd' ' | tr ' ' '\n' | sort | uniq -c | tee -a "$S"
    done
    left && { AXLE_DEVICE_PRODUCTS=columns "$axle" bench device-check --model "$m" --device cuda0 \
      --output "$out/device-check-columns.json" 2>&1 | grep -v "CUDA Graph" | tail -n 6 | tee -a "$S"; }
    left && { GGML_SCHED_DEBUG=2 AXLE_GGML_LOG=1 "$axle" bench compare --model "$m" --device cuda0 --prefill 1024 \
      --decode 0 --reps 1 --output-root $logs/sd2 >$logs/sched2.log 2>&1
      grep -E "^node #|SPLIT" $logs/sched2.log | grep -B2 -A40 "SPLIT #0: CPU" | head -n 80 >"$out/sched-nodes.txt"; }
    ;;
  vendored-bench)
    # llama-bench from the sdist's sources, built against the crate's vendored tree (ggml 0.26.0,
    # the kernels Axle and its in-process libllama run), plainly (no Axle patches): beside the
    # sdist's own build it tells the ggml version's share of the single-stream gap.
    export PATH="$PATH:/usr/local/cuda/bin"
    vt=/tmp/vendored-tree; rm -rf $vt /tmp/sdist-tree; mkdir -p $vt /tmp/sdist-tree
    tar xzf "$w/llama-src.tgz" -C $vt && tar xzf "$root/.device/llama-tools-src.tgz" -C /tmp/sdist-tree ./tools/llama-bench
    rm -rf $vt/tools/llama-bench && cp -r /tmp/sdist-tree/tools/llama-bench $vt/tools/
    printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(llama-bench)\n' >$vt/tools/CMakeLists.txt
    gen=(); command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
    cmake -S $vt -B $vt/build "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
      -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF >$logs/vt-cmake.log 2>&1 \
      && cmake --build $vt/build -j "$(nproc)" --target llama-bench >$logs/vt-build.log 2>&1 \
      || { tail -n 20 $logs/vt-cmake.log $logs/vt-build.log | tee -a "$S"; exit 1; }
    b="$(find $vt/build -name llama-bench -type f | head -n 1)"
    for bench in "$b" "$tools/llama-bench"; do
      [ -x "$bench" ] && left && "$bench" -m "$m" -ngl 99 -fa 1 -p 512 -n 128 -r 3 2>/dev/null | grep -E 'pp512|tg128' \
        | sed "s|^|$bench: |" | tee -a "$S"
    done
    ;;
  rest)
    left && { "$axle" bench device-check --model "$m" --device cuda0 --output "$out/device-check.json" 2>&1 \
      | grep -v "CUDA Graph" | tail -n 30 >"$out/device-check.txt"; tail -n 14 "$out/device-check.txt" | tee -a "$S"; }
    [ -x "$tools/llama-bench" ] && left && { "$tools/llama-bench" -m "$m" -ngl 99 -fa 1 -p 512,4096 -n 128 -r 3 -o json \
      >"$out/llama-bench.json" 2>"$out/llama-bench.txt"; python3 -c "
import json,sys
for r in json.load(open(sys.argv[1])): print('llama-bench', 'pp%d'%r['n_prompt'] if r['n_prompt'] else 'tg%d'%r['n_gen'], round(r['avg_ts'],1))" \
      "$out/llama-bench.json" | tee -a "$S"; }
    for p in 512 2048; do
      left || break
      [ -x "$tools/llama-batched-bench" ] && "$tools/llama-batched-bench" -m "$m" -ngl 99 -fa 1 -c $((p * 2 + 256)) \
        -b 2048 -ub 512 -npp $p -ntg 128 -npl 1 2>/dev/null | grep -E '^\|' | tail -n 1 | tee -a "$S"
      "$axle" bench batched --model "$m" --device cuda0 --prompt $p --steps 128 --reps 1 --concurrency 1 \
        --output-root "$out/b$p" 2>&1 | grep -E '^\| seqs' | tee -a "$S"
    done
    ;;
esac
echo "part done in ${SECONDS}s" | tee -a "$S"
