"""Tool calling, reasoning and structured outputs on a live ``llmp serve``, through the ``openai`` SDK.

A random-weight model cannot be trusted to write tool-call syntax or reasoning markers, so every
output checked here is made deterministic by the server's own machinery:

* ``tool_choice`` required or named: constrained decoding writes the calls (valid by construction);
* ``tool_choice`` auto: ``structured_outputs.choice`` forces the completion text, and the tool
  parser (pythonic, qwen3_xml) must extract the call from it;
* reasoning (deepseek_r1): ``<think>``/``</think>`` are added tokens of the tokenizer, and a
  ``logit_bias`` of +100 on ``</think>`` and two letters makes each completion a seeded random mix
  of them; the server's split must equal the parser's split of the raw text (which a server
  without a reasoning parser returns for the same seed).

Three servers on one tiny model, started together (seconds each):

* ``tools``: ``--tool-call-parser pythonic --enable-auto-tool-choice`` and a chat template that
  renders the tools, the assistant's tool calls and the tool results;
* ``think``: ``--reasoning-parser deepseek_r1 --tool-call-parser qwen3_xml --enable-auto-tool-choice``;
* ``plain``: no parser (raw text, structured outputs, the errors of a server without parsers).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from llmp.testing import LiveServer, assert_openai_error, run_llmp, save_tiny_llama, serving

THINK_START, THINK_END = "<think>", "</think>"
MESSAGES = [{"role": "user", "content": "The quick brown fox"}]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast of a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "days": {"type": "integer", "minimum": 0, "maximum": 99},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string", "enum": ["a", "b"]}},
            "required": ["q"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, LOOKUP]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
NAMED = {"type": "function", "function": {"name": "get_weather"}}

# The call each parser must find in its own syntax.
CALL_TEXT = {
    "pythonic": "[get_weather(city='Paris', days=2)]",
    "qwen3_xml": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
}
CALL_ARGUMENTS = {"city": "Paris", "days": 2}
# Text that starts like a call in each syntax ("[" + a name, "<") but is none.
NOT_A_CALL = "[note] <b>Sunny</b> in Paris."

# A chat template that shows what reaches it: the tools' names, the assistant's tool calls (with their
# arguments as the template sees them) and the tool results with their call ids.
TOOLS_TEMPLATE = (
    "{%- if tools %}<s>tools: {% for t in tools %}{{ t.function.name }};{% endfor %}</s>{% endif -%}"
    "{%- for m in messages %}<s>{{ m.role }}: "
    "{% if m.tool_calls %}{% for c in m.tool_calls %}[{{ c.id }}] {{ c.function.name }}"
    "{{ c.function.arguments | tojson }};{% endfor %}{% endif %}"
    "{% if m.role == 'tool' %}[{{ m.tool_call_id }}] {% endif %}{{ m.content }}</s>{% endfor -%}"
    "{%- if add_generation_prompt %}<s>assistant: {% endif -%}"
)

SERVER_ARGS = {
    "tools": ("--tool-call-parser", "pythonic", "--enable-auto-tool-choice", "--chat-template", TOOLS_TEMPLATE),
    "think": ("--reasoning-parser", "deepseek_r1", "--tool-call-parser", "qwen3_xml", "--enable-auto-tool-choice"),
    "plain": (),
}


# -- the model and the servers ---------------------------------------------------------------------


@dataclass
class Model:
    path: Path
    tokenizer: Any

    @property
    def name(self) -> str:
        return str(self.path)

    def id(self, token: str) -> int:
        ids = self.tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1, (token, ids)
        return ids[0]

    def control_ids(self) -> list[int]:
        """The byte tokens of the control characters JSON forbids raw in a string, less whitespace."""
        ids = []
        for char in map(chr, range(32)):
            if char not in "\t\n\r":
                ids += self.tokenizer.encode(char, add_special_tokens=False)
        assert len(ids) == 29, ids
        return ids

    def bias(self, *tokens: str) -> dict[str, int]:
        """A logit_bias of +100 on each of ``tokens`` (one token each)."""
        return {str(self.id(t)): 100 for t in tokens}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Model:
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("tiny-llama-think")
    save_tiny_llama(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens([THINK_START, THINK_END])  # ids 400 and 401: within the model's 512
    tokenizer.save_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert tokenizer.encode(THINK_END, add_special_tokens=False) == [401]
    return Model(path, tokenizer)


@pytest.fixture(scope="module")
def servers(model: Model) -> Iterator[dict[str, LiveServer]]:
    """The three servers, started concurrently (each start is mostly imports and waiting)."""
    contexts = {name: serving(model.path, *args) for name, args in SERVER_ARGS.items()}
    with ExitStack() as stack:
        with ThreadPoolExecutor(len(contexts)) as pool:
            started = {name: pool.submit(cm.__enter__) for name, cm in contexts.items()}
        live, failure = {}, None
        for name, future in started.items():
            try:
                live[name] = future.result()
            except BaseException as exc:  # noqa: BLE001  (the others are stopped, then this is raised)
                failure = failure or exc
                continue
            stack.push(contexts[name].__exit__)
        if failure is not None:
            raise failure
        yield live
        for name, server in live.items():
            assert server.process.poll() is None, f"the {name} server died during the tests:\n{server.log()}"


def _client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tools_client(servers: dict[str, LiveServer]) -> Iterator[openai.OpenAI]:
    with _client(servers["tools"]) as client:
        yield client


@pytest.fixture(scope="module")
def think_client(servers: dict[str, LiveServer]) -> Iterator[openai.OpenAI]:
    with _client(servers["think"]) as client:
        yield client


@pytest.fixture(scope="module")
def plain_client(servers: dict[str, LiveServer]) -> Iterator[openai.OpenAI]:
    with _client(servers["plain"]) as client:
        yield client


@pytest.fixture(scope="module")
def tools_http(servers: dict[str, LiveServer]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=servers["tools"].url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def reasoning_parser(model: Model) -> Any:
    from llmp_parsers_reasoning.deepseek_r1 import DeepSeekR1ReasoningParser

    return DeepSeekR1ReasoningParser(model.tokenizer)


# -- helpers ---------------------------------------------------------------------------------------


def chat(client: openai.OpenAI, model: Model, **kwargs: Any) -> Any:
    kwargs.setdefault("messages", MESSAGES)
    kwargs.setdefault("temperature", 1.0)
    return client.chat.completions.create(model=model.name, **kwargs)


def extra(obj: Any, name: str) -> Any:
    """A vendor field of an SDK object (``reasoning``, ``token_ids`` ...); None when absent."""
    return (obj.model_extra or {}).get(name)


def whole_calls(message: Any) -> list[tuple[str, str]]:
    return [(call.function.name, call.function.arguments) for call in message.tool_calls or []]


@dataclass
class Streamed:
    """A streamed choice put together: content, reasoning, calls and the finish reasons sent."""

    content: str = ""
    reasoning: str | None = None
    calls: list[dict[str, str]] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    usage: Any = None  # the last chunk's, with stream_options include_usage

    @property
    def call_pairs(self) -> list[tuple[str, str]]:
        return [(call["name"], call["arguments"]) for call in self.calls]


def collect(stream: Any) -> Streamed:
    """Concatenate the deltas of a one-choice stream, checking the shape of each tool-call piece."""
    out = Streamed()
    for chunk in stream:
        out.usage = chunk.usage or out.usage
        for choice in chunk.choices:
            assert choice.index == 0
            delta = choice.delta
            out.content += delta.content or ""
            reasoning = extra(delta, "reasoning")
            assert reasoning == extra(delta, "reasoning_content"), delta
            if reasoning is not None:
                out.reasoning = (out.reasoning or "") + reasoning
            for piece in delta.tool_calls or []:
                if piece.index == len(out.calls):  # a new call: its first piece names it
                    assert piece.id and piece.id.startswith("chatcmpl-tool-"), piece
                    assert piece.type == "function" and piece.function.name, piece
                    out.calls.append(
                        {"id": piece.id, "name": piece.function.name, "arguments": piece.function.arguments or ""}
                    )
                else:
                    assert 0 <= piece.index < len(out.calls), f"a piece of call {piece.index} before its first piece"
                    assert piece.id is None and (piece.function.name or None) is None, piece
                    out.calls[piece.index]["arguments"] += piece.function.arguments or ""
            if choice.finish_reason is not None:
                out.finish_reasons.append(choice.finish_reason)
    assert len(out.finish_reasons) == 1, f"exactly one chunk must carry a finish_reason: {out.finish_reasons}"
    return out


def check_call_ids(calls: Any) -> None:
    ids = [call.id if hasattr(call, "id") else call["id"] for call in calls]
    assert all(isinstance(i, str) and i.startswith("chatcmpl-tool-") for i in ids), ids
    assert len(set(ids)) == len(ids), f"call ids must be unique: {ids}"


def check_arguments(name: str, arguments: str) -> dict:
    assert name in SCHEMAS, f"{name!r} is not one of the tools"
    value = json.loads(arguments)
    jsonschema.validate(value, SCHEMAS[name])
    return value


# -- tool_choice required and named (constrained decoding) ------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_required_calls_fit_the_tools(tools_client, model, seed):
    request = {"tools": TOOLS, "tool_choice": "required", "max_tokens": 120, "seed": seed}
    choice = chat(tools_client, model, **request).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert not choice.message.content
    calls = whole_calls(choice.message)
    assert calls, choice
    for name, arguments in calls:
        check_arguments(name, arguments)
    check_call_ids(choice.message.tool_calls)
    assert all(call.type == "function" for call in choice.message.tool_calls)

    streamed = collect(chat(tools_client, model, stream=True, **request))
    assert streamed.call_pairs == calls
    assert streamed.finish_reasons == ["tool_calls"]
    assert streamed.content == "" and streamed.reasoning is None
    check_call_ids(streamed.calls)


def test_parallel_tool_calls_false_allows_one_call(tools_client, model):
    # a bias on "," makes the model continue the array of calls: several calls unless the schema forbids it
    request = {
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": 100,
        "seed": 0,
        "logit_bias": {str(model.id(",")): 5},
    }
    parallel = chat(tools_client, model, **request).choices[0]
    assert len(parallel.message.tool_calls) >= 2, parallel  # the bias works: the test below can fail
    single = chat(tools_client, model, parallel_tool_calls=False, **request).choices[0]
    assert single.finish_reason == "tool_calls", single
    assert len(single.message.tool_calls) == 1, single
    check_arguments(*whole_calls(single.message)[0])


# a pydantic model's schema: its submodel under $defs, referred to from #/$defs (the root's)
NESTED_TOOL = {
    "type": "function",
    "function": {
        "name": "save_place",
        "parameters": {
            "$defs": {
                "Place": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 12}},
                    "required": ["city"],
                    "additionalProperties": False,
                }
            },
            "type": "object",
            "properties": {"place": {"$ref": "#/$defs/Place"}},
            "required": ["place"],
            "additionalProperties": False,
        },
    },
}


def test_required_calls_of_a_tool_with_defs(tools_client, model):
    """tool_choice required nests each tool's parameters in one schema: their $defs move to its root."""
    choice = chat(tools_client, model, tools=[NESTED_TOOL], tool_choice="required", max_tokens=80, seed=0).choices[0]
    [(name, arguments)] = whole_calls(choice.message)[:1]
    assert name == "save_place" and set(json.loads(arguments)["place"]) == {"city"}, choice


