"""Thinking split from the answer, through `axle serve` and the official clients.

SmolLM2-135M with a thinking chat template (ChatML that marks thinking, as Qwen3's does), written
by gguf's own metadata tool; a pattern constrains the output to a thinking block and an answer,
so the split is known (a pattern that writes the closing marker covers the thinking too; other
constraints cover the answer after it). Chat completions give
`reasoning_content` and `content` (blocking, and streamed in deltas); Messages with thinking on
give a `thinking` block before the text (blocking and streamed), and with thinking off the answer
alone.
"""
import json
import re
import subprocess
import sys
import urllib.request

import anthropic
import axle
import openai
import pytest

from helpers import MODEL, start_axle

KEY = "test-key"
TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
    "{#- the model thinks between <think> and </think> #}"
)
PATTERN = r"<think>\n[a-z]{2,8}( [a-z]{2,8}){1,3}\n</think>\n\n[A-Z][a-z]{2,8}\."


# A template that reads `enable_thinking` (Qwen3's way): thinking opens in the generation prompt
# unless it is turned off, when the prompt closes an empty one.
SWITCH = TEMPLATE.replace(
    "assistant\n{% endif",
    "assistant\n{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif")


def retemplated(tmp_path_factory, template):
    assert MODEL.is_file(), f"{MODEL} is missing: run scripts/fetch-models.sh"
    model = tmp_path_factory.mktemp("thinking") / "smollm2-thinking.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(MODEL), str(model),
                    "--chat-template", template, "--force"], check=True, capture_output=True)
    return model


def served(tmp_path_factory, template):
    """A module's server for `template`: its URL, then a clean shutdown."""
    model = retemplated(tmp_path_factory, template)
    proc, url = start_axle("--model", model, "--threads", 2, "--api-key", KEY, "--model-alias", "thinker",
                           "--context-len", 512, "--kv-slots", 2048)
    yield url
    proc.terminate()
    assert proc.wait(timeout=30) == 0, "graceful shutdown should exit cleanly"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    yield from served(tmp_path_factory, TEMPLATE)


@pytest.fixture(scope="module")
def switch(tmp_path_factory):
    yield from served(tmp_path_factory, SWITCH)


def test_a_constraint_covers_the_answer_after_the_thinking(switch):
    """Where the prompt opens the thinking, the thinking is free text (the constraint starts after
    its closing marker: crates/axle-structured's unit test walks the whole grammar); SmolLM2 does not
    close it within 30 tokens, so all of them are reasoning. With the thinking turned off, the
    constraint starts at once."""
    client = openai.OpenAI(base_url=switch + "/v1", api_key=KEY, max_retries=0, timeout=120)
    kw = dict(model="thinker", messages=[{"role": "user", "content": "A colour as JSON."}], temperature=0,
              max_tokens=30, response_format={"type": "json_object"})
    c = client.chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "length" and not c.message.content, c
    assert c.message.model_extra["reasoning_content"].strip(), c
    off = client.chat.completions.create(reasoning_effort="none", **kw).choices[0].message
    assert off.content.lstrip().startswith("{"), off
    assert "reasoning_content" not in (off.model_extra or {}), off


def check_split(reasoning, answer):
    assert re.fullmatch(r"\n[a-z]{2,8}( [a-z]{2,8}){1,3}\n", reasoning), repr(reasoning)
    assert re.fullmatch(r"[A-Z][a-z]{2,8}\.", answer), repr(answer)


def test_chat_completions_give_reasoning_content(base):
    client = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=120)
    kw = dict(model="thinker", messages=[{"role": "user", "content": "Think, then name a colour."}],
              temperature=0, max_tokens=40, extra_body={"response_format": {"type": "regex", "regex": PATTERN}})
    m = client.chat.completions.create(**kw).choices[0].message
    check_split(m.model_extra["reasoning_content"], m.content)
    reasoning, answer = "", ""
    for c in client.chat.completions.create(stream=True, **kw):
        if c.choices:
            d = c.choices[0].delta
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            answer += d.content or ""
    assert (reasoning, answer) == (m.model_extra["reasoning_content"], m.content)


def test_messages_give_thinking_blocks(base):
    client = anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0, timeout=120)
    kw = dict(model="thinker", max_tokens=40, messages=[{"role": "user", "content": "Think, then name a colour."}],
              extra_body={"temperature": 0, "output_config": {"format": {"type": "regex", "regex": PATTERN}}})
    m = client.messages.create(thinking={"type": "enabled", "budget_tokens": 1024}, **kw)
    assert [b.type for b in m.content] == ["thinking", "text"]
    check_split(m.content[0].thinking, m.content[1].text)
    with client.messages.stream(thinking={"type": "enabled", "budget_tokens": 1024}, **kw) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == m.content[0].thinking and final.content[1].text == m.content[1].text
    # Without thinking asked for, the answer alone.
    plain = client.messages.create(**kw)
    assert [b.type for b in plain.content] == ["text"] and plain.content[0].text == m.content[1].text


QUESTION = "Think, then name a colour."


