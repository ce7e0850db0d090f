#!/usr/bin/env python3
"""The Markdown tables of what tests/python/test_safetensors_reference.py measured (Axle on
safetensors folders against the `tokenizers` library and mlx-lm): the record the test module
leaves in target/test-records/, copied to the artifact and rendered into the docs.

    ~/.cache/axle/venv/bin/python -m pytest tests/python/test_safetensors_reference.py
    python3 scripts/safetensors-table.py [--doc docs/models.md]

With --doc, copies the record to benchmarks/artifacts/safetensors/reference.json and fills the
doc's `<!-- bench:safetensors-reference -->` and `<!-- bench:safetensors-quantized -->` sections;
without, prints the tables.
"""
import argparse
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORD = ROOT / "target" / "test-records" / "safetensors-reference.json"
ARTIFACT = ROOT / "benchmarks" / "artifacts" / "safetensors" / "reference.json"


def folders_table(rows):
    by = {}
    for r in rows.values():
        by.setdefault(r["folder"], {})[r["test"]] = r
    out = ["| folder | token ids equal `tokenizers`' | worst top-20 log-probability difference (tolerance) | greedy equal mlx-lm f32's (mlx-lm bf16's) |",
           "|---|--:|--:|--:|"]
    for folder, t in sorted(by.items()):
        if "quantized" in t:
            continue
        tok, lp, gr = t.get("tokenization"), t.get("logprobs"), t.get("greedy")
        tok_s = f"{tok['strings'] - tok['differ']}/{tok['strings']}" if tok else "-"
        lp_s = f"{lp['worst']:.4f} ({lp['tolerance']}" if lp else "-"
        if lp:
            # Routed experts: mlx-lm's own movement under rounding, which the allowance adds.
            lp_s += f"; mlx-lm's own under rounding {lp['mlx_moved']:.4f})" if "mlx_moved" in lp else ")"
        gr_s = "-"
        if gr:
            gr_s = f"{gr['axle']}/20" + (f" ({gr['mlx_bf16']}/20)" if gr.get("mlx_bf16") is not None else "")
        out.append(f"| {folder} | {tok_s} | {lp_s} | {gr_s} |")
    return "\n".join(out)


def quantized_table(rows):
    out = ["| folder (mlx_lm.convert) | worst difference from f32: Axle / mlx-lm | greedy equal f32's: Axle / mlx-lm | Axle equal mlx-lm | mlx-lm quantized equal unquantized |",
           "|---|--:|--:|--:|--:|"]
    for r in sorted((r for r in rows.values() if r["test"] == "quantized"), key=lambda r: r["folder"]):
        out.append(f"| {r['folder']} | {r['axle_worst']:.4f} / {r['mlx_worst']:.4f} | "
                   f"{r['axle_exact']}/20 / {r['mlx_exact']}/20 | {r['axle_vs_mlx']}/20 | {r['mlx_vs_unquantized']}/20 |")
    return "\n".join(out)


def fill(doc, name, body):
    text = doc.read_text()
    pattern = re.compile(rf"(<!-- bench:{name} -->\n).*?(<!-- /bench:{name} -->)", re.S)
    if not pattern.search(text):
        sys.exit(f"{doc} has no <!-- bench:{name} --> section")
    doc.write_text(pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--doc", type=pathlib.Path)
    a = ap.parse_args()
    if not RECORD.exists():
        sys.exit(f"no {RECORD}: run tests/python/test_safetensors_reference.py first")
    rows = json.loads(RECORD.read_text())
    tables = {"safetensors-reference": folders_table(rows), "safetensors-quantized": quantized_table(rows)}
    if a.doc is None:
        print("\n\n".join(tables.values()))
        return
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    for name, body in tables.items():
        fill(a.doc, name, body)


if __name__ == "__main__":
    main()
