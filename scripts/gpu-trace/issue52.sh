#!/usr/bin/env bash
# Call 2 on the lent GPU (after setup.sh): where a decode step's time goes, Axle against llama.cpp's
# own tools on the same random Llama-3-8B Q4_0 file, kernel by kernel, from CUPTI traces:
#   - one sequence: llama-bench tg (-p 0 -n 64) and `axle bench batched --concurrency 1 --prompt 32`;
#   - 16 sequences at 2,048-token prompts: llama-batched-bench and `axle bench batched`;
#   - prefill of 4,096 tokens: llama-bench pp4096 and `axle bench compare --prefill 4096`;
# then untraced timings of one sequence with each of Axle's arithmetic choices. Outputs in $OUT:
# summary.txt (analyze.py's tables), traces.tgz (the raw traces, gzip), logs.tgz.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device-env.sh"
SECONDS=0
for ((i = 0; i < 400; i += 5)); do [ -e "$w/logs/build.rc" ] && break; sleep 5; done
echo "backend rc $(cat $w/logs/build.rc) after ${SECONDS}s"
t=/tmp/traces; logs=/tmp/tlogs; rm -rf $t $logs; mkdir -p $t $logs
S="$out/summary.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt" >"$S"
cp "$root/.device/commit" "$out/axle-commit.txt"
tr="$w/bin/libcupti-trace.so"
run() { # NAME COMMAND... (traced when the tracer exists)
  local name=$1; shift
  echo "[$name] $*" >>"$out/commands.txt"
  local t0=$SECONDS
  if [ -f "$tr" ]; then
    CUDA_INJECTION64_PATH="$tr" TRACE_OUT="$t/$name.tsv" "$@" >"$logs/$name.log" 2>&1
  else
    "$@" >"$logs/$name.log" 2>&1
  fi
  echo "[$name] rc $? in $((SECONDS - t0)) s" | tee -a "$S"
}
an() { python3 "$here/analyze.py" "$@" 2>&1 | tee -a "$S"; }
run ax-tg "$axle" bench batched --model "$m" --device cuda0 --prompt 32 --steps 64 --reps 1 --concurrency 1 --output-root $logs/ax-tg
an "$t/ax-tg.tsv" --label "axle 1 sequence" --region axle_pa_chunk --steps 32
grep -E '^\| seqs' "$logs/ax-tg.log" | tee -a "$S"
run ax-16 "$axle" bench batched --model "$m" --device cuda0 --prompt 2048 --steps 32 --reps 1 --concurrency 16 --output-root $logs/ax-16
an "$t/ax-16.tsv" --label "axle 16 x 2048" --region axle_pa_chunk --steps 16
grep -E '^\| seqs' "$logs/ax-16.log" | tee -a "$S"
run ax-pp "$axle" bench compare --model "$m" --device cuda0 --prefill 4096 --decode 0 --reps 1 --output-root $logs/ax-pp
an "$t/ax-pp.tsv" --label "axle compare pp4096 (first 4096-token prefills: Axle's settle runs)" --per-step 520 --first --steps 2
grep -E '^\| pp' "$logs/ax-pp.log" | tee -a "$S"
gzip -6 "$t"/ax-*.tsv; tar cf "$out/traces-axle.tar" -C "$t" $(cd "$t" && ls ax-*.gz)
for ((i = 0; i < 400; i += 5)); do [ -e "$w/logs/tools.rc" ] && break; sleep 5; done
echo "tools rc $(cat $w/logs/tools.rc) after ${SECONDS}s" | tee -a "$S"
run lb-tg "$tools/llama-bench" -m "$m" -ngl 99 -fa 1 -p 0 -n 64 -r 1
an "$t/lb-tg.tsv" --label "llama-bench tg64" --steps 32
run bb-16 "$tools/llama-batched-bench" -m "$m" -ngl 99 -fa 1 -c 33792 -b 2048 -ub 512 -npp 2048 -ntg 32 -npl 16
an "$t/bb-16.tsv" --label "llama-batched-bench 16 x 2048" --steps 16
grep -E '^\|' "$logs/bb-16.log" | tail -n 2 | tee -a "$S"
run lb-pp "$tools/llama-bench" -m "$m" -ngl 99 -fa 1 -p 4096 -n 0 -r 1
an "$t/lb-pp.tsv" --label "llama-bench pp4096" --per-step 260 --steps 2
grep -E '^\|' "$logs/lb-pp.log" | tail -n 1 | tee -a "$S"
gzip -6 "$t"/*.tsv; tar cf "$out/traces-llama.tar" -C "$t" $(cd "$t" && ls lb-*.gz bb-*.gz)
ls -la "$t" | tee -a "$S"
# Untraced: one sequence, each arithmetic choice (decode after a 512-token prompt).
for v in "" "--device-products groups" "--device-products wide" "--device-attention rows" "--fast-kernels" "--fused-projections off"; do
  [ $SECONDS -gt ${BUDGET:-520} ] && { echo "out of time before [$v]" | tee -a "$S"; break; }
  "$axle" bench batched --model "$m" --device cuda0 --prompt 512 --steps 128 --reps 1 --concurrency 1 $v \
    --output-root $logs/plain >"$logs/plain.log" 2>&1
  echo "[${v:-default}] $(grep -E '^\| seqs' "$logs/plain.log")" | tee -a "$S"
done
"$tools/llama-bench" -m "$m" -ngl 99 -fa 1 -p 0 -n 128 -r 2 2>/dev/null | grep -E 'tg128' | tee -a "$S"
tar czf "$out/logs.tgz" -C $logs .
echo "total ${SECONDS}s" | tee -a "$S"
