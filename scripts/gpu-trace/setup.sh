#!/usr/bin/env bash
# Call 1 on the lent GPU: what `scripts/gpu-machine.sh start 8b` does, without llama.cpp's own tools
# (not needed here) and with only the Q4_0 file; plus the CUPTI tracer and a look at the profilers.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/scripts/gpu-trace"
w=/root/axle-gpu
mkdir -p "$w/models" "$w/logs" "$w/bin"
rm -f "$w/logs/"*.rc
cp "$root/.device/llama-src.tgz" "$w/"
gunzip -c "$root/.device/axle.gz" >"$w/bin/axle" && chmod +x "$w/bin/axle"
python3 -m pip install -q --no-index --no-deps --target "$w/site" "$root"/.device/gguf-*.whl
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/device.txt"
setsid nohup bash -c "'$root/scripts/build-backend.sh' cuda --src '$w/llama-src.tgz' \
  --out '$w/bin/backends' --arch 90-real >'$w/logs/build.log' 2>&1; echo \$? >'$w/logs/build.rc'" >/dev/null 2>&1 &
setsid nohup bash -c "PYTHONPATH='$w/site' python3 '$root/scripts/make-bench-model.py' --shape llama3-8b --type q4_0 \
  --vocab-from '$root/.device/llama-tiny.gguf' --out '$w/models/llama3-8b-q4_0.gguf' >'$w/logs/models.log' 2>&1; \
  echo \$? >'$w/logs/models.rc'" >/dev/null 2>&1 &
echo "== profilers"; which nsys ncu; ls -d /usr/local/cuda* /opt/nvidia/* 2>/dev/null; nvcc --version | tail -2
find /usr/local /opt -maxdepth 6 \( -name 'libcupti.so' -o -name cupti_activity.h -o -name 'nsys' \) 2>/dev/null | head -20
# The tracer, against the newest CUPTI headers here.
export PATH="$PATH:/usr/local/cuda/bin"
inc=$(dirname "$(find /usr/local/cuda/ /usr/local/cuda*/ -name cupti_activity.h 2>/dev/null | head -n 1)")
lib=$(dirname "$(find /usr/local/cuda/ /usr/local/cuda*/ -name 'libcupti.so' 2>/dev/null | head -n 1)")
echo "cupti include $inc lib $lib"
kr=$(grep -o '} CUpti_ActivityKernel[0-9]*;' "$inc/cupti_activity.h" | tr -d '}; ' | sort -V | tail -n 1)
mr=$(grep -o '} CUpti_ActivityMemcpy[0-9]*;' "$inc/cupti_activity.h" | tr -d '}; ' | sort -V | tail -n 1)
sr=$(grep -o '} CUpti_ActivityMemset[0-9]*;' "$inc/cupti_activity.h" | tr -d '}; ' | sort -V | tail -n 1)
echo "records $kr $mr $sr"
nvcc -O2 -std=c++17 -shared -Xcompiler -fPIC -I"$inc" -DKREC=$kr -DMREC=$mr -DSREC=$sr \
  -o "$w/bin/libcupti-trace.so" "$here/cupti-trace.cpp" -L"$lib" -lcupti -Xlinker -rpath -Xlinker "$lib" \
  && echo "tracer built" && ldd "$w/bin/libcupti-trace.so" | grep -i cupti
for ((i = 0; i < ${1:-480}; i += 10)); do
  [ -e "$w/logs/build.rc" ] && [ -e "$w/logs/models.rc" ] && break
  sleep 10
done
echo "build rc: $(cat "$w/logs/build.rc" 2>/dev/null || echo running)"; tail -n 3 "$w/logs/build.log"
echo "models rc: $(cat "$w/logs/models.rc" 2>/dev/null || echo running)"; tail -n 3 "$w/logs/models.log"
ls -la "$w/bin/backends" "$w/models" 2>/dev/null
