"""Requests a hostile client would send to `axle serve`, and to the Python package: grammar bombs
of several shapes and sizes (deep `$ref` chains, nested schemas, Lark rule chains and nested
groups, regex groups, grammars that compile but admit nothing), on every route that takes a
format, each answered with a 400 naming its `param` while the server stays up; and bodies that
arrive slowly or never, which must not hold the connection slots that others need.
"""
import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from helpers import MODEL, start_axle, stop


def object_chain(n):
    """A `$ref` chain of `n` objects, each holding the next."""
    defs = {f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}},
                      "required": ["x"], "additionalProperties": False} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def ref_chain(n):
    """A plain `$ref` chain of `n` hops."""
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def lark_chain(n):
    rules = [f'r{i}: "a" r{i + 1}' for i in range(n)]
    return "start: r0\n" + "\n".join(rules) + f'\nr{n}: "b"\n'


def schema(s):
    return {"type": "json_schema", "json_schema": {"name": "bomb", "schema": s}}


# (name, response_format): each must be refused, none may take the server down.
BOMBS = [
    ("objects-300", schema(object_chain(300))),
    ("objects-900", schema(object_chain(900))),
    ("objects-5000", schema(object_chain(5000))),
    ("refs-3000", schema(ref_chain(3000))),
    ("refs-30000", schema(ref_chain(30000))),
    ("lark-3000", {"type": "grammar", "grammar": lark_chain(3000)}),
    ("lark-groups-20000", {"type": "grammar", "grammar": "start: " + "(" * 20000 + '"a"' + ")" * 20000}),
    ("regex-groups-20000", {"type": "regex", "regex": "(" * 20000 + "a" + ")" * 20000}),
    ("lark-embedded-json", {"type": "grammar", "grammar": "start: %json " + json.dumps(object_chain(900))}),
    ("self-ref", schema({"$ref": "#"})),
    ("mutual-refs", schema({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                            "$ref": "#/$defs/a"})),
    ("empty-class", {"type": "regex", "regex": r"[^\s\S]"}),
]


@pytest.fixture(scope="module")
def server():
    assert MODEL.is_file(), f"{MODEL} is missing: run scripts/setup.sh"
    proc, base = start_axle("--model", MODEL, "--threads", "2", "--context-len", "2048")
    yield proc, base
    stop(proc)


def post(base, path, body, timeout=120):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def healthy(base):
    with urllib.request.urlopen(base + "/health", timeout=10) as r:
        return r.status == 200


@pytest.mark.parametrize("name,fmt", BOMBS, ids=[b[0] for b in BOMBS])
def test_grammar_bombs_are_refused_and_the_server_stays_up(server, name, fmt):
    proc, base = server
    routes = [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/generate", {"tokens": [1, 2, 3]}),
    ]
    for path, body in routes:
        for stream in (False, True):
            status, answer = post(base, path, {**body, "max_tokens": 8, "stream": stream, "response_format": fmt})
            assert proc.poll() is None, f"{name} on {path} took the server down"
            assert status == 400, (name, path, stream, status, answer[:300])
            err = json.loads(answer)["error"]
            assert err["param"] == "response_format", (name, err)
            assert "\n" not in err["message"] and len(err["message"]) < 400, err
            assert healthy(base)


def test_tool_schemas_are_checked_whatever_the_tool_choice(server):
    proc, base = server
    for choice in ("auto", "required"):
        tools = [{"type": "function", "function": {"name": "f", "parameters": object_chain(900)}}]
        status, answer = post(base, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "tools": tools, "tool_choice": choice})
        assert status == 400, (choice, answer[:300])
        assert json.loads(answer)["error"]["param"] == "tools", answer[:300]
    # Under `auto` the calls are parsed from text, not forced: a schema the grammar engine would
    # not compile (formats, `uniqueItems`) still serves; forced, it is refused by name.
    odd = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "format": "int32"},
                                         "tags": {"type": "array", "uniqueItems": True}}}}}]
    status, answer = post(base, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "tools": odd, "tool_choice": "auto"})
    assert status == 200, answer[:300]
    assert proc.poll() is None and healthy(base)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "seed": -5}, "seed"),
    ("/v1/completions", {"prompt": "hi", "n": "two"}, "n"),
    ("/v1/generate", {"tokens": [1, -2, 3]}, "tokens[1]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
])
def test_malformed_fields_are_named(server, path, body, param):
    _, base = server
    status, answer = post(base, path, body)
    assert status == 400, answer[:300]
    assert json.loads(answer)["error"]["param"] == param, answer[:300]


