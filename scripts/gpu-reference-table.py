"""Prints the Markdown table of a `scripts/gpu-reference.sh` run: Axle against llama.cpp's own
tools (llama-bench, llama-batched-bench) and against libllama in Axle's process, from the artifacts
in DIR (its b*/ and single/ folders). With --doc FILE, fills FILE's `<!-- bench:NAME -->` section
instead of printing (NAME: --section, default gpu-reference).

    python3 scripts/gpu-reference-table.py DIR [--doc docs/gpu.md] [--section NAME]
"""
import json
import pathlib
import re
import sys

from doc_sections import fill
from llama_tools import batched_tool


def rows_of(path):
    return {r["workload"]: r for r in json.loads(path.read_text())["rows"]}


def quant(root):
    """The weight type, from the file name in an artifact (Q4_0 or Q4_K_M)."""
    for f in pathlib.Path(root).glob("*/*.json*"):
        if "q4_k_m" in f.name or "q4-k-m" in f.name:
            return "Q4_K_M"
    return "Q4_0"


def table(root):
    root = pathlib.Path(root)
    out = ["| workload | Axle tok/s | llama.cpp tool tok/s | Axle / tool | libllama in Axle's process | in-process / tool |",
           "|---|--:|--:|--:|--:|--:|"]
    single = root / "single"
    if single.is_dir():
        bench = {}
        for f in sorted(single.glob("llama-bench*.json"), key=lambda p: "-d" in p.name):
            for r in json.loads(f.read_text()):
                name = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
                if r["n_depth"]:
                    name += f" @ depth {r['n_depth']}"
                bench[name] = r["avg_ts"]
        axle = {}
        for f in single.glob("compare-*.json"):
            axle.update(rows_of(f))
        for name, tool in bench.items():
            a = axle.get(name)
            if a:
                out.append(f"| 1 sequence, {name} (llama-bench) | {a['axle_median']:.0f} | {tool:.0f} | "
                           f"{a['axle_median'] / tool:.3f} | {a['reference_median']:.0f} | "
                           f"{a['reference_median'] / tool:.3f} |")
            else:
                out.append(f"| 1 sequence, {name} (llama-bench) | not measured | {tool:.0f} | | | |")
    for d in sorted(root.glob("b*"), key=lambda p: int(p.name[1:])):
        prompt = d.name[1:]
        tools = batched_tool(d)
        axle = {}
        for f in d.glob("batched-*.json"):
            axle.update(rows_of(f))
        for pl, tool in sorted(tools.items()):
            a = axle.get(f"seqs={pl}")
            if not a:
                continue
            out.append(f"| {pl} x {prompt}-token prompts, decode (llama-batched-bench S_TG) | "
                       f"{a['axle_median']:.0f} | {tool:.0f} | {a['axle_median'] / tool:.3f} | "
                       f"{a['reference_median']:.0f} | {a['reference_median'] / tool:.3f} |")
    modes = sorted({m for f in root.glob("b*/axle-batched-*.txt")
                    for m in re.findall(r"device attention: (\w+)", f.read_text())})
    device = (root / "single" / "device.txt")
    source = (root / "single" / "reference-source.txt")
    facts = [p.read_text().strip() if p.is_file() else "?" for p in (device, source)]
    # Parts may come from different device sessions (each part's Axle and tool figures from one).
    parts = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir() and (p / "axle-commit.txt").is_file()):
        parts.setdefault((d / "axle-commit.txt").read_text().strip()[:12], []).append(d.name)
    commits = "; ".join(f"{c} ({', '.join(names)})" for c, names in parts.items()) or "?"
    sessions = "one session" if len(parts) <= 1 else \
        f"{len(parts)} sessions, each part's Axle and tool figures from the same one"
    out.append("")
    out.append(f"Device: {facts[0]}. Reference: {facts[1]}, built plainly for sm_90 "
               f"(`scripts/build-llama-tools.sh`). Axle at commit {commits}. Random-weight "
               f"Llama-3-8B-shaped {quant(root)} file, flash attention on, {sessions}."
               + (f" Axle's batched rows: `--device-attention {', '.join(modes)}`." if modes else ""))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    t = table(sys.argv[1])
    if "--doc" in sys.argv:
        name = sys.argv[sys.argv.index("--section") + 1] if "--section" in sys.argv else "gpu-reference"
        fill(sys.argv[sys.argv.index("--doc") + 1], name, t, "scripts/gpu-reference-table.py")
    else:
        print(t)
