#!/usr/bin/env python3
"""Per-step kernel table from a cupti-trace.cpp trace (Axle or llama.cpp's tools alike).

analyze.py TRACE[.gz] [--marker SUBSTR] [--per-step N] [--region SUBSTR] [--steps N] [--first]
analyze.py TRACE[.gz] --gaps MS [--after SUBSTR]

A step is the stretch between two device-to-host copies (the logits, or the picked token, read at
the end of each step). Steps holding exactly N kernels whose name contains the marker (default
`rms_norm`, 65 a step for a 32-layer model: two a layer and the final norm) are the ones compared;
the last N of them (the first with --first). --region SUBSTR keeps only the part of the trace
from the first to the last kernel whose name holds SUBSTR (Axle's part of a bench run that also
runs libllama: `axle_pa_chunk`). Prints per step: wall (copy to copy), kernel span, GPU busy, idle
gaps inside the span, host time before the first kernel, the time of a layer's attention and
feed-forward halves and of the head (with the default marker), kernels by name (us per step,
calls, mean), runtime-API calls, copies. Kernels launched with programmatic dependent launch
start before the one ahead ends and wait inside, so their durations overlap: busy time and the
halves' spans, not the sum of durations, are what a step costs.
With --gaps, lists instead where the device sat idle for more than MS milliseconds between two
kernels (from the first kernel whose name holds --after on), with the runtime-API calls made
meanwhile: host work between graphs, such as a prefill's between chunks.
"""
import argparse, bisect, collections, gzip


def short(name):
    n = name[5:] if name.startswith("void ") else name
    depth = 0
    for i, c in enumerate(n):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            n = n[:i]
            break
    return n[:110]