@pytest.mark.parametrize("seed", [0, 1])
def test_named_tool_choice_calls_that_function(tools_client, model, seed):
    request = {"tools": TOOLS, "tool_choice": NAMED, "max_tokens": 80, "seed": seed}
    choice = chat(tools_client, model, **request).choices[0]
    assert choice.finish_reason == "stop", choice  # OpenAI's finish reason for a named tool choice
    assert not choice.message.content
    calls = whole_calls(choice.message)
    assert [name for name, _ in calls] == ["get_weather"], calls
    check_arguments(*calls[0])
    check_call_ids(choice.message.tool_calls)

    streamed = collect(chat(tools_client, model, stream=True, **request))
    assert streamed.call_pairs == calls
    assert streamed.finish_reasons == ["stop"]
    assert streamed.content == ""


@pytest.mark.parametrize("tool_choice", ["required", NAMED], ids=["required", "named"])
def test_one_token_budget_ends_with_length(tools_client, model, tool_choice):
    """One token is not a call: the response says "length", the same streamed and not."""
    request = {"tools": TOOLS, "tool_choice": tool_choice, "max_completion_tokens": 1, "seed": 0}
    response = chat(tools_client, model, **request)
    choice = response.choices[0]
    assert choice.finish_reason == "length", choice
    assert response.usage.completion_tokens == 1
    calls = whole_calls(choice.message)
    if tool_choice == "required":  # "[" holds no call yet: the generated text is the content, never dropped
        assert calls == [] and choice.message.content == "[", choice
    else:  # the function is known: its arguments are the one token, the start of the object
        assert len(calls) == 1 and calls[0][0] == "get_weather", calls
        assert calls[0][1].startswith("{") and len(calls[0][1]) <= 3, calls
        check_call_ids(choice.message.tool_calls)
    streamed = collect(chat(tools_client, model, stream=True, **request))
    assert streamed.finish_reasons == ["length"]
    assert streamed.call_pairs == calls
    assert streamed.content == (choice.message.content or "")


