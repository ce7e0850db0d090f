"""Safetensors folders (fixtures/hf, written by scripts/make-hf-fixtures.py) against the
references users have for them: the Hugging Face `tokenizers` library on the folder's
tokenizer.json (token ids identical on 500 strings, for SmolLM2's, Qwen2's and Llama 3's
pre-tokenizers), and mlx-lm on the folder itself (last-position logits within a stated tolerance,
greedy continuations compared)."""
import random

import axle
import numpy as np
import pytest

from helpers import ROOT

HF = ROOT / "fixtures" / "hf"
FOLDERS = ["llama-f32", "llama-bf16", "qwen3-bf16", "qwen2-f32"]

WORDS = ["the", "The", "THE", "don't", "we'll", "I'M", "café", "naïve", "日本語", "中文", "русский",
         "λόγος", "🦀", "👍🏽", "3.14159", "2026", "1234567", "x=y+1;", "fn main() {}", "  ", "\n", "\t",
         "\n\n", "<tag>", "a,b", "...", "--flag", "snake_case", "CamelCase", "http://x.io/a?b=1", "$%&",
         "Ω≈ç√", "ü", "'s", "'Ve", "'LL", "\r\n", "  indented", "end."]


def strings(n, seed=1234):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(1, 12)
        sep = rng.choice([" ", "", "  ", "\n", " "])
        out.append(sep.join(rng.choice(WORDS) for _ in range(k)))
    return out


@pytest.fixture(scope="module", params=FOLDERS)
def folder(request):
    path = HF / request.param
    assert path.is_dir(), f"{path} is missing: run scripts/make-hf-fixtures.py"
    with axle.Engine(str(path), threads=2, context=512) as e:
        yield path, e


def test_tokenization_equals_the_tokenizers_library(folder):
    from tokenizers import Tokenizer

    path, engine = folder
    reference = Tokenizer.from_file(str(path / "tokenizer.json"))
    texts = strings(500)
    differ = [(t, engine.tokenize(t, add_special=False), reference.encode(t, add_special_tokens=False).ids)
              for t in texts]
    differ = [d for d in differ if d[1] != d[2]]
    assert not differ, f"{len(differ)} of 500 differ, first: {differ[0]}"


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,",
           "The three primary colors are", "Hello, my name is", "import numpy as np\n", "Q: What is 2+2?\nA:",
           "In 1492,", "The quick brown fox", "<html>\n<body>", "Dear Sir or Madam,", "for i in range(",
           "The meaning of life is", "SELECT * FROM", "Water boils at", "Roses are red,", "E = mc",
           "The best way to learn", "Once, in a galaxy"]

# Log-probability tolerance against mlx-lm, by the folder's type. f32 folders: both multiply in
# f32, but Axle keeps K and V in f16 (as llama.cpp does) where mlx-lm keeps the model's type, which
# moves log-probabilities of these random models by up to about 0.015. bf16 folders: mlx-lm
# computes in bf16 throughout, Axle multiplies bf16 weights with f32 activations, so the two
# differ by bf16's rounding (up to about 0.26 here).
TOLERANCE = {"f32": 0.03, "bf16": 0.4}


def mlx_model(path):
    from mlx_lm import load

    return load(str(path))[0]


def mlx_logprobs(model, ids):
    import mlx.core as mx

    logits = model(mx.array([ids]))[0, -1].astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits))


def mlx_greedy(model, ids, n):
    out = list(ids)
    for _ in range(n):
        out.append(int(mlx_logprobs(model, out).argmax()))
    return out[len(ids):]


def test_logprobs_within_tolerance_of_mlx_lm(folder):
    """The 20 most likely next tokens after each prompt: Axle's log-probabilities against
    mlx-lm's for the same tokens, and the same most likely token where mlx-lm's first two are
    further apart than the tolerance."""
    path, engine = folder
    model = mlx_model(path)
    tol = TOLERANCE[path.name.rsplit("-", 1)[1]]
    worst = 0.0
    for p in PROMPTS:
        ids = engine.tokenize(p)
        ref = mlx_logprobs(model, ids)
        c = engine.generate(ids, max_tokens=1, temperature=0, logprobs=20)
        tok, lp, top = c.logprobs[0]
        first, second = np.sort(ref)[-2:][::-1]
        if first - second > tol:
            assert tok == int(ref.argmax()), f"{path.name} {p!r}: top token {tok} vs {int(ref.argmax())}"
        for t, ours in top:
            worst = max(worst, abs(ours - float(ref[t])))
    print(f"{path.name}: worst log-probability difference {worst:.4f} (tolerance {tol})")
    assert worst <= tol, f"{path.name}: worst log-probability difference {worst} over tolerance {tol}"


def test_greedy_continuations_against_mlx_lm(folder):
    """Greedy continuations of 20 prompts, 12 tokens each: every f32 one equal to mlx-lm's; bf16
    ones may part where two tokens are within bf16's rounding, and most agree."""
    path, engine = folder
    model = mlx_model(path)
    same = 0
    for p in PROMPTS:
        ids = engine.tokenize(p)
        ours = engine.generate(ids, max_tokens=12, temperature=0, ignore_eos=True, ngram=False).tokens
        same += ours == mlx_greedy(model, ids, 12)
    print(f"{path.name}: {same}/20 greedy continuations equal mlx-lm's")
    need = 20 if path.name.endswith("f32") else 14
    assert same >= need, f"{path.name}: {same}/20 equal mlx-lm's"
