#!/usr/bin/env python3
"""Axle on a real model's safetensors folder against mlx-lm on the same folder, and what reading
a folder costs against the same numbers as GGUF. Prints a table and writes a JSON artifact.

The folder is SmolLM2-135M-Instruct's weights (the project's real model, dequantized from its
Q4_1 GGUF, so both sides read identical numbers) in bf16 under Transformers' names, with its
tokenizer as tokenizer.json, written by scripts/make-hf-fixtures.py's writer beside a GGUF twin.
Greedy continuations of the 20 check prompts (benchmarks/workloads/check.json): Axle's against
mlx-lm's on the bf16 folder, and, as the yardstick the issue names, mlx-lm's own 4-bit copy
(mlx_lm.convert, group 64) against its bf16 one. (mlx-lm on a CPU decodes its 4-bit copy at about
a token a second here, so this takes about 10 minutes.) Load: `axle generate --max-tokens 1` wall time
and peak memory, folder against twin (median of 3 after one warm-up that also caches the hash).

    ~/.cache/axle/venv/bin/python scripts/safetensors-check.py [--out benchmarks/artifacts/safetensors]
"""
import argparse
import importlib.util
import json
import os
import pathlib
import statistics
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOKENS = 16


def writer():
    spec = importlib.util.spec_from_file_location("hf_fixtures", ROOT / "scripts" / "make-hf-fixtures.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def mlx_greedy(path, prompts_ids):
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, _ = load(str(path))
    out = []
    for ids in prompts_ids:
        toks = []
        for tok, _ in generate_step(mx.array(ids), model, max_tokens=TOKENS, sampler=lambda x: mx.argmax(x, axis=-1)):
            toks.append(int(tok))
        out.append(toks)
    return out


def load_cost(binary, model):
    cmd = ["/usr/bin/time", "-f", "%e %M", str(binary), "generate", "--model", str(model), "--prompt", "Hi",
           "--max-tokens", "1", "--threads", "2"]
    runs = []
    for _ in range(4):
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        secs, kb = r.stderr.strip().splitlines()[-1].split()
        runs.append((float(secs), int(kb)))
    runs = runs[1:]
    return statistics.median(s for s, _ in runs), statistics.median(k for _, k in runs) / 1024


def main():
    import axle

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(os.environ.get("AXLE_MODEL_DIR", os.path.expanduser("~/.cache/axle/models")),
                                                 "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "artifacts" / "safetensors"))
    a = ap.parse_args()
    prompts = json.load(open(ROOT / "benchmarks" / "workloads" / "check.json"))["workloads"][0]["prompts"][:20]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        writer().write_folder(a.model, str(tmp), "smollm2-bf16", "llama", "BF16", "smollm")
        folder, twin = tmp / "smollm2-bf16", tmp / "smollm2-bf16.gguf"
        q4 = tmp / "smollm2-mlx-4bit"
        from mlx_lm import convert
        convert(str(folder), mlx_path=str(q4), quantize=True, q_bits=4, q_group_size=64)
        with axle.Engine(str(folder), threads=2, context=1024) as e:
            ids = [e.tokenize(p) for p in prompts]
            ours = [e.generate(i, max_tokens=TOKENS, temperature=0, ignore_eos=True, ngram=False).tokens for i in ids]
        with axle.Engine(str(twin), threads=2, context=1024) as e:
            twin_out = [e.generate(i, max_tokens=TOKENS, temperature=0, ignore_eos=True, ngram=False).tokens for i in ids]
        ref = mlx_greedy(folder, ids)
        ref4 = mlx_greedy(q4, ids)
        trunc = lambda xs: [x[:TOKENS] for x in xs]
        ours, ref, ref4 = trunc(ours), trunc(ref), trunc(ref4)
        same = lambda xs, ys: sum(x == y for x, y in zip(xs, ys))
        prefix = lambda xs, ys: statistics.mean(next((k for k, (p, q) in enumerate(zip(x, y)) if p != q), len(x)) for x, y in zip(xs, ys))
        binary = ROOT / "target" / "release" / "axle"
        f_s, f_mb = load_cost(binary, folder)
        t_s, t_mb = load_cost(binary, twin)
    result = {
        "model": "SmolLM2-135M-Instruct (Q4_1 dequantized to bf16)",
        "prompts": len(prompts), "tokens": TOKENS,
        "axle_bf16_vs_mlx_bf16": {"equal": same(ours, ref), "mean_common_prefix": prefix(ours, ref)},
        "mlx_4bit_vs_mlx_bf16": {"equal": same(ref4, ref), "mean_common_prefix": prefix(ref4, ref)},
        "axle_folder_vs_axle_twin": {"equal": same(ours, twin_out)},
        "load": {"folder_s": f_s, "twin_s": t_s, "folder_peak_mib": f_mb, "twin_peak_mib": t_mb},
    }
    print(f"greedy continuations, {len(prompts)} prompts x {TOKENS} tokens, equal in full (mean common prefix):")
    print(f"  Axle bf16 folder vs mlx-lm bf16 folder: {result['axle_bf16_vs_mlx_bf16']['equal']}/20 ({prefix(ours, ref):.1f})")
    print(f"  mlx-lm 4-bit vs mlx-lm bf16 (yardstick): {result['mlx_4bit_vs_mlx_bf16']['equal']}/20 ({prefix(ref4, ref):.1f})")
    print(f"  Axle folder vs Axle GGUF twin:          {result['axle_folder_vs_axle_twin']['equal']}/20")
    print(f"load + 1 token: folder {f_s:.2f} s, {f_mb:.0f} MiB peak; twin {t_s:.2f} s, {t_mb:.0f} MiB peak "
          f"({f_s / t_s:.2f}x time, {f_mb - t_mb:+.0f} MiB)")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "smollm2-bf16.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
