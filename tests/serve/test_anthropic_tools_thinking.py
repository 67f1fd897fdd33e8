"""The Anthropic front-end's tool_use and thinking blocks, through the official SDK, on live servers
with parser plugins (so these tests live beside the integration suite, not in the front-end's own).

A random tiny Llama cannot be trusted to write tool-call syntax, so tool calls are forced with
``tool_choice`` ``any`` and ``tool`` (constrained decoding); thinking comes from the ``deepseek_r1``
reasoning parser, which takes a completion without an end marker as reasoning.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import jsonschema
import pytest

from llmp.testing import LiveServer, save_tiny_llama, serving

WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
    },
}
CLOCK = {
    "name": "get_time",
    "input_schema": {
        "type": "object",
        "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
        "required": ["zone"],
    },
}
TOOLS = [WEATHER, CLOCK]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
MODEL = "tiny"  # --served-model-name


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path, max_position_embeddings=2048)  # room for the Messages API's least thinking budget
    return path


def _client(server: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tools_server(model_dir: Path) -> Iterator[LiveServer]:
    with serving(
        model_dir,
        "--dtype",
        "float32",
        "--frontend",
        "anthropic",
        "--frontend",
        "openai",
        "--served-model-name",
        MODEL,
        "--tool-call-parser",
        "pythonic",
    ) as live:
        yield live


@pytest.fixture(scope="module")
def thinking_server(model_dir: Path) -> Iterator[LiveServer]:
    with serving(
        model_dir,
        "--dtype",
        "float32",
        "--frontend",
        "anthropic",
        "--frontend",
        "openai",
        "--served-model-name",
        MODEL,
        "--reasoning-parser",
        "deepseek_r1",
    ) as live:
        yield live


def blocks_of(events: list) -> list[dict]:
    """Content blocks rebuilt from stream events, checking each block starts, gets deltas and stops in turn."""
    blocks: list[dict] = []
    open_index = None
    for event in events:
        if event.type == "content_block_start":
            assert open_index is None and event.index == len(blocks), "blocks open one at a time, in order"
            blocks.append(
                {
                    "type": event.content_block.type,
                    "text": "",
                    "json": "",
                    "thinking": "",
                    "signed": False,
                    "name": getattr(event.content_block, "name", None),
                    "id": getattr(event.content_block, "id", None),
                }
            )
            open_index = event.index
        elif event.type == "content_block_delta":
            assert event.index == open_index
            block, delta = blocks[event.index], event.delta
            if delta.type == "text_delta":
                block["text"] += delta.text
            elif delta.type == "input_json_delta":
                block["json"] += delta.partial_json
            elif delta.type == "thinking_delta":
                assert not block["signed"]
                block["thinking"] += delta.thinking
            elif delta.type == "signature_delta":
                block["signed"] = True
        elif event.type == "content_block_stop":
            assert event.index == open_index
            open_index = None
    assert open_index is None
    return blocks


@pytest.mark.parametrize("question", ["What is the weather in Paris?", "What time is it in Tokyo?", "Hello"])
def test_tool_choice_any_returns_tool_use_blocks_that_fit_the_schemas(tools_server, question):
    # greedy, so each question gives one fixed answer (the Anthropic API has no seed)
    with _client(tools_server) as client:
        message = client.messages.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            max_tokens=400,
            tools=TOOLS,
            tool_choice={"type": "any"},
            extra_body={"temperature": 0},
        )
    uses = [b for b in message.content if b.type == "tool_use"]
    assert uses and message.stop_reason == "tool_use", message
    schemas = {t["name"]: t["input_schema"] for t in TOOLS}
    for block in uses:
        assert block.id.startswith("toolu_") and block.name in schemas
        jsonschema.validate(block.input, schemas[block.name])


def test_tool_choice_tool_and_disable_parallel_give_one_call(tools_server):
    with _client(tools_server) as client:
        named = client.messages.create(
            model=MODEL,
            messages=ASK,
            max_tokens=200,
            tools=TOOLS,
            tool_choice={"type": "tool", "name": "get_time"},
            extra_body={"temperature": 0},
        )
        single = client.messages.create(
            model=MODEL,
            messages=ASK,
            max_tokens=200,
            tools=TOOLS,
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            extra_body={"temperature": 0},
        )
    assert [b.name for b in named.content if b.type == "tool_use"] == ["get_time"]
    assert named.stop_reason == "tool_use"
    jsonschema.validate(named.content[-1].input, CLOCK["input_schema"])
    assert len([b for b in single.content if b.type == "tool_use"]) == 1


def test_streamed_tool_use_adds_up_to_the_whole_message(tools_server):
    body = {
        "model": MODEL,
        "messages": ASK,
        "max_tokens": 300,
        "tools": TOOLS,
        "tool_choice": {"type": "any"},
        "extra_body": {"temperature": 0},
    }
    with _client(tools_server) as client:
        whole = client.messages.create(**body)
        events = list(client.messages.create(**body, stream=True))
        with client.messages.stream(**body) as stream:
            assembled = stream.get_final_message()
    blocks = blocks_of(events)
    assert [b["type"] for b in blocks] == [b.type for b in whole.content]
    for block, expected in zip(blocks, whole.content, strict=True):
        if expected.type == "tool_use":
            assert block["name"] == expected.name and block["id"].startswith("toolu_")
            assert json.loads(block["json"]) == expected.input
    assert events[-2].delta.stop_reason == "tool_use" == whole.stop_reason
    assert [(b.type, getattr(b, "name", None), getattr(b, "input", None)) for b in assembled.content] == [
        (b.type, getattr(b, "name", None), getattr(b, "input", None)) for b in whole.content
    ]


def test_tool_use_round_trips_as_history(tools_server):
    with _client(tools_server) as client:
        first = client.messages.create(
            model=MODEL,
            messages=ASK,
            max_tokens=120,
            tools=TOOLS,
            tool_choice={"type": "tool", "name": "get_weather"},
            extra_body={"temperature": 0},
        )
        use = first.content[-1]
        history = ASK + [
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C, sunny"}]},
        ]
        counted = client.messages.count_tokens(model=MODEL, messages=history, tools=TOOLS)
        reply = client.messages.create(
            model=MODEL,
            messages=history,
            max_tokens=4,
            tools=TOOLS,
            tool_choice={"type": "none"},
            extra_body={"temperature": 0},
        )
    assert counted.input_tokens > first.usage.input_tokens
    assert reply.usage.input_tokens == counted.input_tokens
    assert reply.stop_reason in ("max_tokens", "end_turn") and reply.content[0].type == "text"


def test_thinking_block_holds_what_the_openai_front_end_calls_reasoning(thinking_server):
    model = MODEL
    with httpx.Client(base_url=thinking_server.url, timeout=60) as http:
        chat = http.post(
            "/v1/chat/completions", json={"model": model, "messages": ASK, "max_tokens": 12, "temperature": 0}
        ).json()
    reasoning = chat["choices"][0]["message"]["reasoning"]
    assert reasoning  # deepseek_r1: no end marker, so all of it is reasoning
    with _client(thinking_server) as client:
        whole = client.messages.create(model=model, messages=ASK, max_tokens=12, extra_body={"temperature": 0})
        events = list(
            client.messages.create(model=model, messages=ASK, max_tokens=12, extra_body={"temperature": 0}, stream=True)
        )
    assert [b.type for b in whole.content] == ["thinking"]
    assert whole.content[0].thinking == reasoning and whole.stop_reason == "max_tokens"
    blocks = blocks_of(events)
    assert [b["type"] for b in blocks] == ["thinking"]
    assert blocks[0]["thinking"] == reasoning and blocks[0]["signed"], "a signature_delta comes before the stop"


def test_thinking_budget_tokens_cuts_the_thinking(thinking_server, model_dir):
    """deepseek_r1 takes the whole greedy completion as thinking; with budget_tokens the engine ends it
    after that many tokens with </think>, and the rest is a text block."""
    long = [{"role": "user", "content": "What time is it in Tokyo?"}]  # its greedy completion never ends with EOS
    body = {"model": MODEL, "messages": long, "max_tokens": 1060, "extra_body": {"temperature": 0}}
    budget = {"type": "enabled", "budget_tokens": 1024}
    with _client(thinking_server) as client:
        free = client.messages.create(**body)
        capped = client.messages.create(**body, thinking=budget)
        events = list(client.messages.create(**body, thinking=budget, stream=True))
    assert [b.type for b in free.content] == ["thinking"] and free.stop_reason == "max_tokens"
    assert [b.type for b in capped.content] == ["thinking", "text"] and capped.stop_reason == "max_tokens"
    thinking, text = capped.content[0].thinking, capped.content[1].text
    assert free.content[0].thinking.startswith(thinking) and text
    assert capped.usage.output_tokens == 1060
    blocks = blocks_of(events)
    assert [(b["type"], b["thinking"] or b["text"]) for b in blocks] == [("thinking", thinking), ("text", text)]
    # the cut is at token 1024: the OpenAI route's token ids of the same greedy request with that budget
    with httpx.Client(base_url=thinking_server.url, timeout=120) as http:
        chat = http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": long,
                "max_tokens": 1060,
                "temperature": 0,
                "thinking_token_budget": 1024,
                "return_token_ids": True,
            },
        ).json()["choices"][0]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    end = tokenizer.encode("</think>", add_special_tokens=False)
    assert chat["token_ids"][1024 : 1024 + len(end)] == end
    assert chat["message"]["reasoning"] == thinking and chat["message"]["content"] == text


@pytest.mark.parametrize(
    ("thinking", "max_tokens", "contains"),
    [
        ({"type": "enabled", "budget_tokens": 1000}, 2000, "greater than or equal to 1024"),
        ({"type": "enabled", "budget_tokens": 1024}, 1024, "`max_tokens` must be greater than"),
        ({"type": "enabled"}, 2000, "budget_tokens: Field required"),
        ({"type": "disabled", "budget_tokens": 1024}, 2000, "only for thinking of type enabled"),
        ({"type": "sometimes"}, 2000, "thinking"),
        ({"type": "enabled", "budget_tokens": "lots"}, 2000, "budget_tokens"),
    ],
)
def test_bad_thinking_is_invalid_request_error(thinking_server, thinking, max_tokens, contains):
    with httpx.Client(base_url=thinking_server.url, timeout=60) as http:
        response = http.post(
            "/v1/messages", json={"model": MODEL, "messages": ASK, "max_tokens": max_tokens, "thinking": thinking}
        )
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
    assert contains in error["error"]["message"], error


def test_thinking_without_a_reasoning_parser_is_answered_and_logged(tools_server):
    with _client(tools_server) as client:
        reply = client.messages.create(
            model=MODEL,
            messages=ASK,
            max_tokens=1100,
            thinking={"type": "enabled", "budget_tokens": 1024},
            extra_body={"service_tier_of_tomorrow": "x"},
        )
        disabled = client.messages.create(
            model=MODEL, messages=ASK, max_tokens=8, thinking={"type": "disabled", "display_of_tomorrow": 1}
        )
    assert reply.content[0].type == "text" and disabled.content[0].type == "text"
    log = tools_server.log()
    assert "thinking.budget_tokens=1024 not applied: the server has no --reasoning-parser" in log
    assert "The following fields were present in the request but ignored: service_tier_of_tomorrow" in log
    assert "The following fields were present in the request but ignored: thinking.display_of_tomorrow" in log


# renders one marker per thinking mode, so the prompt's length says what the template was given
THINKING_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if enable_thinking is defined %}{% if enable_thinking %}on on on on{% else %}off{% endif %}{% endif %}"
)


def test_thinking_sets_the_templates_enable_thinking(model_dir):
    with serving(
        model_dir,
        "--dtype",
        "float32",
        "--frontend",
        "anthropic",
        "--served-model-name",
        MODEL,
        "--chat-template",
        THINKING_TEMPLATE,
    ) as live:
        with _client(live) as client:

            def count(**fields) -> int:
                return client.messages.count_tokens(model=MODEL, messages=ASK, **fields).input_tokens

            absent, adaptive = count(), count(thinking={"type": "adaptive"})
            enabled = count(thinking={"type": "enabled", "budget_tokens": 1024})
            disabled = count(thinking={"type": "disabled"})
            overridden = count(
                thinking={"type": "enabled", "budget_tokens": 1024},
                extra_body={"chat_template_kwargs": {"enable_thinking": False}},
            )
    assert absent == adaptive < disabled == overridden < enabled
