#!/usr/bin/env bash
# Where a run's GPU time goes, kernel by kernel: runs a command under Nsight Compute (`ncu`, one
# metric: each kernel's duration, clocks left alone), keeps the raw CSV in OUT_DIR/NAME.csv and
# prints the kernels by total time (calls, total and mean microseconds). For the lent GPU machine
# (`scripts/gpu-machine.sh` prepared it); `ncu` serializes kernels, so the totals say where time
# goes, not how long the run takes without it.
#
#   scripts/gpu-profile.sh OUT_DIR NAME COMMAND...
#
# Every kernel of a long run takes ncu many minutes: give it a window in NCU_ARGS, e.g.
# NCU_ARGS="--launch-skip 45000 --launch-count 3000 --kill on" (the window of
# benchmarks/artifacts/gpu/profile/, 64 sequences of the 8B batched bench).
set -uo pipefail
out="${1:?usage: $0 OUT_DIR NAME COMMAND...}"
name="${2:?usage: $0 OUT_DIR NAME COMMAND...}"
shift 2
mkdir -p "$out"
# shellcheck disable=SC2086 # NCU_ARGS is a list of options
ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
  --target-processes all ${NCU_ARGS:-} "$@" >"$out/$name.csv" 2>"$out/$name.log"
echo "ncu rc $? ($(wc -l <"$out/$name.csv") lines)"
tail -n 4 "$out/$name.log"
python3 - "$out/$name.csv" <<'PY'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1], newline="")))
head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if head is None:
    print("no kernel rows"); sys.exit(0)
cols = rows[head]
name, dur = cols.index("Kernel Name"), cols.index("gpu__time_duration.sum")
units = rows[head + 1][dur] if len(rows) > head + 1 else ""
total = collections.defaultdict(float); calls = collections.Counter()
for r in rows[head + 2:]:
    if len(r) <= max(name, dur):
        continue
    try:
        t = float(r[dur].replace(",", ""))
    except ValueError:
        continue
    k = r[name].split("(")[0][:90]
    total[k] += t; calls[k] += 1
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(units, 1.0)
grand = sum(total.values()) * scale
print(f"{sum(calls.values())} kernels, {grand/1e3:.1f} ms in all (units {units})")
for k, t in sorted(total.items(), key=lambda kv: -kv[1])[:40]:
    print(f"{t*scale/1e3:9.2f} ms {calls[k]:7d} x {t*scale/calls[k]:8.1f} us  {k}")
PY
