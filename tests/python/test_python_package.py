"""The Python package (`import axle`, crates/axle-py), installed by scripts/setup-tests.sh: greedy output
equal to the CLI's on both real models, streaming equal to blocking, concurrent asyncio requests
equal to sequential ones, cancellation freeing KV, every error class, and the delegated route."""
import asyncio
import subprocess
import time

import axle
import pytest

from helpers import BIN, MODEL, MODEL_DIR, start_axle, stop

GEMMA = MODEL_DIR / "gemma-3-270m-q4_k_m.gguf"
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a quiet village by the sea,",
    "def fibonacci(n):",
    "The three primary colors are",
]


@pytest.fixture(scope="module")
def engine():
    assert MODEL.is_file(), f"{MODEL} is missing: run scripts/setup.sh"
    with axle.Engine(str(MODEL), threads=2, context=1024) as e:
        yield e


def cli_greedy(model, prompt, max_tokens):
    """`axle generate`'s stdout (the CLI ends it with a newline)."""
    out = subprocess.run([str(BIN), "generate", "--model", str(model), "--prompt", prompt, "--threads", "2",
                          "--max-tokens", str(max_tokens), "--temperature", "0"],
                         capture_output=True, check=True, timeout=300)
    text = out.stdout.decode()
    assert text.endswith("\n")
    return text[:-1]


@pytest.mark.parametrize("model", [MODEL, GEMMA], ids=["smollm2", "gemma3"])
def test_greedy_output_equals_the_cli(model):
    assert model.is_file(), f"{model} is missing: run scripts/setup.sh"
    with axle.Engine(str(model), threads=2, context=1024) as e:
        for p in PROMPTS[:2]:
            c = e.generate(p, max_tokens=24, temperature=0)
            assert c.text == cli_greedy(model, p, 24), p
            assert c.finish_reason in ("stop", "length")
            assert c.completion_tokens == len(c.tokens) and c.prompt_tokens > 0
            assert e.detokenize(c.tokens) == c.text


def test_streaming_equals_blocking(engine):
    for p in PROMPTS:
        blocking = engine.generate(p, max_tokens=32, temperature=0)
        stream = engine.stream(p, max_tokens=32, temperature=0)
        chunks = list(stream)
        assert "".join(chunks) == blocking.text
        assert stream.completion.tokens == blocking.tokens
        assert stream.completion.finish_reason == blocking.finish_reason


def test_concurrent_async_requests_equal_sequential_ones(engine):
    prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(16)]
    sequential = [engine.generate(p, max_tokens=16, temperature=0).text for p in prompts]

    async def together():
        return await asyncio.gather(*[engine.agenerate(p, max_tokens=16, temperature=0) for p in prompts])

    assert [c.text for c in asyncio.run(together())] == sequential

    async def streamed():
        out = []
        async for chunk in engine.astream(prompts[0], max_tokens=16, temperature=0):
            out.append(chunk)
        return "".join(out)

    assert asyncio.run(streamed()) == sequential[0]


def test_chat_uses_the_models_template(engine):
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    c = engine.chat(msgs, max_tokens=12, temperature=0)
    assert c.text and c.text == engine.generate(msgs, max_tokens=12, temperature=0).text
    # The template adds its own tokens: the prompt is longer than the bare text.
    assert c.prompt_tokens > len(engine.tokenize("What is 2+2?"))


def wait_for_free_kv(engine):
    for _ in range(200):
        if engine.stats["kv_blocks_used"] == 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"KV blocks still in use: {engine.stats}")


def test_breaking_out_of_a_stream_cancels_and_frees_kv(engine):
    streams = [engine.stream(p, max_tokens=400, temperature=0, ignore_eos=True) for p in PROMPTS]
    for s in streams:
        for _, _chunk in zip(range(3), s):
            pass
    assert engine.stats["kv_blocks_used"] > 0
    for s in streams:
        s.close()
    assert all(s.completion is None for s in streams)
    wait_for_free_kv(engine)
    for chunk in engine.stream(PROMPTS[0], max_tokens=400, temperature=0, ignore_eos=True):
        break  # dropping the stream cancels it
    wait_for_free_kv(engine)
    assert engine.generate("Hello", max_tokens=4, temperature=0, ignore_eos=True).completion_tokens == 4


def test_logprobs_and_choices(engine):
    c = engine.generate(PROMPTS[0], max_tokens=4, temperature=0, logprobs=2)
    assert len(c.logprobs) == 4
    tok, lp, top = c.logprobs[0]
    assert tok == c.tokens[0] and lp <= 0 and len(top) == 2 and top[0][0] == tok
    many = engine.generate(PROMPTS[0], max_tokens=4, temperature=0.8, seed=1, n=3)
    assert isinstance(many, list) and len(many) == 3


