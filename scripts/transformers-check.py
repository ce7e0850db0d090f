"""Safetensors folders (fixtures/hf) against Transformers on the CPU, computing each folder's
numbers in f32: for 20 prompts, the worst difference between Axle's and Transformers'
log-probabilities of Axle's 20 most likely next tokens, and how many 12-token greedy
continuations are equal. Writes benchmarks/artifacts/safetensors/transformers.json (merged, a
row per folder) and, with --doc FILE, its `<!-- bench:safetensors-transformers -->` section.

Needs torch and transformers beside the axle package (not in the test venv: PyPI's torch wheel
brings CUDA's libraries, about 5 GB), e.g.

    python -m pip install --target /tmp/torch-site torch accelerate   # accelerate: gpt-oss's MXFP4
    PYTHONPATH=/tmp/torch-site python scripts/transformers-check.py FOLDER... [--doc docs/models.md]

Each folder runs in a process of its own (Transformers' CPU path for some families holds many
GB; one folder at a time keeps that bounded).
"""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARTIFACT = ROOT / "benchmarks" / "artifacts" / "safetensors" / "transformers.json"
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "python"))


def check(name):
    import warnings

    import axle
    import torch
    import transformers
    from test_safetensors_reference import PROMPTS

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    path = ROOT / "fixtures" / "hf" / name
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    worst, same = 0.0, 0
    with axle.Engine(str(path), threads=2, context=512) as engine, torch.no_grad():
        for p in PROMPTS:
            ids = engine.tokenize(p)
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            ref = (logits - torch.logsumexp(logits, 0)).numpy()
            _, _, top = engine.generate(ids, max_tokens=1, temperature=0, logprobs=20).logprobs[0]
            worst = max([worst] + [abs(v - float(ref[t])) for t, v in top])
            ours = engine.generate(ids, max_tokens=12, temperature=0, ignore_eos=True, ngram=False).tokens
            theirs = model.generate(torch.tensor([ids]), max_new_tokens=12, min_new_tokens=12,
                                    do_sample=False)[0, len(ids):].tolist()
            same += ours == theirs
    return {"folder": name, "worst": round(worst, 4), "greedy": same, "prompts": len(PROMPTS),
            "transformers": transformers.__version__, "torch": torch.__version__}


def table(rows):
    out = ["| folder | worst top-20 log-probability difference | greedy equal Transformers' |",
           "|---|--:|--:|"]
    for r in sorted(rows.values(), key=lambda r: r["folder"]):
        out.append(f"| {r['folder']} | {r['worst']:.4f} | {r['greedy']}/{r['prompts']} |")
    versions = sorted({(r["transformers"], r["torch"]) for r in rows.values()})
    out.append("")
    out.append("Transformers " + ", ".join(f"{t} (torch {p})" for t, p in versions)
               + ", f32 on the CPU; Axle with its defaults on the CPU.")
    return "\n".join(out) + "\n"


def main():
    args = sys.argv[1:]
    if args and args[0] == "--one":
        print(json.dumps(check(args[1])))
        return
    doc = None
    if "--doc" in args:
        i = args.index("--doc")
        doc = args[i + 1]
        del args[i:i + 2]
    rows = json.loads(ARTIFACT.read_text()) if ARTIFACT.exists() else {}
    for name in args:
        run = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True)
        line = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
        if run.returncode != 0 or not line.startswith("{"):
            print(f"{name}: failed (exit {run.returncode}): {run.stderr.strip()[-300:]}")
            continue
        rows[name] = json.loads(line)
        print(f"{name}: worst {rows[name]['worst']:.4f}, greedy {rows[name]['greedy']}/20", flush=True)
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    if doc:
        from doc_sections import fill
        fill(doc, "safetensors-transformers", table(rows), "scripts/transformers-check.py")
    else:
        print(table(rows))


if __name__ == "__main__":
    main()
