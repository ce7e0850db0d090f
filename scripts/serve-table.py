"""The Markdown table of `axle bench serve` artifacts (scripts/gpu-issue52.sh OUT serve ...): one
line per artifact, Axle's `axle serve` against llama.cpp's `llama-server` under the same load.
With --doc FILE, fills FILE's `<!-- bench:NAME -->` section (NAME: --section, default gpu-serve)
instead of printing.

    python3 scripts/serve-table.py DIR [--doc docs/gpu.md] [--section NAME]
"""
import json
import pathlib
import re
import sys

from doc_sections import fill


def axle_args(command):
    """The extra `axle serve` arguments of a run, as given (`--axle-arg=X` pairs joined)."""
    args = re.findall(r"--axle-arg[= ](\S+)", command)
    # --threads only sizes the host side; leave it out of the table.
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--threads":
            skip = True
            continue
        out.append(a)
    return " ".join(out) or "(defaults)"


def table(root):
    files = sorted(pathlib.Path(root).glob("serve-*.json"))
    if not files:
        sys.exit(f"no serve-*.json artifacts in {root}")
    out = ["| file | clients x prompt + new | Axle's options | Axle tok/s | llama-server tok/s | Axle / llama-server | TTFT p50 ms (Axle / llama-server) | ITL p50 ms | ITL p99 ms | commit |",
           "|---|---|---|--:|--:|--:|--:|--:|--:|---|"]
    devices, refs = set(), set()
    for f in files:
        a = json.loads(f.read_text())
        r = a["report"]
        load, ax, ls = r["load"], r["axle"], r["llama_server"]
        devices.add(a["device"])
        refs.add(a["reference"] or "")
        quant = "Q4_K_M" if "q4_k_m" in a["environment"]["model_path"] else "Q4_0"
        rounds = f" x {load['rounds']} rounds" if load["rounds"] > 1 else ""
        # Artifacts before `timed_requests` existed failed on a stream without text instead.
        n = ax.get("timed_requests", ax["requests"])
        timed = "" if n == ax["requests"] else f" ({n}/{ax['requests']} of Axle's streams timed)"
        out.append("| {} | {} x {} + {}{} | {} | {:.0f} | {:.0f} | {:.3f} | {:.0f} / {:.0f} | {:.1f} / {:.1f} | {:.1f} / {:.1f}{} | {} |".format(
            quant, load["clients"], load["prompt_tokens"], load["max_tokens"], rounds,
            axle_args(a["command"]).replace("|", "\\|"), ax["output_tok_s"], ls["output_tok_s"],
            ax["output_tok_s"] / ls["output_tok_s"], ax["ttft_p50_ms"], ls["ttft_p50_ms"],
            ax["itl_p50_ms"], ls["itl_p50_ms"], ax["itl_p99_ms"], ls["itl_p99_ms"], timed,
            a["environment"]["git_commit"][:12]))
    out.append("")
    out.append("Device: {}. Reference: {}. Random-weight Llama-3-8B-shaped files, flash attention on "
               "for llama-server (`-ngl 999 -fa on`, one slot per client, the same context in all as Axle's KV); "
               "greedy, end-of-generation ignored, random token-id prompts, a different one per request; "
               "each server in its own process, one after the other, in one device session.".format(
                   "; ".join(sorted(devices)), "; ".join(sorted(refs))))
    return "\n".join(out) + "\n"


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    doc = section = None
    if "--doc" in args:
        doc = pathlib.Path(args[args.index("--doc") + 1])
    section = args[args.index("--section") + 1] if "--section" in args else "gpu-serve"
    text = table(args[0])
    if doc is None:
        print(text)
        return
    fill(doc, section, text, "scripts/serve-table.py")


if __name__ == "__main__":
    main()