def test_structured_output_and_tools(engine):
    import json

    import pydantic

    class Pet(pydantic.BaseModel):
        name: str
        legs: int = pydantic.Field(ge=0, le=8)
        kind: str

    c = engine.chat([{"role": "user", "content": "Describe a pet as JSON."}], response_format=Pet,
                    temperature=0, max_tokens=120, repetition_penalty=1.2)
    pet = Pet.model_validate_json(c.text)
    assert 0 <= pet.legs <= 8 and c.finish_reason == "stop"
    c = engine.generate("A phone number: ", response_format={"type": "regex", "regex": r"[0-9]{3}-[0-9]{4}"},
                        temperature=0, max_tokens=20)
    assert len(c.text) == 8 and c.text[3] == "-", c.text
    tools = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"]}}}]
    c = engine.chat([{"role": "user", "content": "Add 2 and 3."}], tools=tools,
                    tool_choice={"type": "function", "function": {"name": "add"}}, temperature=0, max_tokens=60)
    assert c.finish_reason == "tool_calls" and len(c.tool_calls) == 1
    name, args = c.tool_calls[0]
    assert name == "add" and set(json.loads(args)) == {"a", "b"}
    # The call and its result go back.
    history = [{"role": "user", "content": "Add 2 and 3."},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": name, "arguments": args}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "5"}]
    assert engine.chat(history, tools=tools, tool_choice="none", temperature=0, max_tokens=10).text
    for kw, field in [(dict(response_format={"type": "yaml"}), "response_format"),
                      (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}),
                       "response_format"),
                      (dict(tool_choice="required"), "tool_choice")]:
        with pytest.raises(axle.RequestError) as e:
            engine.chat([{"role": "user", "content": "hi"}], max_tokens=4, **kw)
        assert e.value.field == field, kw


