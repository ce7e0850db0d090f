"""Prints the Markdown table of `scripts/gpu-issue52.sh OUT kv P SEQS` (and `kv-check`): Axle's
batched decode with F16 and Q8_0 KV against llama-batched-bench with the same KV type, from the
kv-p<P>-<type>/ folders in DIR, and the device check's Q8_0 line. With --doc FILE, fills FILE's
`<!-- bench:gpu-kv-type -->` section instead of printing.

    python3 scripts/kv-type-table.py DIR [--doc docs/gpu.md]
"""
import json
import pathlib
import re
import sys

from doc_sections import fill
from llama_tools import batched_tool

TYPES = ("f16", "q8_0")
# Bytes of a KV row of 32 values: ggml's F16 and Q8_0 (an F16 scale and 32 int8).
ROW_BYTES = {"f16": 64, "q8_0": 34}


def axle(d):
    """Axle's aggregate decode tok/s by sequences, from `axle bench batched`'s printed table."""
    out = {}
    for f in d.glob("axle-batched-*.txt"):
        for m in re.finditer(r"\| seqs=(\d+) \| aggregate_decode_tok_s \(tok/s\) \| ([\d.]+) \|", f.read_text()):
            out[int(m.group(1))] = float(m.group(2))
    return out


def table(root):
    root = pathlib.Path(root)
    out = ["| sequences x prompt | KV | Axle tok/s | llama-batched-bench tok/s (same KV) | Axle / tool | Axle Q8_0 / Axle F16 |",
           "|---|---|--:|--:|--:|--:|"]
    prompts = sorted({int(m.group(1)) for p in root.glob("kv-p*-*")
                      if (m := re.match(r"kv-p(\d+)-", p.name))})
    for p in prompts:
        runs = {t: (axle(root / f"kv-p{p}-{t}"), batched_tool(root / f"kv-p{p}-{t}")) for t in TYPES}
        for s in sorted(runs["f16"][0]):
            for t in TYPES:
                a, r = runs[t][0].get(s), runs[t][1].get(s)
                if a is None or r is None:
                    continue
                own = f"{a / runs['f16'][0][s]:.3f}" if t != "f16" else ""
                out.append(f"| {s} x {p} | {t} | {a:.1f} | {r:.1f} | {a / r:.3f} | {own} |")
    out.append("")
    d = next(root.glob("kv-p*-f16"))
    facts = [(d / n).read_text().strip() for n in ("device.txt", "reference-source.txt", "axle-commit.txt")]
    out.append(f"Device: {facts[0]}. Reference: {facts[1]}, built plainly for sm_90, `-fa 1`, "
               f"`-ctk q8_0 -ctv q8_0` for Q8_0. Axle at {facts[2][:12]}, `--kv-type`. Random-weight "
               f"Llama-3-8B-shaped Q4_0 file, 32 new tokens, one session. KV bytes a token and layer "
               f"(8 KV heads of 128): F16 {ROW_BYTES['f16'] * 2 * 32}, Q8_0 {ROW_BYTES['q8_0'] * 2 * 32} "
               f"({ROW_BYTES['q8_0'] / ROW_BYTES['f16']:.2f}x; the cache's tensors are allocated at that size).")
    check = root / "device-check-q8_0.json"
    if check.is_file():
        c = json.loads(check.read_text())
        n = len(c["prompts"])
        out.append("")
        out.append(f"`axle bench device-check --kv-type q8_0` (same session, same file): greedy output with "
                   f"Q8_0 KV equal to F16 KV's on {c['kv_f16_identical']}/{n} prompts; with Q8_0 KV, "
                   f"speculation on == off {c['speculation_alone_identical']}/{n} alone and "
                   f"{c['speculation_batched_identical']}/{n} batched, batched == alone "
                   f"{c['batched_plain_identical']}/{n} (log-probabilities bit-identical "
                   f"{c['batched_logprobs_identical']}/{n}).")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    t = table(sys.argv[1])
    if "--doc" in sys.argv:
        fill(sys.argv[sys.argv.index("--doc") + 1], "gpu-kv-type", t, "scripts/kv-type-table.py")
    else:
        print(t)
