"""`axle serve`'s `/v1/responses` driven by the official `openai` client's `responses` API (pinned in
requirements.txt), on SmolLM2-135M: blocking and streamed (the SDK's event accumulator), a function
call round trip, `text.format` with a JSON schema, `previous_response_id`, and refusals.
"""
import json

import openai
import pytest

from helpers import MODEL, start_axle

KEY = "test-key"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def client():
    assert MODEL.is_file(), f"{MODEL} is missing: run scripts/fetch-models.sh"
    proc, base = start_axle("--model", MODEL, "--threads", 2, "--api-key", KEY, "--model-alias", "smollm2",
                            "--context-len", 1024, "--kv-slots", 4096)
    yield openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=120)
    proc.terminate()
    assert proc.wait(timeout=30) == 0, "graceful shutdown should exit cleanly"


def create(client, **kw):
    kw.setdefault("max_output_tokens", 16)
    kw.setdefault("temperature", 0)
    kw.setdefault("instructions", "You are terse.")
    return client.responses.create(model="smollm2", **kw)


def test_blocking_and_streamed(client):
    r = create(client, input="Name a colour.")
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output_text
    assert r.usage.output_tokens > 0 and r.usage.input_tokens > 0
    with client.responses.stream(model="smollm2", input="Name a colour.", max_output_tokens=16, temperature=0,
                                 instructions="You are terse.") as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == r.output_text
    assert final.output_text == r.output_text


def test_function_call_round_trip(client):
    r = create(client, input="What is the weather in Paris?", tools=[WEATHER], max_output_tokens=48,
               tool_choice={"type": "function", "name": "get_weather"})
    call = next(i for i in r.output if i.type == "function_call")
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    a = create(client, previous_response_id=r.id, tools=[WEATHER],
               input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C and sunny"}])
    assert a.output_text


def test_json_schema_format(client):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
              "required": ["colour"], "additionalProperties": False}
    r = create(client, input="Name a colour as JSON.", max_output_tokens=40,
               text={"format": {"type": "json_schema", "name": "colour", "schema": schema, "strict": True}})
    assert isinstance(json.loads(r.output_text)["colour"], str)


def test_previous_response_id_and_refusals(client):
    r = create(client, input="Name a colour.")
    f = create(client, input="Another one.", previous_response_id=r.id)
    assert f.previous_response_id == r.id
    assert f.usage.input_tokens > r.usage.input_tokens
    assert f.usage.input_tokens_details.cached_tokens > 0
    with pytest.raises(openai.BadRequestError) as e:
        create(client, input="x", previous_response_id="resp_unknown")
    assert e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as e:
        create(client, input="x", reasoning={"effort": "extreme"})
    assert e.value.body["param"] == "reasoning"