def test_bounded_strings_hold_no_control_characters(tools_client, plain_client, model):
    """A length-bounded string stays JSON even when the model wants raw control characters in it.

    xgrammar 0.2 lets U+0000-U+001F through in a string with maxLength (mlc-ai/xgrammar#800): with a
    +100 bias on them they would be sampled, and ``json.loads`` would fail.
    """
    bias = {str(i): 100 for i in model.control_ids()}
    schema = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 6}}, "required": ["text"]}
    echo = {"type": "function", "function": {"name": "echo", "parameters": schema}}
    call = chat(
        tools_client,
        model,
        tools=[echo],
        tool_choice={"type": "function", "function": {"name": "echo"}},
        max_tokens=60,
        seed=0,
        logit_bias=bias,
    ).choices[0]
    answer = chat(
        plain_client,
        model,
        max_tokens=120,
        seed=0,
        logit_bias=bias,
        response_format={"type": "json_schema", "json_schema": {"name": "echo", "schema": schema}},
    ).choices[0]
    for finish_reason, text in (
        (call.finish_reason, call.message.tool_calls[0].function.arguments),
        (answer.finish_reason, answer.message.content),
    ):
        assert finish_reason == "stop", text
        jsonschema.validate(json.loads(text), schema)  # strict: a raw control character is invalid JSON


# -- tool_choice auto: the tool parsers ------------------------------------------------------------


def think_first(model: Model) -> dict[str, int]:
    """A logit_bias that makes a deepseek_r1 completion open with an "F" or two (reasoning), then "</think>"
    (after which a constraint takes over)."""
    return {**model.bias("F"), str(model.id(THINK_END)): 96}


@pytest.fixture(params=["pythonic", "qwen3_xml"])
def auto(request, tools_client, think_client, model) -> tuple[str, openai.OpenAI, dict[str, Any]]:
    """A parser, the client of a server running it, and what its requests add: on the deepseek_r1
    server the answer (and the constraint forcing it) starts after some reasoning and ``</think>``."""
    if request.param == "pythonic":
        return request.param, tools_client, {}
    return request.param, think_client, {"logit_bias": think_first(model)}


