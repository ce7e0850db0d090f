#!/usr/bin/env bash
# Call 2 on the lent GPU (after setup.sh): `axle bench batched`, 8192-token prompt, F16 KV then
# Q8_0 KV: plain (timing), then under the CUPTI tracer (every kernel with timestamps), then each
# trace summarized per decode step by analyze.py. Outputs in $OUT (few files: the device returns 8).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/scripts/gpu-trace"
w=/root/axle-gpu
SECONDS=0
for ((i = 0; i < ${WAIT:-400}; i += 5)); do
  [ -e "$w/logs/build.rc" ] && [ -e "$w/logs/models.rc" ] && break
  sleep 5
done
echo "build rc $(cat $w/logs/build.rc 2>/dev/null || echo running), models rc $(cat $w/logs/models.rc 2>/dev/null || echo running), waited ${SECONDS}s"
[ "$(cat $w/logs/build.rc 2>/dev/null)" = 0 ] && [ "$(cat $w/logs/models.rc 2>/dev/null)" = 0 ] || { tail -n 20 $w/logs/build.log $w/logs/models.log; exit 1; }
export AXLE_BACKENDS_DIR="$w/bin/backends" AXLE_GIT_COMMIT="$(cat "$root/.device/commit")"
m="$w/models/llama3-8b-q4_0.gguf"
logs=/tmp/kvlogs; rm -rf $logs; mkdir -p $logs
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/device.txt" >>"$S"
pack() {
# Raw traces, trimmed to Axle's part (before libllama's first kernel after the last paged-attention one).
for t in /tmp/trace*.tsv; do
  python3 - "$t" <<'PY'
import sys, gzip
p = sys.argv[1]; last = 0
for line in open(p, errors="replace"):
    if line.startswith("K\t") and "axle_pa_chunk" in line:
        last = max(last, int(line.split("\t")[2]))
with gzip.open(p + ".gz", "wt", compresslevel=6) as o:
    for line in open(p, errors="replace"):
        f = line.split("\t", 2)
        if len(f) > 1 and f[1].isdigit() and int(f[1]) > last + 20_000_000: continue
        o.write(line)
PY
done
ls -la /tmp/trace*.gz
tar czf "$OUT/traces.tgz" -C /tmp $(cd /tmp && ls trace*.tsv.gz) 
}
bench() { # NAME KV SEQS STEPS REPS [env...]
  local name=$1 kv=$2 seqs=$3 steps=$4 reps=$5; shift 5
  local cmd="$w/bin/axle bench batched --model $m --device cuda0 --prompt 8192 --steps $steps --reps $reps --kv-type $kv --concurrency $seqs --output-root $logs/$name"
  echo "[$name] ${*:+$* }$cmd" | tee -a "$OUT/commands.txt"
  local t0=$SECONDS
  env "$@" $cmd >$logs/$name.log 2>&1
  echo "[$name] rc $? in $((SECONDS - t0)) s" | tee -a "$S"
  grep -E '^\| seqs' $logs/$name.log | tee -a "$S"
  # ggml's debug lines about CUDA graphs, counted (numbers stripped).
  grep -iE 'graph|disabl' $logs/$name.log | sed -E 's/[0-9]+/N/g' | sort | uniq -c | sort -rn | head -8 | tee -a "$S"
}
tr=$w/bin/libcupti-trace.so
[ -f $tr ] || { echo "no tracer: timing only" | tee -a "$S"; tr=/dev/null/none; }
for kv in f16 q8_0; do
  if [ -f $tr ]; then
    bench trace-$kv $kv 1 32 1 CUDA_INJECTION64_PATH=$tr TRACE_OUT=/tmp/trace-$kv.tsv
  else
    bench plain-$kv $kv 1 32 1; continue
  fi
  python3 "$here/analyze.py" /tmp/trace-$kv.tsv --steps 32 --label "1 sequence, $kv KV" 2>&1 | tee -a "$S"
  pack
  tar czf "$OUT/logs.tgz" -C $logs .
done
[ "${LEAN:-0}" = 1 ] && { ls -la "$OUT"; echo "total ${SECONDS}s (lean)"; exit 0; }
bench plain-f16 f16 1 64 1
bench plain-q8_0 q8_0 1 64 1
tar czf "$OUT/logs.tgz" -C $logs .
if [ $SECONDS -lt ${BUDGET16:-0} ]; then
  for kv in f16 q8_0; do
    bench trace16-$kv $kv 16 32 1 CUDA_INJECTION64_PATH=$w/bin/libcupti-trace.so TRACE_OUT=/tmp/trace16-$kv.tsv
    python3 "$here/analyze.py" /tmp/trace16-$kv.tsv --steps 32 --label "16 sequences, $kv KV" 2>&1 | tee -a "$S"
  done
  pack
fi
tar czf "$OUT/logs.tgz" -C $logs .
ls -la "$OUT"; echo "total ${SECONDS}s"
