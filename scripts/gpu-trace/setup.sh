#!/usr/bin/env bash
# Call 1 on the lent GPU: `scripts/gpu-machine.sh start 8b` (CUDA backend, llama.cpp's own tools
# and the random 8B files, in the background), then the CUPTI tracer, built against the newest
# CUPTI headers there, then waits up to WAIT_S seconds for the background work (0: no wait).
#
#   scripts/gpu-trace/setup.sh [WAIT_S]
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/scripts/gpu-trace"
w="${AXLE_GPU_WORK:-/root/axle-gpu}"
"$root/scripts/gpu-machine.sh" start "${SIZE:-8b}"
export PATH="$PATH:/usr/local/cuda/bin"
inc=$(dirname "$(find /usr/local/cuda/ /usr/local/cuda*/ -name cupti_activity.h 2>/dev/null | head -n 1)")
lib=$(dirname "$(find /usr/local/cuda/ /usr/local/cuda*/ -name 'libcupti.so' 2>/dev/null | head -n 1)")
echo "cupti include $inc lib $lib"
kr=$(grep -o '} CUpti_ActivityKernel[0-9]*;' "$inc/cupti_activity.h" | tr -d '}; ' | sort -V | tail -n 1)
mr=$(grep -o '} CUpti_ActivityMemcpy[0-9]*;' "$inc/cupti_activity.h" | tr -d '}; ' | sort -V | tail -n 1)
sr=$(grep -o '} CUpti_ActivityMemset[0-9]*;' "$inc/cupti_activity.h" | tr -d '}; ' | sort -V | tail -n 1)
echo "records $kr $mr $sr"
nvcc -O2 -std=c++17 -shared -Xcompiler -fPIC -I"$inc" -DKREC="$kr" -DMREC="$mr" -DSREC="$sr" \
  -o "$w/bin/libcupti-trace.so" "$here/cupti-trace.cpp" -L"$lib" -lcupti -Xlinker -rpath -Xlinker "$lib" \
  && echo "tracer built"
[ "${1:-480}" -gt 0 ] && "$root/scripts/gpu-machine.sh" wait "$1"
