"""`axle serve` driven by the official `anthropic` Python client (pinned in requirements.txt).

SmolLM2-135M on a free loopback port: blocking and streamed messages (the same text), a forced
tool call and a tool-result round trip, `count_tokens` against the reported usage, and the SDK's
error classes for a wrong key and refused fields. Today's SDK has no sampling fields, so the tests
send `temperature` through `extra_body` for greedy, comparable answers.
"""
import anthropic
import pytest

from helpers import MODEL, start_axle

KEY = "test-key"
GREEDY = {"temperature": 0}
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def server():
    assert MODEL.is_file(), f"{MODEL} is missing: run scripts/fetch-models.sh"
    proc, base = start_axle("--model", MODEL, "--threads", 2, "--api-key", KEY, "--model-alias", "smollm2",
                            "--context-len", 1024, "--kv-slots", 4096)
    yield base
    proc.terminate()
    assert proc.wait(timeout=30) == 0, "graceful shutdown should exit cleanly"


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server, api_key=KEY, max_retries=0, timeout=120)


def ask(client, **kw):
    kw.setdefault("max_tokens", 16)
    kw.setdefault("messages", [{"role": "user", "content": "Name a colour."}])
    return client.messages.create(model="smollm2", system="You are terse.", extra_body=GREEDY, **kw)


def test_blocking_and_streamed_messages(client):
    m = ask(client)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.output_tokens > 0 and m.usage.input_tokens > 0
    with client.messages.stream(model="smollm2", system="You are terse.", max_tokens=16, extra_body=GREEDY,
                                messages=[{"role": "user", "content": "Name a colour."}]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == m.content[0].text
    assert final.content[0].text == m.content[0].text
    assert final.stop_reason == m.stop_reason
    assert final.usage.output_tokens == m.usage.output_tokens


def test_count_tokens_matches_usage(client):
    m = ask(client)
    n = client.messages.count_tokens(model="smollm2", system="You are terse.",
                                     messages=[{"role": "user", "content": "Name a colour."}])
    assert n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def test_forced_tool_call_and_result_round_trip(client):
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = ask(client, max_tokens=48, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
            messages=question)
    assert m.stop_reason == "tool_use"
    call = next(b for b in m.content if b.type == "tool_use")
    assert call.name == "get_weather" and isinstance(call.input["city"], str)
    # Streamed, the SDK assembles the same input from the JSON deltas.
    with client.messages.stream(model="smollm2", system="You are terse.", max_tokens=48, extra_body=GREEDY,
                                tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
                                messages=question) as s:
        final = s.get_final_message()
    streamed = next(b for b in final.content if b.type == "tool_use")
    assert streamed.input == call.input and final.stop_reason == "tool_use"
    answer = ask(client, max_tokens=16, tools=[WEATHER], messages=question + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C and sunny"}]},
    ])
    assert answer.content[0].type == "text"


def test_the_matched_stop_sequence_is_named(client):
    """Of several stop sequences, the one that ended the answer is named, blocking and streamed."""
    free = ask(client, max_tokens=24).content[0].text
    words = free.split()
    assert len(words) >= 3, free
    stops = ["@@never@@", words[2], "%%never%%"]
    m = ask(client, max_tokens=24, stop_sequences=stops)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == words[2], m
    assert words[2] not in m.content[0].text
    with client.messages.stream(model="smollm2", system="You are terse.", max_tokens=24, extra_body=GREEDY,
                                stop_sequences=stops,
                                messages=[{"role": "user", "content": "Name a colour."}]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == words[2]


def test_errors_have_the_sdk_classes(server, client):
    wrong = anthropic.Anthropic(base_url=server, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model="smollm2", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.BadRequestError) as e:
        ask(client, thinking={"type": "sometimes"})
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "thinking" in e.value.message
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-nope", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