def _reasoning(parser: str, reasoning: str | None) -> str | None:
    """The reasoning of a message or a stream: none without a reasoning parser, else some "F"s."""
    if parser == "pythonic":
        assert reasoning is None
        return None
    # a stream sends no reasoning delta for an empty reasoning; a whole message says ""
    assert reasoning and set(reasoning) == {"F"}, reasoning
    return reasoning


def test_auto_tool_call_is_parsed(auto, model):
    parser, client, extra_kwargs = auto
    request = dict(
        tools=[WEATHER],
        tool_choice="auto",
        max_tokens=150,
        seed=3,
        **extra_kwargs,
        extra_body={"structured_outputs": {"choice": [CALL_TEXT[parser]]}},
    )
    choice = chat(client, model, **request).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None, choice
    calls = whole_calls(choice.message)
    assert [name for name, _ in calls] == ["get_weather"], calls
    assert json.loads(calls[0][1]) == CALL_ARGUMENTS
    check_call_ids(choice.message.tool_calls)
    reasoning = _reasoning(parser, extra(choice.message, "reasoning"))

    streamed = collect(chat(client, model, stream=True, **request))
    assert streamed.call_pairs == calls
    assert streamed.finish_reasons == ["tool_calls"]
    assert streamed.content == ""
    assert _reasoning(parser, streamed.reasoning) == reasoning


def test_parallel_tool_calls_false_keeps_the_first_auto_call(tools_client, model):
    """tool_choice auto: the model may write several calls; parallel_tool_calls false returns the first
    (vLLM's maybe_filter_parallel_tool_calls), whole and streamed."""
    two = "[get_weather(city='Paris', days=2), get_weather(city='Rome', days=1)]"
    request = dict(tools=[WEATHER], max_tokens=150, extra_body={"structured_outputs": {"choice": [two]}})
    assert len(chat(tools_client, model, **request).choices[0].message.tool_calls) == 2  # the test can fail
    single = chat(tools_client, model, parallel_tool_calls=False, **request).choices[0]
    assert single.finish_reason == "tool_calls"
    assert [json.loads(arguments) for _, arguments in whole_calls(single.message)] == [CALL_ARGUMENTS]
    streamed = collect(chat(tools_client, model, stream=True, parallel_tool_calls=False, **request))
    assert streamed.call_pairs == whole_calls(single.message) and streamed.finish_reasons == ["tool_calls"]


def test_a_stop_string_inside_a_call_is_no_tool_calls_finish(tools_client, model):
    """A stop string cut the call's arguments: finish_reason stays "stop" (a client would json.loads
    arguments that are not JSON), whole and streamed."""
    request = dict(
        tools=[WEATHER],
        max_tokens=150,
        stop=["aris"],
        extra_body={"structured_outputs": {"choice": [CALL_TEXT["pythonic"]]}},
    )
    choice = chat(tools_client, model, **request).choices[0]
    assert choice.finish_reason == "stop" and extra(choice, "stop_reason") == "aris", choice
    assert choice.message.tool_calls, choice  # the parser made a call of the cut text: the test can fail
    streamed = collect(chat(tools_client, model, stream=True, **request))
    assert streamed.finish_reasons == ["stop"]


def test_tools_without_tool_choice_are_auto(tools_client, model):
    """With tools and no tool_choice, a server with --enable-auto-tool-choice parses calls."""
    choice = chat(
        tools_client,
        model,
        tools=[WEATHER],
        max_tokens=80,
        seed=3,
        extra_body={"structured_outputs": {"choice": [CALL_TEXT["pythonic"]]}},
    ).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert [(name, json.loads(arguments)) for name, arguments in whole_calls(choice.message)] == [
        ("get_weather", CALL_ARGUMENTS)
    ]


def test_auto_plain_text_stays_content(auto, model):
    _parser, client, extra_kwargs = auto
    request = dict(
        tools=[WEATHER],
        tool_choice="auto",
        max_tokens=80,
        seed=3,
        **extra_kwargs,
        extra_body={"structured_outputs": {"choice": [NOT_A_CALL]}},
    )
    choice = chat(client, model, **request).choices[0]
    assert choice.finish_reason == "stop", choice
    assert choice.message.content == NOT_A_CALL
    assert not choice.message.tool_calls
    streamed = collect(chat(client, model, stream=True, **request))
    assert (streamed.content, streamed.calls, streamed.finish_reasons) == (NOT_A_CALL, [], ["stop"])


def test_tool_choice_none_leaves_call_text_alone(tools_client, model):
    text = CALL_TEXT["pythonic"]
    choice = chat(
        tools_client,
        model,
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=80,
        seed=3,
        extra_body={"structured_outputs": {"choice": [text]}},
    ).choices[0]
    assert (choice.finish_reason, choice.message.content, choice.message.tool_calls or []) == ("stop", text, [])


# -- tool results round-trip -----------------------------------------------------------------------

CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps(CALL_ARGUMENTS)},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]


def _prompt(http: httpx.Client, **body: Any) -> tuple[int, str]:
    response = http.post("/tokenize", json=body)
    assert response.status_code == 200, response.text
    tokens = response.json()["tokens"]
    text = http.post("/detokenize", json={"tokens": tokens}).json()["prompt"]
    return len(tokens), text


