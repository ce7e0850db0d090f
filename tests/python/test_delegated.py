"""Backend resolution and delegated routes, against real upstream servers started here.

Upstreams: an `axle serve` (native, SmolLM2) acting as the OpenAI-compatible upstream, llama.cpp's
server as llama-cpp-python packages it (`python -m llama_cpp.server`, same GGUF), and a scripted
fake for the failure cases (errors, stalls). The delegated side is `axle serve --backend ...`,
driven by the official openai client, plus `axle generate` for the CLI route.
"""
import hashlib
import http.server
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from helpers import BIN, MODEL, free_port, start_axle, stop, wait_until_up, write_gguf

PROMPTS = ["What is the capital of France?", "Write a haiku about rain.", "List three colors."]


@pytest.fixture(scope="module")
def native_upstream():
    assert MODEL.is_file(), f"{MODEL} is missing: run scripts/fetch-models.sh"
    proc, base = start_axle("--model", MODEL, "--threads", "2", "--context-len", "1024",
                            "--model-alias", "smol-native")
    yield base
    stop(proc)


@pytest.fixture(scope="module")
def llama_cpp_upstream(tmp_path_factory):
    assert MODEL.is_file(), f"{MODEL} is missing: run scripts/fetch-models.sh"
    port = free_port()
    # llama.cpp logs a lot while loading: to a file, not a pipe nobody drains.
    log = open(tmp_path_factory.mktemp("llama_cpp") / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(MODEL), "--port", str(port),
         "--host", "127.0.0.1", "--n_ctx", "2048", "--n_threads", "2", "--model_alias", "smol-llamacpp"],
        stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    wait_until_up(proc, base + "/v1/models")
    yield base
    stop(proc)


class Fake(http.server.ThreadingHTTPServer):
    """A scripted upstream: `mode` says how the next POST is answered; bodies are recorded."""
    daemon_threads = True
    mode = "ok"
    bodies = []


class FakeHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, status, obj):
        b = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self):
        self.reply(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.bodies.append(body)
        mode = self.server.mode
        if mode == "error500":
            return self.reply(500, {"error": {"message": "the upstream fell over", "type": "server_error"}})
        if mode == "stall_head":
            time.sleep(30)
            return
        if not body.get("stream"):
            return self.reply(200, {"choices": [{"index": 0, "text": "ok", "message": {"role": "assistant", "content": "ok"},
                                                 "finish_reason": "stop"}],
                                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for word in ["one", " two"]:
            chunk = {"choices": [{"index": 0, "delta": {"content": word}, "text": word, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        if mode == "stall_stream":
            time.sleep(30)
            return
        if mode == "cut_stream":
            return  # the connection closes with no finish and no [DONE]
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def fake():
    srv = Fake(("127.0.0.1", 0), FakeHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


def runtime(base):
    with urllib.request.urlopen(base + "/v1/runtime", timeout=10) as r:
        return json.load(r)


def chat(c, model, text, **kw):
    return c.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                     temperature=0, max_tokens=24, **kw)


def streamed(c, model, text):
    """Streams a chat request; returns (text, runtime report from the finish chunk, usage)."""
    out, report, usage = "", None, None
    for ev in c.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                        temperature=0, max_tokens=24, stream=True,
                                        stream_options={"include_usage": True}):
        if ev.choices:
            out += ev.choices[0].delta.content or ""
            if ev.choices[0].finish_reason:
                report = (ev.model_extra or {}).get("runtime")
        if ev.usage:
            usage = ev.usage
    return out, report, usage


def test_native_runtime_report(native_upstream):
    r = runtime(native_upstream)
    assert r["selected_backend"] == "native" and r["support_tier"] == "native"
    assert r["resolution_policy"] == "auto" and r["architecture"] == "llama"
    assert r["model_id"] == "sha256:" + hashlib.sha256(MODEL.read_bytes()).hexdigest()
    assert r["upstream_url"] is None


def check_delegation(upstream_base, upstream_model, backend_flag, expected_backend):
    """Greedy chat and completions through the delegated route equal the upstream's own output."""
    proc, base = start_axle("--backend", backend_flag, "--upstream", upstream_base, "--model-alias", "delegated")
    try:
        rep = runtime(base)
        assert rep["selected_backend"] == expected_backend and rep["support_tier"] == "delegated"
        assert rep["upstream_url"] == upstream_base and rep["upstream_model"] == upstream_model
        assert rep["model_id"] == f"upstream:{upstream_model}"
        up, dl = client(upstream_base), client(base)
        for p in PROMPTS:
            # Both upstreams reuse cached prompt prefixes, and a prompt computed in other chunk
            # shapes can flip a near-tie: run it once so every compared request sees the same cache.
            chat(up, upstream_model, p)
            direct = chat(up, upstream_model, p)
            via = chat(dl, "delegated", p)
            assert via.choices[0].message.content == direct.choices[0].message.content, p
            assert via.choices[0].finish_reason == direct.choices[0].finish_reason
            assert via.usage.completion_tokens == direct.usage.completion_tokens
            assert via.model == "delegated"
            assert via.model_extra["runtime"]["selected_backend"] == expected_backend
            text, report, usage = streamed(dl, "delegated", p)
            assert text == direct.choices[0].message.content, p
            assert report["upstream_url"] == upstream_base
            if expected_backend == "openai_compatible":
                assert usage is not None and usage.completion_tokens == direct.usage.completion_tokens
            else:  # llama-cpp-python sends no counts when streaming, and we invent none
                assert usage is None
        # Plain completions, with stop strings and a seed passed through.
        kw = dict(prompt="The three primary colors are", temperature=0, max_tokens=20, stop=["."], seed=3)
        up.completions.create(model=upstream_model, **kw)
        direct = up.completions.create(model=upstream_model, **kw)
        via = dl.completions.create(model="delegated", **kw)
        assert via.choices[0].text == direct.choices[0].text
        # Token-id routes are native only, and say so.
        req = urllib.request.Request(base + "/v1/generate", data=json.dumps({"tokens": [1, 2]}).encode(),
                                     headers={"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        err = json.loads(e.value.read().decode())["error"]
        assert e.value.code == 400 and "no token-id routes" in err["message"] and err["param"] == "tokens"
    finally:
        stop(proc)


def test_delegated_to_axle_as_openai_upstream(native_upstream):
    check_delegation(native_upstream, "smol-native", "openai", "openai_compatible")


def test_delegated_to_llama_cpp_server(llama_cpp_upstream):
    check_delegation(llama_cpp_upstream, "smol-llamacpp", "llama-cpp", "llama_cpp")


def test_formats_and_tools_pass_through(native_upstream):
    """`response_format`, `tools` and `tool_choice` reach an upstream that supports them (a native
    Axle), and its calls come back, blocking and streamed, as the upstream's own."""
    proc, base = start_axle("--backend", "openai", "--upstream", native_upstream, "--model-alias", "delegated")
    try:
        up, dl = client(native_upstream), client(base)
        ask = [{"role": "user", "content": "Add 2 and 3."}]
        tools = [{"type": "function", "function": {"name": "add", "parameters": {
            "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"]}}}]
        kw = dict(messages=ask, tools=tools, tool_choice={"type": "function", "function": {"name": "add"}},
                  temperature=0, max_tokens=60)
        direct = up.chat.completions.create(model="smol-native", **kw)
        via = dl.chat.completions.create(model="delegated", **kw)
        assert via.choices[0].finish_reason == "tool_calls"
        got = [(c.function.name, c.function.arguments) for c in via.choices[0].message.tool_calls]
        want = [(c.function.name, c.function.arguments) for c in direct.choices[0].message.tool_calls]
        assert got == want and got[0][0] == "add"
        calls, reason = {}, None
        for ev in dl.chat.completions.create(model="delegated", stream=True, **kw):
            for tc in (ev.choices[0].delta.tool_calls or []) if ev.choices else []:
                calls.setdefault(tc.index, ["", ""])
                calls[tc.index][0] += tc.function.name or ""
                calls[tc.index][1] += tc.function.arguments or ""
            if ev.choices and ev.choices[0].finish_reason:
                reason = ev.choices[0].finish_reason
        assert reason == "tool_calls" and [tuple(v) for v in calls.values()] == want
        schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
        fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
        via = dl.chat.completions.create(model="delegated", messages=ask, response_format=fmt, temperature=0,
                                         max_tokens=30)
        assert isinstance(json.loads(via.choices[0].message.content)["answer"], int)
        # What OpenAI's API has no field for is refused here, by name.
        with pytest.raises(openai.BadRequestError) as e:
            dl.chat.completions.create(model="delegated", messages=ask, max_tokens=5,
                                       response_format={"type": "regex", "regex": "a+"})
        assert e.value.body["param"] == "response_format"
    finally:
        stop(proc)


def test_cli_generate_through_upstream(native_upstream):
    client(native_upstream).completions.create(model="smol-native", prompt="Once upon a time", max_tokens=1)
    direct = client(native_upstream).completions.create(model="smol-native", prompt="Once upon a time",
                                                        temperature=0, max_tokens=16, seed=0)
    r = subprocess.run([str(BIN), "generate", "--backend", "openai", "--upstream", native_upstream,
                        "--prompt", "Once upon a time", "--max-tokens", "16"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == direct.choices[0].text
    assert "openai_compatible (delegated)" in r.stderr


def test_auto_policy_never_delegates_silently(native_upstream, tmp_path):
    odd = tmp_path / "odd.gguf"
    write_gguf(odd, "mamba9")
    r = subprocess.run([str(BIN), "serve", "--model", str(odd), "--upstream", native_upstream,
                        "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "`mamba9` is not implemented natively" in r.stderr and "--allow-delegation" in r.stderr
    proc, base = start_axle("--model", odd, "--upstream", native_upstream, "--allow-delegation")
    try:
        rep = runtime(base)
        assert rep["selected_backend"] == "openai_compatible" and rep["resolution_policy"] == "auto"
        assert rep["delegation_allowed"] and rep["architecture"] == "mamba9"
        assert "mamba9" in rep["reason"]
        assert chat(client(base), "odd", "Say hi").choices[0].message.content
    finally:
        stop(proc)


def test_sampling_fields_pass_through(fake):
    url = f"http://127.0.0.1:{fake.server_address[1]}"
    fake.mode = "ok"
    for flag, rep_key in [("llama-cpp", "repeat_penalty"), ("openai", "repetition_penalty")]:
        proc, base = start_axle("--backend", flag, "--upstream", url)
        try:
            fake.bodies.clear()
            r = client(base).chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "x"}], temperature=0.7, top_p=0.9,
                seed=11, stop=["END"], max_tokens=33,
                extra_body={"top_k": 17, "min_p": 0.05, "repetition_penalty": 1.2})
            assert r.choices[0].message.content == "ok"
            b = fake.bodies[-1]
            assert b["model"] == "fake-model" and b["messages"] == [{"role": "user", "content": "x"}]
            assert (b["temperature"], b["top_p"], b["top_k"], b["seed"], b["stop"], b["max_tokens"]) == \
                (pytest.approx(0.7), pytest.approx(0.9), 17, 11, ["END"], 33)
            assert b["min_p"] == pytest.approx(0.05) and b[rep_key] == pytest.approx(1.2)
            assert "stream" not in b
        finally:
            stop(proc)


def api_error(fn):
    with pytest.raises(openai.APIStatusError) as e:
        fn()
    return e.value


def test_unreachable_upstream(native_upstream):
    dead = f"http://127.0.0.1:{free_port()}"
    t0 = time.time()
    r = subprocess.run([str(BIN), "serve", "--backend", "openai", "--upstream", dead, "--port", str(free_port())],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "unreachable" in r.stderr and dead in r.stderr
    assert time.time() - t0 < 20
    # An upstream that goes away after start: 502 naming it, for blocking and streaming requests.
    uproc, ubase = start_axle("--model", MODEL, "--threads", "2", "--context-len", "512")
    proc, base = start_axle("--backend", "openai", "--upstream", ubase)
    try:
        stop(uproc)
        c = client(base)
        e = api_error(lambda: chat(c, "", "hi"))
        assert e.status_code == 502 and "unreachable" in e.message and ubase in e.message
        e = api_error(lambda: list(c.chat.completions.create(
            model="", messages=[{"role": "user", "content": "hi"}], stream=True)))
        assert e.status_code == 502
    finally:
        stop(proc)


def test_upstream_errors_are_mapped(fake, native_upstream):
    url = f"http://127.0.0.1:{fake.server_address[1]}"
    fake.mode = "error500"
    proc, base = start_axle("--backend", "openai", "--upstream", url)
    try:
        e = api_error(lambda: chat(client(base), "fake-model", "hi"))
        assert e.status_code == 502 and "the upstream fell over" in e.message and url in e.message
    finally:
        stop(proc)
    # The upstream's own 400 (prompt over its context) reaches the client as a 400 with its words.
    proc, base = start_axle("--backend", "openai", "--upstream", native_upstream)
    try:
        e = api_error(lambda: chat(client(base), "smol-native", "word " * 1500))
        assert e.status_code == 400 and "does not fit the context" in e.message
    finally:
        stop(proc)


def test_upstream_timeouts(fake):
    url = f"http://127.0.0.1:{fake.server_address[1]}"
    proc, base = start_axle("--backend", "openai", "--upstream", url, "--upstream-timeout", "1.5")
    try:
        c = client(base)
        fake.mode = "stall_head"
        t0 = time.time()
        e = api_error(lambda: chat(c, "fake-model", "hi"))
        assert e.status_code == 504 and "did not answer within" in e.message
        assert time.time() - t0 < 10
        # Mid-stream: the text so far arrives, then an error event ends the stream.
        fake.mode = "stall_stream"
        got = ""
        t0 = time.time()
        with pytest.raises(openai.APIError) as e:
            for ev in c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}],
                                                stream=True):
                if ev.choices:
                    got += ev.choices[0].delta.content or ""
        assert got == "one two"
        assert "did not answer within" in str(e.value)
        assert time.time() - t0 < 10
    finally:
        stop(proc)


def test_a_cut_upstream_stream_ends_with_an_error_event(fake):
    url = f"http://127.0.0.1:{fake.server_address[1]}"
    fake.mode = "cut_stream"
    proc, base = start_axle("--backend", "openai", "--upstream", url)
    try:
        req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps({
            "model": "fake-model", "messages": [{"role": "user", "content": "x"}], "stream": True}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            events = [line[len("data: "):] for line in r.read().decode().splitlines() if line.startswith("data: ")]
        assert events and events[-1] != "[DONE]", events
        last = json.loads(events[-1])
        assert "error" in last and last["error"]["message"], last
    finally:
        fake.mode = "ok"
        stop(proc)


def test_thinking_from_the_upstream_stays_thinking(tmp_path_factory):
    """An upstream that separates thinking (`reasoning_content`: here an `axle serve` whose
    template opens the thinking, test_reasoning.py's) keeps it separate through the delegated
    route: in chat completions, blocking and streamed, and as thinking blocks in Messages."""
    from test_reasoning import SWITCH, retemplated
    up_proc, up_base = start_axle("--model", retemplated(tmp_path_factory, SWITCH), "--threads", 2,
                                  "--context-len", 512, "--model-alias", "thinker")
    proc, base = start_axle("--backend", "openai", "--upstream", up_base, "--model-alias", "delegated")
    try:
        ask = dict(messages=[{"role": "user", "content": "Why is the sky blue?"}], temperature=0, max_tokens=12)
        direct = client(up_base).chat.completions.create(model="thinker", **ask).choices[0].message
        thought = direct.model_extra["reasoning_content"]
        assert thought, "the upstream wrote no thinking"
        via = client(base).chat.completions.create(model="delegated", **ask).choices[0].message
        assert via.model_extra["reasoning_content"] == thought and via.content == direct.content
        pieces = [ev.choices[0].delta for ev in client(base).chat.completions.create(model="delegated", stream=True, **ask)
                  if ev.choices]
        assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in pieces) == thought
        assert "".join(d.content or "" for d in pieces) == (direct.content or "")
        def messages(thinking):
            return urllib.request.Request(base + "/v1/messages", headers={"Content-Type": "application/json"},
                                          data=json.dumps({"model": "delegated", "max_tokens": 12, "temperature": 0,
                                                           "thinking": thinking, "messages": ask["messages"]}).encode())
        with urllib.request.urlopen(messages({"type": "enabled"}), timeout=120) as r:
            blocks = json.load(r)["content"]
        assert blocks[0]["type"] == "thinking" and blocks[0]["thinking"] == thought, blocks
        # A bound on the thinking is enforced on native routes only: refused here, by name.
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(messages({"type": "enabled", "budget_tokens": 1024}), timeout=120)
        body = json.load(e.value)
        assert e.value.code == 400 and "budget_tokens" in body["error"]["message"], body
    finally:
        stop(proc)
        stop(up_proc)