def test_responses_give_reasoning_items(switch):
    """The prompt opens the thinking and the model never closes it in 12 tokens: all of them are
    thinking, a reasoning item before an empty message, blocking and streamed alike."""
    client = openai.OpenAI(base_url=switch + "/v1", api_key=KEY, max_retries=0, timeout=120)
    kw = dict(model="thinker", input=QUESTION, temperature=0, max_output_tokens=12,
              reasoning={"effort": "low", "summary": "auto"})
    r = client.responses.create(**kw)
    assert [o.type for o in r.output] == ["reasoning", "message"], r.output
    thought = r.output[0].content[0].text
    assert thought.strip() and r.output[0].content[0].type == "reasoning_text"
    assert r.usage.output_tokens == 12
    assert r.usage.output_tokens_details.reasoning_tokens == 12
    deltas, final = "", None
    for e in client.responses.create(stream=True, **kw):
        if e.type == "response.reasoning_text.delta":
            assert e.output_index == 0
            deltas += e.delta
        if e.type in ("response.completed", "response.incomplete"):
            final = e.response
    assert deltas == thought
    assert [o.type for o in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == thought


def test_thinking_turned_off_reaches_the_template(switch):
    """Each surface's way of turning thinking off renders the closed thinking, so the model
    answers at once: no reasoning, no reasoning tokens, the same answer everywhere."""
    client = openai.OpenAI(base_url=switch + "/v1", api_key=KEY, max_retries=0, timeout=120)
    kw = dict(model="thinker", messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=12)
    on = client.chat.completions.create(**kw)
    assert on.choices[0].message.model_extra["reasoning_content"].strip()
    assert on.usage.completion_tokens_details.reasoning_tokens == on.usage.completion_tokens
    off = client.chat.completions.create(reasoning_effort="none", **kw)
    answer = off.choices[0].message.content
    assert answer.strip() and "reasoning_content" not in (off.choices[0].message.model_extra or {})
    assert off.usage.completion_tokens_details.reasoning_tokens == 0
    kwargs = client.chat.completions.create(extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **kw)
    assert kwargs.choices[0].message.content == answer
    r = client.responses.create(model="thinker", input=QUESTION, temperature=0, max_output_tokens=12,
                                reasoning={"effort": "none"})
    assert [o.type for o in r.output] == ["message"] and r.output[0].content[0].text == answer
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    msgs = anthropic.Anthropic(base_url=switch, api_key=KEY, max_retries=0, timeout=120)
    m = msgs.messages.create(model="thinker", max_tokens=12, messages=[{"role": "user", "content": QUESTION}],
                             thinking={"type": "disabled"}, extra_body={"temperature": 0})
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == answer
    # A template input cannot be set through the variables.
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(extra_body={"chat_template_kwargs": {"messages": []}}, **kw)
    assert e.value.body["param"] == "chat_template_kwargs", e.value.body


def test_the_python_package_passes_template_variables(tmp_path_factory):
    model = retemplated(tmp_path_factory, SWITCH)
    msgs = [{"role": "user", "content": QUESTION}]
    with axle.Engine(str(model), threads=2, context=512) as e:
        on = e.chat(msgs, temperature=0, max_tokens=12)
        assert on.reasoning.strip()
        off = e.chat(msgs, temperature=0, max_tokens=12, chat_template_kwargs={"enable_thinking": False})
        assert off.text.strip() and not off.reasoning
        with pytest.raises(axle.RequestError) as err:
            e.chat(msgs, max_tokens=4, chat_template_kwargs={"add_generation_prompt": False})
        assert err.value.field == "chat_template_kwargs"
        free = e.chat(msgs, temperature=0, max_tokens=30)
        bounded = e.chat(msgs, temperature=0, max_tokens=30, reasoning_budget=6)
        assert bounded.reasoning.strip() and free.reasoning.startswith(bounded.reasoning)
        assert len(bounded.reasoning) < len(free.reasoning)
        with pytest.raises(axle.RequestError) as err:
            e.chat(msgs, max_tokens=4, reasoning_budget=0)
        assert err.value.field == "thinking"


def test_a_reasoning_budget_closes_the_thinking(switch):
    """`budget_tokens` bounds the thinking: without a bound SmolLM2 never closes it (all 40 tokens
    are thinking); with a bound of 8 the closing marker is forced after 8 tokens of thinking and the
    answer follows. The bounded thinking is the free one's beginning, streamed or not, and a bound
    the thinking never reaches changes nothing."""
    msgs = anthropic.Anthropic(base_url=switch, api_key=KEY, max_retries=0, timeout=120)
    kw = dict(model="thinker", max_tokens=40, messages=[{"role": "user", "content": QUESTION}],
              extra_body={"temperature": 0})
    free = msgs.messages.create(thinking={"type": "enabled"}, **kw)
    assert [b.type for b in free.content] == ["thinking", "text"] and free.stop_reason == "max_tokens", free
    assert free.content[1].text == "", free
    far = msgs.messages.create(thinking={"type": "enabled", "budget_tokens": 1000}, **kw)
    assert far.content == free.content
    bounded = msgs.messages.create(thinking={"type": "enabled", "budget_tokens": 8}, **kw)
    assert [b.type for b in bounded.content] == ["thinking", "text"], bounded
    assert bounded.content[1].text.strip(), bounded
    thought = bounded.content[0].thinking
    assert thought.strip() and free.content[0].thinking.startswith(thought), (thought, free.content[0].thinking)
    assert len(free.content[0].thinking) > len(thought)
    req = urllib.request.Request(switch + "/tokenize", data=json.dumps({"text": thought, "add_special": False}).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert len(json.loads(r.read())["tokens"]) <= 8
    with msgs.messages.stream(thinking={"type": "enabled", "budget_tokens": 8}, **kw) as s:
        streamed = s.get_final_message()
    def blocks(m):
        return [(b.type, getattr(b, "thinking", None), getattr(b, "text", None)) for b in m.content]

    assert blocks(streamed) == blocks(bounded)
    with pytest.raises(anthropic.BadRequestError) as e:
        msgs.messages.create(thinking={"type": "enabled", "budget_tokens": 0}, **kw)
    assert "budget_tokens" in str(e.value), e.value