def test_tools_and_tool_results_reach_the_template(tools_client, tools_http, model):
    _, bare = _prompt(tools_http, messages=CONVERSATION[:1])
    _, with_tools = _prompt(tools_http, messages=CONVERSATION[:1], tools=TOOLS)
    assert "tools:" not in bare
    assert "tools: get_weather;lookup;" in with_tools and with_tools.endswith(bare)

    first_count, _ = _prompt(tools_http, messages=CONVERSATION[:1])
    count, prompt = _prompt(tools_http, messages=CONVERSATION, tools=TOOLS)
    assert count > first_count
    # the arguments reach the template as a mapping (as chat templates expect), not as the JSON string
    assert 'get_weather{"city": "Paris", "days": 2};' in prompt, prompt
    assert "<s>tool: [call_1] sunny, 21 C</s>" in prompt, prompt
    assert prompt.endswith("<s>assistant: ")

    response = chat(tools_client, model, messages=CONVERSATION, tools=TOOLS, max_tokens=4, seed=0)
    assert response.choices[0].message.role == "assistant"
    assert response.usage.prompt_tokens == count


def test_tool_call_arguments_must_be_json_text(tools_client, model):
    broken = [
        CONVERSATION[0],
        {
            **CONVERSATION[1],
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{city: Paris"}}
            ],
        },
        CONVERSATION[2],
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        chat(tools_client, model, messages=broken, tools=TOOLS, max_tokens=4)
    assert_openai_error(caught.value.response, 400, param="messages", contains="arguments")


# -- errors ----------------------------------------------------------------------------------------

BOGUS_TOOL = {"type": "function", "function": {"name": "bogus", "parameters": {"type": "bogus"}}}
UNIQUE = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}}
ERRORS = [
    # server, request fields, param, text the message holds
    ("plain", {"tools": []}, "tools", "at least one tool"),
    ("tools", {"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools", "name"),
    ("plain", {"tool_choice": "required"}, "tool_choice", "needs tools"),
    ("tools", {"tool_choice": "auto"}, "tool_choice", "needs tools"),
    (
        "tools",
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
        "not among the tools",
    ),
    ("tools", {"tools": TOOLS, "tool_choice": {}}, "tool_choice", "not among the tools"),
    ("tools", {"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "tool_choice must be"),
    ("plain", {"tools": TOOLS, "tool_choice": "auto"}, "tool_choice", "--enable-auto-tool-choice"),
    ("plain", {"tools": TOOLS, "tool_choice": "required"}, "tool_choice", "--tool-call-parser"),
    ("plain", {"tools": TOOLS, "tool_choice": NAMED}, "tool_choice", "--tool-call-parser"),
    (
        "tools",
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
        "tool_choice",
        "cannot be combined",
    ),
    (
        "tools",
        {"tools": TOOLS, "tool_choice": NAMED, "extra_body": {"structured_outputs": {"regex": "a+"}}},
        "tool_choice",
        "cannot be combined",
    ),
    (
        "plain",
        {"response_format": {"type": "json_object"}, "extra_body": {"structured_outputs": {"regex": "a+"}}},
        "structured_outputs",
        "not both",
    ),
    ("plain", {"extra_body": {"structured_outputs": {"regexp": "a+"}}}, "structured_outputs", "regexp"),
    (
        "tools",
        {"tools": [*TOOLS, BOGUS_TOOL], "tool_choice": "required"},
        f"tools[{len(TOOLS)}].function.parameters",
        "not a valid JSON schema at type",
    ),
    (
        "plain",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "u", "schema": UNIQUE}}},
        "response_format",
        "'uniqueItems' at properties/tags, which structured outputs cannot enforce",
    ),
    ("plain", {"response_format": {"type": "json_schema", "json_schema": "x"}}, "response_format", "must be an object"),
    (
        "tools",
        {
            "tools": [
                NESTED_TOOL,
                {
                    **NESTED_TOOL,
                    "function": {
                        **NESTED_TOOL["function"],
                        "name": "b",
                        "parameters": {
                            "$defs": {"Place": {"type": "integer"}},
                            "properties": {"p": {"$ref": "#/$defs/Place"}},
                        },
                    },
                },
            ],
            "tool_choice": "required",
        },
        "tools",
        "tools define $defs/Place differently",
    ),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    ("server", "fields", "param", "contains"), ERRORS, ids=[f"{e[0]}-{e[2]}-{i}" for i, e in enumerate(ERRORS)]
)
def test_bad_tool_requests_are_400(servers, model, server, fields, param, contains, stream):
    with _client(servers[server]) as client, pytest.raises(openai.BadRequestError) as caught:
        chat(client, model, max_tokens=4, stream=stream, **fields)
    assert caught.value.status_code == 400
    assert_openai_error(caught.value.response, 400, param=param, contains=contains)


@pytest.mark.parametrize(
    ("args", "contains"),
    [
        (("--enable-auto-tool-choice",), "--enable-auto-tool-choice needs --tool-call-parser"),
        (("--tool-call-parser", "nope", "--enable-auto-tool-choice"), "pythonic"),  # the valid names are listed
        (("--reasoning-parser", "nope"), "deepseek_r1"),
    ],
    ids=["auto-without-parser", "unknown-tool-parser", "unknown-reasoning-parser"],
)
def test_parser_options_are_checked_before_the_engine_starts(model, args, contains):
    started = time.monotonic()
    result = run_llmp("serve", model.name, "--port", "0", *args, check=False, timeout=60)
    assert result.returncode != 0, result.stdout + result.stderr
    assert contains in result.stderr, result.stderr
    assert "nope" in result.stderr or "nope" not in args
    assert "ready" not in result.stdout + result.stderr
    # the check comes before the model is even looked at: a model that does not exist gives the same error
    missing = run_llmp("serve", str(model.path / "missing"), *args, check=False, timeout=60)
    assert missing.returncode == result.returncode and contains in missing.stderr, missing.stderr
    assert time.monotonic() - started < 45


