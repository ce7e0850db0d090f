"""`/v1/embeddings` through the official `openai` client.

SmolLM2-135M served with `--embeddings --pooling last` beside chat: texts, token ids, the SDK's
default base64 encoding and plain floats give the same unit vectors; an input's embedding is the
same alone or in a batch (bit for bit); `dimensions` keeps leading components, normalized again;
refused fields are named. The Qwen3-shaped embedding fixture serves embeddings without flags (its
file names last-token pooling); a generative model without `--embeddings` refuses the route.
"""
import json
import math
import pathlib
import urllib.error
import urllib.request

import openai
import pytest

from helpers import MODEL, ROOT, start_axle, stop

KEY = "test-key"
WIDTH = 576  # SmolLM2-135M's hidden width
TEXTS = ["The capital of France is Paris.", "def add(a, b): return a + b", "A haiku about the sea"]


@pytest.fixture(scope="module")
def server():
    assert MODEL.is_file(), f"{MODEL} is missing: run scripts/fetch-models.sh"
    proc, base = start_axle("--model", MODEL, "--threads", 2, "--api-key", KEY, "--model-alias", "smollm2",
                            "--context-len", 1024, "--kv-slots", 4096, "--embeddings", "--pooling", "last")
    yield base
    stop(proc)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=120)


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def test_texts_give_unit_vectors_in_order_alone_or_batched(client):
    batch = client.embeddings.create(model="smollm2", input=TEXTS)
    assert [d.index for d in batch.data] == [0, 1, 2]
    assert batch.model == "smollm2" and batch.usage.prompt_tokens > len(TEXTS)
    for d in batch.data:
        assert len(d.embedding) == WIDTH
        assert abs(norm(d.embedding) - 1) < 1e-5
    alone = [client.embeddings.create(model="smollm2", input=t).data[0].embedding for t in TEXTS]
    assert alone == [d.embedding for d in batch.data]
    assert alone[0] != alone[1]


def test_floats_and_token_ids_agree_with_base64(client):
    # The SDK asks for base64 unless told otherwise; floats must decode to the same numbers.
    b64 = client.embeddings.create(model="smollm2", input=TEXTS[0]).data[0].embedding
    floats = client.embeddings.create(model="smollm2", input=TEXTS[0], encoding_format="float").data[0].embedding
    assert floats == b64
    tokens = client.post("/../tokenize", body={"text": TEXTS[0]}, cast_to=object)["tokens"]
    by_ids = client.embeddings.create(model="smollm2", input=[tokens], encoding_format="float").data[0].embedding
    assert by_ids == floats


def test_dimensions_keep_leading_components_normalized(client):
    full = client.embeddings.create(model="smollm2", input=TEXTS[1], encoding_format="float").data[0].embedding
    short = client.embeddings.create(model="smollm2", input=TEXTS[1], dimensions=64,
                                     encoding_format="float").data[0].embedding
    assert len(short) == 64 and abs(norm(short) - 1) < 1e-5
    scale = norm(full[:64])
    assert all(abs(s - f / scale) < 1e-5 for s, f in zip(short, full[:64]))


@pytest.mark.parametrize("body,param", [
    ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "x", "dimensions": 100000}, "dimensions"),
    ({"input": []}, "input"),
    ({"input": [1.5]}, "input"),
    ({"input": "x", "truncate": True}, "truncate"),
    ({"input": ["x" * 20000]}, "input"),
])
def test_refused_fields_are_named(client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.post("/embeddings", body={"model": "smollm2", **body}, cast_to=object)
    assert e.value.body["param"] == param, e.value.body


def test_chat_still_works_beside_embeddings(client):
    r = client.chat.completions.create(model="smollm2", max_tokens=4, temperature=0,
                                       messages=[{"role": "user", "content": "Hi"}])
    assert r.choices[0].message.content


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_an_embedding_models_file_turns_the_route_on_and_a_generative_one_does_not():
    fixture = ROOT / "fixtures" / "qwen3-embedding-tiny.gguf"
    assert fixture.is_file(), f"{fixture} is missing: run scripts/setup-tests.sh"
    proc, base = start_axle("--model", fixture, "--threads", 2, "--context-len", 512)
    try:
        status, body = post(base, "/v1/embeddings", {"input": ["a b c", "d"], "encoding_format": "float"})
        assert status == 200, body
        assert len(body["data"]) == 2 and len(body["data"][0]["embedding"]) == 64
    finally:
        stop(proc)
    proc, base = start_axle("--model", MODEL, "--threads", 2, "--context-len", 512)
    try:
        status, body = post(base, "/v1/embeddings", {"input": "a"})
        assert status == 400 and "--embeddings" in body["error"]["message"], body
    finally:
        stop(proc)


def test_the_python_package_gives_the_served_embeddings(client):
    """`axle.Engine.embed` (same model, pooling and sizes as the server's) gives the served vectors
    bit for bit: texts, one text, token ids; unnormalized on request; a model file that names no
    pooling needs one."""
    import axle

    served = [d.embedding for d in client.embeddings.create(model="smollm2", input=TEXTS, encoding_format="float").data]
    with axle.Engine(str(MODEL), threads=2, context=1024) as e:
        assert e.embed(TEXTS, pooling="last") == served
        assert e.embed(TEXTS[1], pooling="last") == [served[1]]
        assert e.embed(e.tokenize(TEXTS[2]), pooling="last") == [served[2]]
        raw = e.embed(TEXTS[0], pooling="last", normalize=False)[0]
        assert abs(norm(raw) - 1) > 1e-3
        assert max(abs(a / norm(raw) - b) for a, b in zip(raw, served[0])) < 1e-6
        mean = e.embed(TEXTS[0], pooling="mean")[0]
        assert len(mean) == WIDTH and mean != served[0]
        with pytest.raises(ValueError, match="pooling"):
            e.embed(TEXTS[0], pooling="max")
    with axle.Engine(str(MODEL), threads=2, context=256) as e:
        with pytest.raises(axle.AxleError, match="pooling"):
            e.embed(TEXTS[0])
