"""Structured output and tool calling through the official `openai` client (pinned).

`axle serve` with SmolLM2-135M: `client.chat.completions.parse` with a pydantic model,
`response_format` json_object and json_schema, tools with two functions and `tool_choice` each
way (auto, none, required, a named function), blocking and streamed, a tool result sent back, and
the 400s that name `response_format`, `tool_choice` and `tools`.
"""
import json
import typing

import openai
import pydantic
import pytest

from helpers import MODEL, start_axle, stop


@pytest.fixture(scope="module")
def client():
    assert MODEL.is_file(), f"{MODEL} is missing: run scripts/fetch-models.sh"
    proc, base = start_axle("--model", MODEL, "--threads", "2", "--model-alias", "smollm2",
                            "--context-len", "2048")
    yield openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
    stop(proc)


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                       "required": ["a", "b"], "additionalProperties": False}}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris today?"}]


class City(pydantic.BaseModel):
    name: str
    country: str
    population: int = pydantic.Field(ge=0)
    landmarks: typing.List[str] = pydantic.Field(max_length=3)
    kind: typing.Literal["capital", "city", "town"]


def test_parse_with_a_pydantic_model(client):
    for kw in ({"temperature": 0}, {"temperature": 0.8, "seed": 3}):
        r = client.chat.completions.parse(
            model="smollm2", messages=[{"role": "user", "content": "Describe Paris as JSON."}],
            response_format=City, max_tokens=200, frequency_penalty=0.5, **kw)
        city = r.choices[0].message.parsed
        assert isinstance(city, City), r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop"


def test_json_object_and_streamed_json_schema(client):
    r = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Give me a JSON object about a cat."}],
        response_format={"type": "json_object"}, temperature=0, max_tokens=120, frequency_penalty=0.5)
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    stream = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "What is 2 + 2?"}], stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "sum", "schema": schema, "strict": True}},
        temperature=0, max_tokens=40)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert isinstance(json.loads(text)["answer"], int), text


def test_token_route_takes_a_format(client):
    import urllib.request

    base = str(client.base_url).rstrip("/").removesuffix("/v1")

    def post(path, body):
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read().decode())

    ids = post("/tokenize", {"text": "A JSON object about a dog:"})["tokens"]
    out = post("/v1/generate", {"tokens": ids, "max_tokens": 60, "temperature": 0,
                                "response_format": {"type": "json_object"}, "frequency_penalty": 0.5})
    text = post("/detokenize", {"tokens": out["choices"][0]["tokens"]})["text"]
    assert isinstance(json.loads(text), dict), text


def call_args(call):
    args = json.loads(call.function.arguments)
    assert isinstance(args, dict)
    return args


def test_tool_choice_required_and_named_blocking(client):
    r = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, tool_choice="required",
                                       temperature=0, max_tokens=120)
    m = r.choices[0]
    assert m.finish_reason == "tool_calls" and m.message.tool_calls, m
    for call in m.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in ("get_weather", "add")
        call_args(call)
    r = client.chat.completions.create(
        model="smollm2", messages=ASK, tools=TOOLS, temperature=0, max_tokens=120,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    args = call_args(calls[0])
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    assert r.choices[0].message.content is None


def test_tool_choice_streamed(client):
    stream = client.chat.completions.create(
        model="smollm2", messages=ASK, tools=TOOLS, stream=True, temperature=0, max_tokens=120,
        tool_choice={"type": "function", "function": {"name": "add"}})
    calls, reasons, text = {}, [], ""
    for chunk in stream:
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        text += d.content or ""
        for tc in d.tool_calls or []:
            calls.setdefault(tc.index, {"name": "", "arguments": ""})
            calls[tc.index]["name"] += tc.function.name or ""
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        if chunk.choices[0].finish_reason:
            reasons.append(chunk.choices[0].finish_reason)
    assert reasons == ["tool_calls"] and list(calls) == [0], (reasons, calls)
    assert calls[0]["name"] == "add"
    assert set(json.loads(calls[0]["arguments"])) == {"a", "b"}
    assert "<tool_call>" not in text


def test_auto_and_none_and_a_tool_result_round_trip(client):
    # auto: whatever the model writes, the response is well formed: calls parse, or it is text.
    r = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, tool_choice="auto",
                                       temperature=0, max_tokens=80)
    m = r.choices[0].message
    if r.choices[0].finish_reason == "tool_calls":
        for call in m.tool_calls:
            call_args(call)
    else:
        assert m.content is not None and not m.tool_calls
    # none: never a call.
    r = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, tool_choice="none",
                                       temperature=0, max_tokens=30)
    assert r.choices[0].finish_reason in ("stop", "length") and not r.choices[0].message.tool_calls
    # The call and its result go back through the template.
    first = client.chat.completions.create(
        model="smollm2", messages=ASK, tools=TOOLS, temperature=0, max_tokens=120,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
    ]
    r = client.chat.completions.create(model="smollm2", messages=history, tools=TOOLS, temperature=0,
                                       max_tokens=40, tool_choice="none")
    assert r.choices[0].message.content


def bad_request(fn):
    with pytest.raises(openai.BadRequestError) as e:
        fn()
    return e.value.body


def test_bad_formats_and_tools_name_their_field(client):
    def create(**kw):
        return lambda: client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=5, **kw)

    cases = [
        (create(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}),
         "response_format"),
        (create(response_format={"type": "yaml"}), "response_format"),
        (create(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
        (create(tool_choice="required"), "tool_choice"),
        (create(tools=[{"type": "function", "function": {"name": "bad name"}}]), "tools"),
        (create(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), "response_format"),
    ]
    for fn, param in cases:
        err = bad_request(fn)
        assert err["param"] == param, err
        assert err["message"], err