# -- reasoning (deepseek_r1) -----------------------------------------------------------------------

REASONING_SEEDS = [0, 1, 5]


def _mix(model: Model, **kwargs: Any) -> dict[str, Any]:
    """A request whose completion is a seeded random mix of "F", "G" and "</think>"."""
    return dict(max_tokens=12, logit_bias=model.bias(THINK_END, "F", "G"), **kwargs)


@pytest.mark.parametrize("seed", REASONING_SEEDS)
def test_reasoning_is_split_as_the_parser_splits(think_client, plain_client, model, reasoning_parser, seed):
    raw = chat(plain_client, model, seed=seed, **_mix(model)).choices[0].message.content
    assert set(raw.replace(THINK_END, "")) <= {"F", "G"} and THINK_END in raw, raw
    expected = reasoning_parser.parse(raw, final=True)

    response = chat(think_client, model, seed=seed, **_mix(model, extra_body={"return_token_ids": True}))
    choice = response.choices[0]
    assert model.tokenizer.decode(extra(choice, "token_ids"), skip_special_tokens=True) == raw
    assert extra(choice.message, "reasoning") == expected.reasoning
    assert extra(choice.message, "reasoning_content") == expected.reasoning
    assert choice.message.content == expected.content
    assert THINK_END not in expected.reasoning  # the split is at the first marker
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    # deepseek_r1 reads reasoning from the first token: the tokens before the first </think> (vLLM's count)
    ids = extra(choice, "token_ids")
    reasoning_tokens = ids.index(model.id(THINK_END)) if model.id(THINK_END) in ids else len(ids)
    assert response.usage.completion_tokens_details.reasoning_tokens == reasoning_tokens

    options = {"stream_options": {"include_usage": True}}
    streamed = collect(chat(think_client, model, seed=seed, stream=True, **_mix(model), **options))
    # a stream sends no empty reasoning delta: an answer opening with the end marker streams none
    assert (streamed.reasoning or "", streamed.content) == (expected.reasoning, expected.content)
    assert streamed.finish_reasons == ["length"]
    assert streamed.usage.completion_tokens_details.reasoning_tokens == reasoning_tokens
    # no reasoning parser, no count (vLLM leaves completion_tokens_details out)
    assert chat(plain_client, model, seed=seed, **_mix(model)).usage.completion_tokens_details is None


def test_include_reasoning_false_drops_the_reasoning(think_client, plain_client, model, reasoning_parser):
    # the first seed whose completion has reasoning to drop (a draw may open with "</think>")
    for seed in range(20):
        raw = chat(plain_client, model, seed=seed, **_mix(model)).choices[0].message.content
        expected = reasoning_parser.parse(raw, final=True)
        if expected.reasoning:
            break
    assert expected.reasoning, raw  # there is something to drop

    request = _mix(model, seed=seed, extra_body={"include_reasoning": False})
    message = chat(think_client, model, **request).choices[0].message
    assert extra(message, "reasoning") is None and extra(message, "reasoning_content") is None
    assert message.content == expected.content
    streamed = collect(chat(think_client, model, stream=True, **request))
    assert (streamed.reasoning, streamed.content) == (None, expected.content)


ANSWER_REGEX = r"[0-9]{2}-[a-z]{1,3}"


@pytest.mark.parametrize("seed", [0, 1])
def test_structured_output_constrains_the_answer_not_the_reasoning(think_client, model, reasoning_parser, seed):
    request = _mix(model, extra_body={"structured_outputs": {"regex": ANSWER_REGEX}, "return_token_ids": True})
    request["max_tokens"] = 30
    choice = chat(think_client, model, seed=seed, **request).choices[0]
    raw = model.tokenizer.decode(extra(choice, "token_ids"), skip_special_tokens=True)
    expected = reasoning_parser.parse(raw, final=True)
    assert choice.finish_reason == "stop", choice  # the regex ended the answer
    assert re.fullmatch(ANSWER_REGEX, choice.message.content), choice.message.content
    assert choice.message.content == expected.content
    reasoning = extra(choice.message, "reasoning")
    assert reasoning == expected.reasoning and set(reasoning) <= {"F", "G"}, reasoning  # unconstrained
    streamed = collect(chat(think_client, model, seed=seed, stream=True, **request))
    # (an empty reasoning is "" in a message, and no delta at all in a stream)
    assert (streamed.reasoning or "", streamed.content, streamed.finish_reasons) == (
        reasoning,
        choice.message.content,
        ["stop"],
    )