def test_duplicate_keys_are_named(server):
    _, base = server
    raw = b'{"prompt": "hi", "max_tokens": 2, "max_tokens": 3}'
    req = urllib.request.Request(base + "/v1/completions", data=raw, headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400
    assert json.loads(e.value.read())["error"]["param"] == "max_tokens"
    # Inside a field too: serde would keep one of the two without a word.
    raw = b'{"prompt": "hi", "max_tokens": 2, "response_format": {"type": "text", "type": "json_object"}}'
    req = urllib.request.Request(base + "/v1/completions", data=raw, headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert json.loads(e.value.read())["error"]["param"] == "response_format.type"


def test_a_sane_format_still_works_after_the_bombs(server):
    _, base = server
    fmt = schema({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                  "additionalProperties": False})
    status, answer = post(base, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "A number as JSON."}], "max_tokens": 20, "temperature": 0,
        "response_format": fmt})
    assert status == 200, answer[:300]
    assert "n" in json.loads(json.loads(answer)["choices"][0]["message"]["content"])


def slow_body(base, sent=b'{"prompt": "'):
    """A connection that sends a complete head for a 1,000-byte body and then only `sent`."""
    host, port = base.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 1000\r\n\r\n" + sent)
    return s


def answer_of(sock, within):
    sock.settimeout(within)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    return data


def test_a_body_that_stops_coming_gets_a_408():
    proc, base = start_axle("--model", MODEL, "--threads", "2", "--body-timeout", "1")
    try:
        s = slow_body(base)
        answer = answer_of(s, 5)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "body_timeout"
        s.close()
    finally:
        stop(proc)


def test_512_slow_bodies_against_the_default_cap_leave_health_answered():
    # The default cap (512) and body timeout (30 s): the slow bodies fill every slot, and a
    # newcomer finds one as the slowest give theirs up.
    proc, base = start_axle("--model", MODEL, "--threads", "2")
    held = []
    try:
        time.sleep(1.0)
        for _ in range(512):
            try:
                held.append(slow_body(base))
            except OSError:
                break
        time.sleep(1.5)  # past the grace a slow body gets under pressure
        answered = 0
        for _ in range(5):
            t0 = time.time()
            assert healthy(base)
            assert time.time() - t0 < 5
            answered += 1
        assert answered == 5 and proc.poll() is None
        assert len(held) == 512
        # The slots came from slow bodies cut with a 408, not from bodies that finished.
        cut = sum(answer_of(s, 0.05).startswith(b"HTTP/1.1 408") for s in held[:64])
        assert cut >= 1, cut
    finally:
        for s in held:
            s.close()
        stop(proc)


def test_the_python_package_survives_the_same_bombs():
    import axle

    with axle.Engine(str(MODEL), threads=2, context=512) as e:
        for name, fmt in BOMBS:
            with pytest.raises(axle.RequestError) as err:
                e.generate("hi", response_format=fmt, max_tokens=4)
            assert err.value.field == "response_format", name
        c = e.generate("A phone number: ", response_format={"type": "regex", "regex": r"[0-9]{3}"},
                       temperature=0, max_tokens=8)
        assert len(c.text) == 3, c.text


# Corrupted files of the newer architectures that aborted the process before (GGML_ASSERT):
# through the Python package they are refused with an exception, or run.
CORRUPTED = [
    ("qwen35moe-tiny", "qwen35moe.rope.dimension_sections=zeros"),
    ("qwen35moe-tiny", "qwen35moe.rope.dimension_sections=[0]"),
    ("qwen35moe-tiny", "qwen35moe.rope.dimension_sections removed"),
    ("qwen35moe-tiny", "blk.0.ssm_conv1d.weight as F16"),
    ("qwen3next-tiny", "blk.0.ssm_conv1d.weight as F16"),
    ("gemma4-tiny", "per_layer_model_proj.weight as F32"),
    ("gpt-oss-tiny", "blk.0.ffn_gate_exps.bias as F16"),
    ("gpt-oss-tiny", "blk.0.ffn_down_exps.bias as Q8_0"),
    ("gemma4moe-tiny", "blk.0.ffn_gate_inp.weight removed"),
    ("gemma4-tiny", "gemma4.final_logit_softcapping=-1.0"),
    ("gemma4-tiny", "gemma4.rope.freq_base_swa=nan"),
]


def test_the_python_package_survives_corrupted_files(tmp_path):
    import sys

    import axle

    from helpers import ROOT
    sys.path.insert(0, str(ROOT / "scripts"))
    import gguf_corpus

    for fixture, wanted in CORRUPTED:
        found = [w for n, _, w in gguf_corpus.variants(str(ROOT / "fixtures" / f"{fixture}.gguf")) if n == wanted]
        assert found, f"{fixture} has no variant {wanted}"
        path = tmp_path / f"{fixture}.gguf"
        found[0](str(path))
        try:
            with axle.Engine(str(path), threads=1, context=256) as e:
                c = e.generate("Hello world", max_tokens=3, temperature=0)
                assert c.text or c.finish_reason == "length", (wanted, c)
        except axle.ModelError as err:
            assert str(err), wanted
    with pytest.raises(axle.RequestError) as err:
        with axle.Engine(str(ROOT / "fixtures" / "llama-tiny.gguf"), threads=1, context=256) as e:
            e.generate(b"Hello", max_tokens=2)
    assert err.value.field == "prompt"
