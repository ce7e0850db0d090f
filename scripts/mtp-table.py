"""Prints the Markdown table of `axle bench device-check` reports of models with an MTP head
(`dc-<fixture>.json` in DIR): the head's logits against libllama's MTP context, the trunk's greedy
output against libllama, speculation on == off with the head drafting, and the verify-step and
head-step costs the engine measured. With --doc FILE, fills FILE's `<!-- bench:gpu-mtp -->`
section instead of printing.

    python3 scripts/mtp-table.py DIR [--doc docs/gpu.md]
"""
import json
import pathlib
import sys

from doc_sections import fill


def table(root):
    rows = []
    head = None
    for f in sorted(pathlib.Path(root).glob("dc-*.json")):
        r = json.loads(f.read_text())
        m = r.get("mtp_head")
        if not m:
            continue
        n = len(r["prompts"])
        head = head or (r["device"], r["git_commit"][:7])
        rows.append(
            "| {} | {}/{} rows bit-identical (top-1 same {}; worst {:.5f}) | {}/{n} | {}/{n} / {}/{n} | {} | {} |".format(
                f.stem.removeprefix("dc-").removesuffix("-tiny"),
                m["identical_rows"], m["rows"], m["top1_same"], m["worst_max_abs_diff"],
                r["greedy_identical"],
                r["speculation_alone_identical"], r["speculation_batched_identical"],
                " ".join(f"{c:.2f}" for c in m["verify_cost"][1:]),
                "-" if m["head_step_cost"] is None else f"{m['head_step_cost']:.2f}",
                n=n,
            )
        )
    if not rows:
        sys.exit(f"no device-check reports with an MTP head in {root}")
    return (
        f"{head[0]}, commit {head[1]}:\n\n"
        "| fixture | head logits vs libllama | trunk greedy vs libllama | speculation on == off, alone / batched | verify step, k = 1..4 drafts / decode | head step / decode |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    text = table(args[0])
    if "--doc" in args:
        fill(args[args.index("--doc") + 1], "gpu-mtp", text, "scripts/mtp-table.py")
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
