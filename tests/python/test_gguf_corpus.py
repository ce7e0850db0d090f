"""The hostile GGUF corpus: for every architecture Axle runs (the random-weight fixtures), variants
that change one thing each (scripts/gguf_corpus.py: numeric metadata set to NaN, infinities,
negatives, zero or the type's maximum, arrays cut to one element or zeroed, keys removed, tensors stored as
another type or removed), each run through `axle generate`. Every variant is either refused with
one error line naming the key or tensor, or runs and decodes its tokens: never an abort, a hang,
or an empty output presented as a finished one.

AXLE_CORPUS=full runs every variant (about 1,800); the test command runs the float, array and
tensor variants of every fixture and the integer ones of the families' own keys.
"""
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import BIN, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import gguf_corpus  # noqa: E402

FIXTURES = sorted((ROOT / "fixtures").glob("*-tiny.gguf"))
TOKENS = 4
# Keys every family shares, whose integer variants the first hardening round's corpus covers.
SHARED = re.compile(r"\.(context_length|embedding_length|block_count|feed_forward_length|"
                    r"attention\.head_count(_kv)?|attention\.key_length|attention\.value_length|"
                    r"rope\.dimension_count|vocab_size)=")


def run(path):
    """(return code, stdout, stderr) of generating TOKENS tokens from `path`."""
    try:
        r = subprocess.run([str(BIN), "generate", "--model", str(path), "--prompt", "Hello world",
                            "--max-tokens", str(TOKENS), "--threads", "1", "--speculation", "off"],
                           capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None, "", "timed out"
    return r.returncode, r.stdout, r.stderr


def decoded(stderr):
    m = re.search(r"decode: (\d+) tokens", stderr)
    return int(m.group(1)) if m else None


def verdict(name, rc, stderr, baseline_tokens):
    """None if the variant was handled, else what went wrong."""
    if rc is None:
        return "hang"
    if rc < 0:
        return f"killed by signal {-rc}: {stderr.strip()[-300:]}"
    if rc == 1:
        lines = [l for l in stderr.splitlines() if l.strip()]
        if len(lines) != 1 or not lines[0].startswith("error: "):
            return f"refused without one error line: {stderr.strip()[-300:]}"
        what = name.split("=")[0].split(" ")[0]
        short = what.rsplit(".", 1)[-1] if not what.startswith(("blk.", "token_embd", "output", "per_layer")) else what
        # A metadata value may be refused through what it implies for a tensor (its shape, or
        # one the value says must exist): naming that tensor names the problem too.
        named = short in lines[0] or what in lines[0] or "tensor" in lines[0]
        if "removed" not in name and not named:
            return f"refused without naming {what}: {lines[0]}"
        return None
    if rc != 0:
        return f"exit code {rc}: {stderr.strip()[-300:]}"
    n = decoded(stderr)
    if baseline_tokens == TOKENS and n != TOKENS:
        return f"ran but decoded {n} tokens where the file decodes {TOKENS}: {stderr.strip()[-200:]}"
    return None


def selected(name, kind):
    if os.environ.get("AXLE_CORPUS") == "full":
        return True
    if kind in ("float", "array", "tensor-type", "tensor-removed"):
        return True
    return not SHARED.search(name.replace(" removed", "="))


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_every_variant_is_refused_by_name_or_runs(fixture):
    assert BIN.is_file(), f"{BIN} is missing: build with cargo build --release"
    rc, _, err = run(fixture)
    assert rc == 0, f"the unchanged fixture fails: {err}"
    baseline = decoded(err)
    cases = [(n, w) for n, k, w in gguf_corpus.variants(str(fixture)) if selected(n, k)]
    with tempfile.TemporaryDirectory() as tmp:
        def one(i_case):
            i, (name, write) = i_case
            path = pathlib.Path(tmp) / f"v{i}.gguf"
            try:
                write(str(path))
            except Exception as e:
                return name, f"the corpus could not write it: {e}", ""
            rc, _, err = run(path)
            path.unlink()
            return name, verdict(name, rc, err, baseline), err
        with ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1))) as pool:
            results = list(pool.map(one, enumerate(cases)))
    failures = [f"{name}: {problem}" for name, problem, _ in results if problem]
    print(f"{fixture.stem}: {len(results)} variants, {len(failures)} mishandled")
    assert not failures, "\n".join(failures)