def test_prompt_that_closed_the_reasoning_is_all_answer(think_client, model):
    """A prompt ending after </think> (continuing an answer) has no reasoning: the constraint applies at once."""
    messages = [*MESSAGES, {"role": "assistant", "content": f"{THINK_START}hmm{THINK_END}"}]
    choice = chat(
        think_client,
        model,
        messages=messages,
        max_tokens=12,
        seed=1,
        extra_body={
            "continue_final_message": True,
            "add_generation_prompt": False,
            "structured_outputs": {"regex": ANSWER_REGEX},
        },
    ).choices[0]
    assert extra(choice.message, "reasoning") is None
    assert re.fullmatch(ANSWER_REGEX, choice.message.content), choice
    assert choice.finish_reason == "stop"


def test_named_tool_choice_after_reasoning(think_client, model, reasoning_parser):
    """tool_choice named with a reasoning parser: the reasoning is free, the arguments constrained after </think>."""
    request = {
        "tools": [WEATHER],
        "tool_choice": NAMED,
        "max_tokens": 80,
        "logit_bias": think_first(model),
        "extra_body": {"return_token_ids": True},
    }
    for seed in range(20):  # the first seed whose completion reasons before "</think>" (a draw may open with it)
        request["seed"] = seed
        choice = chat(think_client, model, **request).choices[0]
        if extra(choice.message, "reasoning"):
            break
    assert choice.finish_reason == "stop", choice
    calls = whole_calls(choice.message)
    assert [name for name, _ in calls] == ["get_weather"], calls
    check_arguments(*calls[0])
    raw = model.tokenizer.decode(extra(choice, "token_ids"), skip_special_tokens=True)
    expected = reasoning_parser.parse(raw, final=True)
    reasoning = extra(choice.message, "reasoning")
    assert reasoning == expected.reasoning and reasoning and set(reasoning) == {"F"}, raw
    assert expected.content == calls[0][1]  # the answer is the arguments object, nothing else
    streamed = collect(chat(think_client, model, stream=True, **request))
    assert (streamed.call_pairs, streamed.reasoning, streamed.finish_reasons) == (calls, reasoning, ["stop"])


# -- structured outputs ----------------------------------------------------------------------------

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["answer", "score"],
    "additionalProperties": False,
}
CHOICES = ["yes", "no", "maybe"]


def _complete(client: openai.OpenAI, model: Model, **kwargs: Any) -> Any:
    return client.completions.create(model=model.name, prompt="The quick brown fox", temperature=1.0, **kwargs)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_json_schema_output_validates(plain_client, model, endpoint):
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}
    for seed in (1,):
        if endpoint == "chat":
            choice = chat(plain_client, model, max_tokens=120, seed=seed, response_format=response_format).choices[0]
            text = choice.message.content
        else:
            choice = _complete(
                plain_client, model, max_tokens=120, seed=seed, extra_body={"response_format": response_format}
            ).choices[0]
            text = choice.text
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(text), ANSWER_SCHEMA)


def test_json_object_output_is_an_object(plain_client, model):
    # a random model may ramble inside the object past max_tokens (a seed's draw): every answer that
    # ends is an object, and most seeds end
    stopped = 0
    for seed in range(5):
        choice = chat(plain_client, model, max_tokens=120, seed=seed, response_format={"type": "json_object"}).choices[
            0
        ]
        assert choice.finish_reason in ("stop", "length"), choice
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
            stopped += 1
        else:
            assert choice.message.content.lstrip().startswith("{"), choice
    assert stopped >= 3, stopped


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("kind", ["choice", "regex"])
def test_choice_and_regex_outputs(plain_client, model, endpoint, kind):
    constraint = {"choice": CHOICES} if kind == "choice" else {"regex": ANSWER_REGEX}
    for seed in (0, 1):
        if endpoint == "chat":
            choice = chat(
                plain_client, model, max_tokens=20, seed=seed, extra_body={"structured_outputs": constraint}
            ).choices[0]
            text = choice.message.content
        else:
            choice = _complete(
                plain_client, model, max_tokens=20, seed=seed, extra_body={"structured_outputs": constraint}
            ).choices[0]
            text = choice.text
        assert choice.finish_reason == "stop", choice
        assert text in CHOICES if kind == "choice" else re.fullmatch(ANSWER_REGEX, text), text


INVALID_CONSTRAINTS = {
    "regex": {"structured_outputs": {"regex": "[a-"}},
    "json": {"structured_outputs": {"json": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}},
    "grammar": {"structured_outputs": {"grammar": "root ::= ("}},
    "response_format": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}},
        }
    },
}


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("kind", list(INVALID_CONSTRAINTS))
def test_invalid_constraint_is_400(plain_client, model, endpoint, kind):
    body = INVALID_CONSTRAINTS[kind]
    with pytest.raises(openai.BadRequestError) as caught:
        if endpoint == "chat":
            chat(plain_client, model, max_tokens=4, extra_body=body)
        else:
            _complete(plain_client, model, max_tokens=4, extra_body=body)
    named = "response_format" if kind == "response_format" else "structured_outputs"  # the field sent
    assert_openai_error(caught.value.response, 400, contains=f"invalid {named}")


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("kind", ["regex", "json"])
def test_invalid_constraint_is_400_when_streaming(plain_client, model, endpoint, kind):
    """The constraint is refused before the stream starts, as every other invalid request is."""
    body = INVALID_CONSTRAINTS[kind]
    try:
        if endpoint == "chat":
            stream = chat(plain_client, model, max_tokens=4, stream=True, extra_body=body)
        else:
            stream = _complete(plain_client, model, max_tokens=4, stream=True, extra_body=body)
        list(stream)
    except openai.BadRequestError as exc:
        assert_openai_error(exc.response, 400, contains="invalid structured_outputs")
    except openai.APIError as exc:
        pytest.fail(f"an invalid {kind} constraint was answered 200 and failed in the stream: {exc}")
    else:
        pytest.fail(f"an invalid {kind} constraint was accepted")


