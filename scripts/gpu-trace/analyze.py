#!/usr/bin/env python3
"""Per-decode-step kernel table from a cupti-trace.cpp trace of `axle bench batched`.

analyze.py TRACE[.gz] [--steps N] [--out PREFIX]
Axle's decode steps are the stretches between the device-to-host copies (the logits read at the
end of each step) that hold 32 `axle_pa_chunk` launches (one per layer); the last N of them are
the timed ones. Prints per step: kernels by name (calls, us), GPU busy vs span, idle gaps inside
the step, host time between steps, runtime-API calls by name, graph-launched share.
"""
import collections, gzip, sys, argparse

def short(name):
    n = name[5:] if name.startswith("void ") else name
    depth = 0
    for i, c in enumerate(n):
        if c == "<": depth += 1
        elif c == ">": depth -= 1
        elif c == "(" and depth == 0:
            n = n[:i]; break
    return n[:150]

def load(path):
    op = gzip.open if path.endswith(".gz") else open
    K, M, S, R, D = [], [], [], [], 0
    with op(path, "rt", errors="replace") as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            t = p[0]
            if t == "K" and len(p) >= 9:
                K.append((int(p[1]), int(p[2]), int(p[3]), int(p[4]), int(p[5]), p[6], p[7], short(p[8])))
            elif t == "M":
                M.append((int(p[1]), int(p[2]), int(p[3]), int(p[4]), int(p[5]), int(p[6]), int(p[7])))
            elif t == "S":
                S.append((int(p[1]), int(p[2]), int(p[3]), int(p[4]), int(p[5]), int(p[6])))
            elif t == "R":
                R.append((int(p[1]), int(p[2]), int(p[3]), int(p[4]), int(p[5]), p[6]))
            elif t == "D":
                D = max(D, int(p[1]))
    K.sort(); M.sort(); S.sort(); R.sort()
    return K, M, S, R, D

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace"); ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    K, M, S, R, D = load(a.trace)
    print(f"== {a.label or a.trace}: {len(K)} kernels, {len(M)} memcpy, {len(S)} memset, {len(R)} runtime calls, dropped {D}")
    pa = [k for k in K if "axle_pa_chunk" in k[7]]
    if not pa:
        print("no axle_pa_chunk kernels"); return
    # Step ends: device-to-host copies (copyKind 2 = DtoH) inside Axle's paged-attention region.
    lo, hi = pa[0][0], pa[-1][1] + 50_000_000
    d2h = [m for m in M if m[6] == 2 and lo <= m[0] <= hi]
    ends = [m[1] for m in d2h]
    # Steps: (prev_end, end]; keep those with 32 pa_chunk launches (decode steps, one row each).
    import bisect
    starts_k = [k[0] for k in K]
    steps = []
    prev = lo - 1
    for e in ends:
        i0, i1 = bisect.bisect_right(starts_k, prev), bisect.bisect_right(starts_k, e)
        ks = K[i0:i1]
        npa = sum(1 for k in ks if "axle_pa_chunk" in k[7])
        steps.append((prev, e, ks, npa))
        prev = e
    dec = [s for s in steps if s[3] == 32]
    print(f"steps between D2H copies in Axle's region: {len(steps)}; with 32 paged-attention launches: {len(dec)}"
          f"; pa counts seen: {collections.Counter(s[3] for s in steps).most_common(6)}")
    dec = dec[-a.steps:]
    n = len(dec)
    if not n: return
    per = collections.defaultdict(lambda: [0, 0.0])
    busy_sum = span_sum = idle_sum = host_gap_sum = wall_sum = 0.0
    graph_k = tot_k = 0
    big_gaps = collections.Counter()
    for (prev, e, ks, _) in dec:
        for k in ks:
            per[k[7]][0] += 1; per[k[7]][1] += (k[1] - k[0]) / 1e3
            tot_k += 1; graph_k += 1 if k[3] else 0
        # GPU busy: union of kernel intervals; idle gaps between consecutive kernels.
        cur_s, cur_e, busy, idle = ks[0][0], ks[0][1], 0, 0
        for k in ks[1:]:
            if k[0] > cur_e:
                busy += cur_e - cur_s; gap = k[0] - cur_e; idle += gap
                if gap > 5000: big_gaps[f"{short(k[7])[:60]}"] += 1
                cur_s, cur_e = k[0], k[1]
            else:
                cur_e = max(cur_e, k[1])
        busy += cur_e - cur_s
        busy_sum += busy / 1e3; span_sum += (ks[-1][1] - ks[0][0]) / 1e3; idle_sum += idle / 1e3
        host_gap_sum += (ks[0][0] - prev) / 1e3; wall_sum += (e - prev) / 1e3
    print(f"decode steps used: {n}; per step: wall (D2H end to D2H end) {wall_sum/n:.1f} us, "
          f"kernel span {span_sum/n:.1f} us, GPU busy {busy_sum/n:.1f} us, idle gaps inside span {idle_sum/n:.1f} us, "
          f"host time before first kernel {host_gap_sum/n:.1f} us; kernels/step {tot_k/n:.1f}, graph-launched {100*graph_k/max(tot_k,1):.1f}%")
    if big_gaps:
        print("gaps > 5 us inside steps, by the kernel after them (count over all steps):", dict(big_gaps.most_common(8)))
    print(f"{'us/step':>9} {'calls/step':>10} {'mean us':>8}  kernel")
    tot = 0.0
    for name, (c, t) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        tot += t / n
        print(f"{t/n:9.1f} {c/n:10.2f} {t/c:8.2f}  {name}")
    print(f"{tot:9.1f} {sum(c for c, _ in per.values())/n:10.2f}           (sum of kernel durations per step)")
    # Runtime API calls per decode step (host windows between step ends).
    rc = collections.Counter(); rt = collections.defaultdict(float)
    rstarts = [r[0] for r in R]
    for (prev, e, ks, _) in dec:
        for r in R[bisect.bisect_right(rstarts, prev):bisect.bisect_right(rstarts, e)]:
            rc[r[5]] += 1; rt[r[5]] += (r[1] - r[0]) / 1e3
    print("runtime API per step (calls, host us):", ", ".join(f"{k} {c/n:.1f} ({rt[k]/n:.1f} us)" for k, c in rc.most_common(14)))
    mc = collections.Counter(); 
    ms = [m for m in M if dec[0][0] < m[0] <= dec[-1][1]]
    for m in ms: mc[(m[6], m[5])] += 1
    print("memcpy per step (copyKind 1=HtoD 2=DtoH 8=DtoD, bytes): ", {k: round(v / n, 2) for k, v in mc.most_common(8)})
    ss = [s for s in S if dec[0][0] < s[0] <= dec[-1][1]]
    print(f"memsets per step: {len(ss)/n:.2f}")

main()