def test_every_error_class(engine, tmp_path):
    with pytest.raises(axle.ModelError, match="missing.gguf"):
        axle.Engine(str(tmp_path / "missing.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(axle.ModelError):
        axle.Engine(str(bad))
    for kw, field in [(dict(temperature=-1), "temperature"), (dict(max_tokens=0), "max_tokens"),
                      (dict(top_p=0), "top_p"), (dict(n=9), "n"), (dict(stop=["a"] * 5), "stop"),
                      (dict(logprobs=21), "top_logprobs")]:
        with pytest.raises(axle.RequestError) as e:
            engine.generate("hi", **kw)
        assert e.value.field == field, kw
    with pytest.raises(axle.RequestError) as e:
        engine.generate("word " * 2000, max_tokens=4)
    assert e.value.field == "prompt" and "does not fit" in str(e.value)
    with pytest.raises(axle.RequestError):
        engine.generate(3.5)
    with pytest.raises(axle.RequestError):
        engine.detokenize([10 ** 8])
    with pytest.raises(axle.UpstreamError, match="unreachable"):
        axle.Engine(backend="openai", upstream="http://127.0.0.1:9", upstream_timeout=2)
    closed = axle.Engine(str(MODEL), threads=2, context=256, ngram=False)
    closed.close()
    with pytest.raises(axle.EngineError, match="closed"):
        closed.generate("hi")
    assert issubclass(axle.RequestError, axle.AxleError) and issubclass(axle.ModelError, axle.AxleError)
    with pytest.raises(ValueError):
        axle.Engine(str(MODEL), backend="nope")
    # Several devices asked wrongly: an RPC server that is not there (or, where the Python
    # process finds no libggml-rpc.so, the RPC backend itself: both name RPC), shares that do not
    # match the devices.
    with pytest.raises(axle.ModelError, match="RPC (server 127.0.0.1:9: nothing accepts|backend is not loaded)"):
        axle.Engine(str(MODEL), threads=2, rpc=["127.0.0.1:9"])
    with pytest.raises(axle.ModelError, match="one non-negative share per device"):
        axle.Engine(str(MODEL), threads=2, device="cpu", split=[1, 2])
    # A tensor split names what it needs: a known mode, two or more accelerators.
    with pytest.raises(ValueError, match="split modes are layer or tensor"):
        axle.Engine(str(MODEL), threads=2, split_mode="rows")
    with pytest.raises(axle.ModelError, match="two or more accelerators"):
        axle.Engine(str(MODEL), threads=2, device="cpu", split_mode="tensor")
    # Device products: a known name; wide ones need CUDA devices, column ones Axle's CUDA kernel.
    with pytest.raises(ValueError, match="groups, wide or columns"):
        axle.Engine(str(MODEL), threads=2, device_products="narrow")
    with pytest.raises(axle.AxleError, match="wide device products need"):
        axle.Engine(str(MODEL), threads=2, device="cpu", device_products="wide")
    with pytest.raises(axle.AxleError, match="column device products need"):
        axle.Engine(str(MODEL), threads=2, device="cpu", device_products="columns")
    # Host kernels: a known name, with the exact kernels; tiled ones run (and stay greedy-stable).
    with pytest.raises(ValueError, match="compatible or tiled"):
        axle.Engine(str(MODEL), threads=2, host_kernels="fused")
    with pytest.raises(axle.AxleError, match="host kernels are a choice of the exact"):
        axle.Engine(str(MODEL), threads=2, kernels="fast", host_kernels="tiled")
    with axle.Engine(str(MODEL), threads=2, host_kernels="tiled", context=256) as tiled:
        a = tiled.generate("Hello", max_tokens=8, temperature=0).text
        b = tiled.generate("Hello", max_tokens=8, temperature=0).text
        assert a == b and a
    # Quantizing at load: a known recipe, named in the runtime report.
    with pytest.raises(ValueError, match="quantize: unknown quantization"):
        axle.Engine(str(MODEL), threads=2, quantize="q3")
    with axle.Engine(str(MODEL), threads=2, context=256, quantize="q8_0") as q:
        assert q.runtime["quantized_at_load"] == "q8_0"
        assert q.generate("Hello", max_tokens=4, temperature=0).text
    # KV type: a known name; Q8_0 needs paged attention on a GPU, and the CPU says so.
    with pytest.raises(ValueError, match="kv_type: .*f16 or q8_0"):
        axle.Engine(str(MODEL), threads=2, kv_type="q4_0")
    with pytest.raises(axle.AxleError, match="KV type q8_0: it is read by Axle's paged attention"):
        axle.Engine(str(MODEL), threads=2, device="cpu", context=256, kv_type="q8_0")
    # Drafters: known names; a draft model of another vocabulary is refused by name.
    with pytest.raises(ValueError, match="unknown drafter 'medusa'"):
        axle.Engine(str(MODEL), threads=2, drafters="medusa")
    with pytest.raises(axle.AxleError, match="draft model needs the same vocabulary"):
        axle.Engine(str(MODEL), threads=2, context=256, draft_model=str(GEMMA))


def test_drafters_and_a_draft_model_change_no_output(engine):
    """Suffix drafts, and a draft model (here the model itself), give the default engine's
    greedy text."""
    prompt = PROMPTS[0]
    want = engine.generate(prompt, max_tokens=32, temperature=0).text
    with axle.Engine(str(MODEL), threads=2, context=1024, drafters="suffix") as e:
        assert e.generate(prompt, max_tokens=32, temperature=0).text == want
    with axle.Engine(str(MODEL), threads=2, context=1024, draft_model=str(MODEL)) as e:
        assert e.generate(prompt, max_tokens=32, temperature=0).text == want


def test_the_delegated_route(engine):
    proc, base = start_axle("--model", MODEL, "--threads", "2", "--ctx", "1024")
    try:
        with axle.Engine(backend="openai", upstream=base) as up:
            assert up.runtime["selected_backend"] == "openai_compatible"
            assert up.runtime["upstream_url"] == base
            for p in PROMPTS[:2]:
                direct = engine.generate(p, max_tokens=16, temperature=0)
                via = up.generate(p, max_tokens=16, temperature=0)
                assert via.text == direct.text and via.tokens == []
                assert via.completion_tokens == direct.completion_tokens
                assert "".join(up.stream(p, max_tokens=16, temperature=0)) == direct.text
            with pytest.raises(axle.RequestError) as e:
                up.generate([1, 2, 3])
            assert e.value.field == "prompt"
            with pytest.raises(axle.RequestError) as e:
                up.generate("hi", logprobs=1)
            assert e.value.field == "logprobs"
            with pytest.raises(axle.RequestError):
                up.tokenize("hi")
    finally:
        stop(proc)


def test_a_hub_id_loads_from_the_hub_cache(engine, tmp_path, monkeypatch):
    """`Engine("org/repo:QUANT", offline=True)` finds the model where huggingface_hub caches it
    (blob named by its sha256, snapshot link, ref) and runs it as the file itself; a model not
    there is refused without touching the network."""
    import hashlib
    import os

    commit = "0123456789abcdef0123456789abcdef01234567"
    sha = hashlib.sha256(MODEL.read_bytes()).hexdigest()
    repo = tmp_path / "hub" / "models--org--SmolLM2-GGUF"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "snapshots" / commit).mkdir(parents=True)
    os.symlink(MODEL, repo / "blobs" / sha)
    os.symlink(f"../../blobs/{sha}", repo / "snapshots" / commit / "SmolLM2-135M-Instruct.Q4_1.gguf")
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with axle.Engine("org/SmolLM2-GGUF:Q4_1", offline=True, threads=2, context=1024) as e:
        assert e.runtime["model_source"] == f"hf:org/SmolLM2-GGUF@{commit}"
        for p in PROMPTS[:2]:
            assert e.generate(p, max_tokens=16, temperature=0).text == \
                engine.generate(p, max_tokens=16, temperature=0).text
    with pytest.raises(axle.ModelError, match="not in the Hub cache"):
        axle.Engine("org/absent", offline=True, threads=2)
    with pytest.raises(axle.ModelError, match="has no `Q8_0` GGUF"):
        axle.Engine("org/SmolLM2-GGUF:Q8_0", offline=True, threads=2)