def load(path):
    op = gzip.open if path.endswith(".gz") else open
    K, M, R, D = [], [], [], 0
    with op(path, "rt", errors="replace") as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            t = p[0]
            try:
                if t == "K" and len(p) >= 9:
                    K.append((int(p[1]), int(p[2]), int(p[3]), int(p[4]), int(p[5]), p[6], p[7], short(p[8])))
                elif t == "M" and len(p) >= 8:
                    M.append((int(p[1]), int(p[2]), int(p[3]), int(p[4]), int(p[5]), int(p[6]), int(p[7])))
                elif t == "R" and len(p) >= 7:
                    R.append((int(p[1]), int(p[2]), int(p[3]), int(p[4]), int(p[5]), p[6]))
                elif t == "D":
                    D = max(D, int(p[1]))
            except ValueError:
                continue
    K.sort(); M.sort(); R.sort()
    return K, M, R, D


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--marker", default="rms_norm")
    ap.add_argument("--per-step", type=int, default=65)
    ap.add_argument("--region", default="")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--first", action="store_true")
    ap.add_argument("--label", default="")
    ap.add_argument("--gaps", type=float, default=0.0)
    ap.add_argument("--after", default="")
    a = ap.parse_args()
    K, M, R, D = load(a.trace)
    print(f"== {a.label or a.trace}: {len(K)} kernels, {len(M)} copies, {len(R)} runtime calls, dropped {D}")
    if not K:
        return
    if a.gaps:
        # The device idle between consecutive kernels, from the first kernel whose name holds
        # --after on: every gap over --gaps ms, in order, with the runtime calls inside it.
        first = next((i for i, k in enumerate(K) if a.after in k[7]), 0)
        rs = [r[0] for r in R]
        t0 = K[first][0]
        for x, y in zip(K[first:], K[first + 1:]):
            gap = (y[0] - x[1]) / 1e3
            if gap < a.gaps * 1e3:
                continue
            calls = R[bisect.bisect_left(rs, x[1]):bisect.bisect_right(rs, y[0])]
            busy = sum(r[1] - r[0] for r in calls) / 1e3
            print(f"at {(x[1] - t0) / 1e3:10.1f} us: idle {gap:8.0f} us ({len(calls)} runtime calls, "
                  f"{busy:.0f} us in them)  {x[7][:34]} -> {y[7][:34]}")
        return
    lo, hi = K[0][0] - 1, float("inf")
    if a.region:
        reg = [k for k in K if a.region in k[7]]
        if not reg:
            print(f"no kernel holds {a.region}")
            return
        lo, hi = reg[0][0] - 1, reg[-1][1] + 20_000_000
    ends = [m[1] for m in M if m[6] == 2 and lo <= m[0] <= hi]
    starts = [k[0] for k in K]
    steps, prev = [], lo
    for e in ends:
        ks = K[bisect.bisect_right(starts, prev):bisect.bisect_right(starts, e)]
        if ks:
            steps.append((prev, e, ks, sum(1 for k in ks if a.marker in k[7])))
        prev = e
    print(f"steps (between device-to-host copies): {len(steps)}; {a.marker} counts seen: "
          f"{collections.Counter(s[3] for s in steps).most_common(8)}")
    dec = [s for s in steps if s[3] == a.per_step]
    dec = dec[:a.steps] if a.first else dec[-a.steps:]
    n = len(dec)
    if not n:
        return
    per = collections.defaultdict(lambda: [0, 0.0])
    busy_sum = span_sum = idle_sum = host_sum = wall_sum = 0.0
    graph_k = tot_k = 0
    for (prev, e, ks, _) in dec:
        for k in ks:
            per[k[7]][0] += 1
            per[k[7]][1] += (k[1] - k[0]) / 1e3
            tot_k += 1
            graph_k += 1 if k[3] else 0
        cur_s, cur_e, busy, idle = ks[0][0], ks[0][1], 0, 0
        for k in ks[1:]:
            if k[0] > cur_e:
                busy += cur_e - cur_s
                idle += k[0] - cur_e
                cur_s, cur_e = k[0], k[1]
            else:
                cur_e = max(cur_e, k[1])
        busy += cur_e - cur_s
        busy_sum += busy / 1e3
        span_sum += (ks[-1][1] - ks[0][0]) / 1e3
        idle_sum += idle / 1e3
        host_sum += (ks[0][0] - prev) / 1e3
        wall_sum += (e - prev) / 1e3
    print(f"steps used: {n}; per step: wall {wall_sum/n:.1f} us, kernel span {span_sum/n:.1f} us, "
          f"GPU busy {busy_sum/n:.1f} us, idle inside span {idle_sum/n:.1f} us, host before first "
          f"kernel {host_sum/n:.1f} us; kernels {tot_k/n:.1f}, graph-launched {100*graph_k/max(tot_k,1):.0f}%")
    norms = [[k for k in ks if a.marker in k[7]] for (_, _, ks, _) in dec]
    if a.marker == "rms_norm" and a.per_step % 2 == 1:
        # Per layer: attention (its norm to the FFN's norm) and FFN (to the next layer's norm);
        # the head: the final norm to the step's last kernel.
        attn = [(n[2 * l + 1][0] - n[2 * l][0]) / 1e3 for n in norms for l in range(a.per_step // 2 - 1)]
        ffn = [(n[2 * l + 2][0] - n[2 * l + 1][0]) / 1e3 for n in norms for l in range(a.per_step // 2 - 1)]
        head = [(s[2][-1][1] - n[-1][0]) / 1e3 for s, n in zip(dec, norms)]
        print(f"per layer: attention {sum(attn)/len(attn):.2f} us, feed-forward {sum(ffn)/len(ffn):.2f} us; "
              f"head {sum(head)/len(head):.1f} us (from the final norm)")
    print(f"{'us/step':>9} {'calls':>7} {'mean us':>8}  kernel")
    tot = 0.0
    for name, (c, t) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        tot += t / n
        print(f"{t/n:9.1f} {c/n:7.2f} {t/c:8.2f}  {name}")
    print(f"{tot:9.1f} {sum(c for c, _ in per.values())/n:7.2f}           (sum of kernel durations)")
    rc, rt = collections.Counter(), collections.defaultdict(float)
    rs = [r[0] for r in R]
    for (prev, e, _, _) in dec:
        for r in R[bisect.bisect_right(rs, prev):bisect.bisect_right(rs, e)]:
            rc[r[5]] += 1
            rt[r[5]] += (r[1] - r[0]) / 1e3
    print("runtime API per step (calls, host us):",
          ", ".join(f"{k} {c/n:.1f} ({rt[k]/n:.1f})" for k, c in rc.most_common(12)))
    mc = collections.Counter()
    for m in M:
        if dec[0][0] < m[0] <= dec[-1][1]:
            mc[(m[6], m[5])] += 1
    print("copies per step (kind 1 HtoD 2 DtoH 8 DtoD, bytes):", {k: round(v / n, 2) for k, v in mc.most_common(8)})


main()
