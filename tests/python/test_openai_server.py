"""`axle serve` driven by the official `openai` Python client (pinned in requirements.txt).

Starts the server on a free loopback port with SmolLM2-135M and checks chat and text completions
(blocking and streaming), error classes, 32 concurrent streams against sequential results, and that
dropped streams give their KV blocks back.
"""
import concurrent.futures as cf
import json
import re
import subprocess
import time
import urllib.request

import openai
import pytest

from helpers import BIN, MODEL, free_port, wait_until_up

KEY = "test-key"


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(axle_\w+) ([0-9.e+-]+)$", text, re.M)}


@pytest.fixture(scope="module")
def server():
    assert BIN.is_file(), f"{BIN} is missing: build with cargo build --release"
    assert MODEL.is_file(), f"{MODEL} is missing: run scripts/fetch-models.sh"
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN), "serve", "--model", str(MODEL), "--port", str(port), "--threads", "2", "--api-key", KEY,
         "--model-alias", "smollm2", "--context-len", "512", "--max-batch-size", "32", "--kv-slots", "12288",
         # Steps under 64 tokens: from 64, ggml's CPU kernels round every row differently, and the
         # concurrency test compares batched against sequential outputs token for token.
         "--max-batch-tokens", "48"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    wait_until_up(proc, base + "/health")
    yield base
    proc.terminate()
    proc.wait(timeout=30)
    assert proc.returncode == 0, "graceful shutdown should exit cleanly"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=120)


def chat(client, text, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 16)
    return client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": text}], **kw)


def test_models_and_chat(client):
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    r = chat(client, "What is the capital of France?")
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_matches_blocking(client):
    blocking = chat(client, "Name a color.", max_tokens=12).choices[0].message.content
    chunks = list(client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Name a color."}], temperature=0, max_tokens=12,
        stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == blocking
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_completions_blocking_stream_stop_and_n(client):
    r = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=6, temperature=0)
    assert "Paris" in r.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=6, temperature=0, stream=True) if c.choices)
    assert streamed == r.choices[0].text
    cut = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=6, temperature=0, stop=["Paris"])
    assert "Paris" not in cut.choices[0].text and cut.choices[0].finish_reason == "stop"
    many = client.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=3, n=3)
    assert len(many.choices) == 3


def test_completions_take_token_ids(server, client):
    req = urllib.request.Request(server + "/tokenize", data=b'{"text": "The capital of France is"}',
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        ids = json.loads(r.read())["tokens"]
    text = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=6, temperature=0)
    by_ids = client.completions.create(model="smollm2", prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)
    two = client.completions.create(model="smollm2", prompt=[ids, ids[:3]], max_tokens=4, temperature=0)
    assert len(two.choices) == 2 and two.choices[0].text == text.choices[0].text[:len(two.choices[0].text)]
    with pytest.raises(openai.BadRequestError, match="prompt"):
        client.completions.create(model="smollm2", prompt=[1, 10**7], max_tokens=4)


def test_logprobs(client):
    r = chat(client, "Say hello.", max_tokens=5, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
        # Greedy: the chosen token is the most likely one.
        assert e.token == e.top_logprobs[0].token and abs(e.logprob - e.top_logprobs[0].logprob) < 1e-5
    c = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert "".join(lp.tokens) == c.choices[0].text and len(lp.token_logprobs) == 4 and len(lp.top_logprobs[0]) == 2
    streamed = [ch for ch in client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Say hello."}], temperature=0, max_tokens=5,
        logprobs=True, stream=True) if ch.choices and ch.choices[0].logprobs]
    assert [e.logprob for ch in streamed for e in ch.choices[0].logprobs.content] == pytest.approx([e.logprob for e in content])


def test_error_classes(server, client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError, match="does not fit the context of 512"):
        chat(client, "word " * 800)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        chat(client, "hi", temperature=-1)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="smollm2", messages=[])
    req = urllib.request.Request(server + "/v1/completions", data=b"{not json", method="POST",
                                 headers={"content-type": "application/json", "authorization": "Bearer " + KEY})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 400
    big = b'{"prompt": "' + b"a" * (5 << 20) + b'"}'
    req = urllib.request.Request(server + "/v1/completions", data=big, method="POST",
                                 headers={"content-type": "application/json", "authorization": "Bearer " + KEY})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 413


def test_32_concurrent_streams_equal_sequential(server, client):
    prompts = [f"Count from {i} to {i + 5}:" for i in range(32)]

    def stream(p):
        s = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": p}],
                                           temperature=0, max_tokens=12, stream=True, extra_body={"ngram": False})
        return "".join(c.choices[0].delta.content or "" for c in s if c.choices)

    before = metrics(server)["axle_running_sequences_max"]
    with cf.ThreadPoolExecutor(32) as ex:
        together = list(ex.map(stream, prompts))
    assert metrics(server)["axle_running_sequences_max"] > max(1, before)
    assert all(together), "every stream produced text"
    alone = [stream(p) for p in prompts[:8]]
    # Greedy outputs batched vs one at a time: equal except where ggml's kernels round a batched
    # step differently and flip a close call (see README); most must match exactly.
    same = sum(a == b for a, b in zip(together[:8], alone))
    print(f"batched == sequential for {same}/8 prompts")
    assert same >= 6


def test_queue_full_is_503():
    port = free_port()
    proc = subprocess.Popen([str(BIN), "serve", "--model", str(MODEL), "--port", str(port), "--threads", "2", "--max-queue", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.InternalServerError) as e:
            c.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="hi", max_tokens=2)
        assert e.value.status_code == 503
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_dropped_streams_free_kv(server, client):
    streams = [client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": f"Tell a long story {i}."}],
                                              temperature=0.7, max_tokens=400, stream=True) for i in range(20)]
    for s in streams:
        next(iter(s))
    assert metrics(server)["axle_kv_blocks_used"] > 0
    for s in streams:
        s.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        if metrics(server)["axle_kv_blocks_used"] == 0:
            break
        time.sleep(0.2)
    assert metrics(server)["axle_kv_blocks_used"] == 0
    assert chat(client, "Still there?").choices[0].message.content
