"""Prints the Markdown table of the kernel traces' decode steps (the `analyze.py` tables kept as
`decode-steps.txt` in DIR and its subfolders, each with the `device.txt` and `axle-commit.txt` of
its run): for each run, a step's busy time on the device, its kernels, a layer's attention and
feed-forward halves, and the head. With --doc FILE, fills FILE's `<!-- bench:gpu-trace -->`
section instead of printing.

    python3 scripts/trace-table.py benchmarks/artifacts/gpu/trace [--doc docs/gpu.md]
"""
import pathlib
import re
import sys

from doc_sections import fill


def runs(text):
    """(label, busy us, kernels, attention us, feed-forward us, head us) of each table in TEXT."""
    for block in text.split("== ")[1:]:
        label = block.split(":", 1)[0].strip()
        busy = re.search(r"GPU busy ([\d.]+) us", block)
        kernels = re.search(r"kernels ([\d.]+), graph", block)
        halves = re.search(r"attention ([\d.]+) us, feed-forward ([\d.]+) us; head ([\d.]+) us", block)
        if busy and kernels and halves:
            yield (label, float(busy[1]), float(kernels[1])) + tuple(float(x) for x in halves.groups())


def table(root):
    lines = [
        "| run | device busy a step (us) | kernels a step | a layer's attention half (us) | its feed-forward half (us) | head (us) | device, commit |",
        "|---|--:|--:|--:|--:|--:|---|",
    ]
    for f in sorted(pathlib.Path(root).rglob("decode-steps.txt")):
        device = (f.parent / "device.txt").read_text().split(",")[0].strip()
        commit = (f.parent / "axle-commit.txt").read_text().strip()[:12]
        for label, busy, kernels, attn, ffn, head in runs(f.read_text()):
            tool = label.startswith("llama")
            lines.append(
                f"| {label} | {busy:.0f} | {kernels:.0f} | {attn:.1f} | {ffn:.1f} | {head:.0f} | "
                f"{device}, {'llama.cpp tools (ggml 0.25.3)' if tool else 'Axle ' + commit} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    text = table(sys.argv[1])
    if "--doc" in sys.argv:
        fill(sys.argv[sys.argv.index("--doc") + 1], "gpu-trace", text, "scripts/trace-table.py")
    else:
        print(text, end="")