# -- thinking_token_budget -------------------------------------------------------------------------


def _letters(model: Model, **kwargs: Any) -> dict[str, Any]:
    """A request whose completion is a seeded random mix of "F" and "G", never closing the reasoning itself."""
    bias = {**model.bias("F", "G"), str(model.id(THINK_END)): -100}
    return dict(max_tokens=14, logit_bias=bias, extra_body={"ignore_eos": True, **kwargs}, seed=3)


@pytest.mark.parametrize("budget", [0, 5])
def test_thinking_token_budget_cuts_the_reasoning(think_client, model, budget):
    """deepseek_r1 reads a completion as reasoning from its first token: after ``budget`` of them the
    engine writes </think> (against a -100 bias), and the rest is the answer."""
    request = _letters(model, thinking_token_budget=budget, return_token_ids=True)
    response = chat(think_client, model, **request)
    choice = response.choices[0]
    assert response.usage.completion_tokens_details.reasoning_tokens == budget  # the count the budget spends
    ids = extra(choice, "token_ids")
    assert len(ids) == 14 and ids[budget] == model.id(THINK_END), ids
    assert extra(choice.message, "reasoning") == model.tokenizer.decode(ids[:budget])
    assert choice.message.content == model.tokenizer.decode(ids[budget + 1 :]) and len(choice.message.content) > 0
    streamed = collect(chat(think_client, model, stream=True, **request))
    assert (streamed.reasoning or "", streamed.content) == (extra(choice.message, "reasoning"), choice.message.content)
    # the same on /v1/completions: its prompt says nothing of reasoning, which deepseek_r1 assumes open
    request["extra_body"]["return_token_ids"] = False
    text = think_client.completions.create(model=model.name, prompt="The quick brown fox", **request).choices[0].text
    assert text.count(THINK_END) == 1 and len(text.split(THINK_END)[0]) == budget, text


def test_thinking_token_budget_needs_a_reasoning_parser_and_a_count(servers, think_client, plain_client, model):
    with pytest.raises(openai.BadRequestError) as info:
        chat(plain_client, model, **_letters(model, thinking_token_budget=4))
    assert info.value.body["param"] == "thinking_token_budget" and "--reasoning-parser" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        chat(think_client, model, **_letters(model, thinking_token_budget=-1))
    assert info.value.body["param"] == "thinking_token_budget" and ">= 0" in info.value.body["message"]
    response = httpx.post(
        f"{servers['think'].api_url}/chat/completions",
        json={"model": model.name, "messages": MESSAGES, "thinking_token_budget": "many"},
        timeout=30,
    )
    assert_openai_error(response, 400, contains="thinking_token_budget")


def test_responses_stream_ends_the_reasoning_item_before_the_answer_starts(think_client, model):
    """Responses with deepseek_r1 and a budget: a reasoning item, done before the message item is added (as
    OpenAI's stream orders them), then the message; cut by max_output_tokens, the message is incomplete."""
    request = {
        "model": model.name,
        "input": "The quick brown fox",
        "max_output_tokens": 10,
        "temperature": 1.0,
        "extra_body": {"thinking_token_budget": 4, "ignore_eos": True, "seed": 3},
    }
    whole = think_client.responses.create(**request)
    assert whole.status == "incomplete" and [item.type for item in whole.output] == ["reasoning", "message"]
    assert whole.usage.output_tokens_details.reasoning_tokens == 4
    assert [item.status for item in whole.output] == ["completed", "incomplete"]
    events = list(think_client.responses.create(**request, stream=True))
    order = [
        (event.type, getattr(event, "output_index", None))
        for event in events
        if event.type in ("response.output_item.added", "response.output_item.done")
    ]
    assert order == [
        ("response.output_item.added", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.output_item.done", 1),
    ]
    done = [event.item for event in events if event.type == "response.output_item.done"]
    assert [item.status for item in done] == ["completed", "incomplete"]
    assert done[0].content[0].text == whole.output[0].content[0].text
    assert done[1].content[0].text == whole.output[1].content[0].text == whole.output_text


def test_a_streamed_responses_function_call_names_its_function_when_its_arguments_are_done(servers, model):
    tools = [{"type": "function", "name": "lookup", "parameters": SCHEMAS["lookup"]}]
    request = {"model": model.name, "input": "Look it up", "tools": tools, "max_output_tokens": 32}
    with _client(servers["tools"]) as client:
        events = list(
            client.responses.create(**request, tool_choice={"type": "function", "name": "lookup"}, stream=True)
        )
    [done] = [event for event in events if event.type == "response.function_call_arguments.done"]
    [item] = [event.item for event in events if event.type == "response.output_item.done"]
    assert done.name == item.name == "lookup" and done.arguments == item.arguments
    assert json.loads(done.arguments)["q"] in ("a", "b")
