"""``/v1/messages`` and ``/v1/messages/count_tokens`` through the official ``anthropic`` SDK, checked
against the OpenAI front-end of the same server and against the tokenizer's own chat template."""

from __future__ import annotations

import re
import time

import anthropic
import httpx
import pytest
from anthropic_frontend_support import API_KEY, sse_events

GREEDY = {"extra_body": {"temperature": 0}}  # recent SDKs have no temperature argument
FOX = [{"role": "user", "content": "The quick brown fox"}]
# greedy, the tiny model (seed 0) does not end this one before 480 tokens (1-3 s on a CPU)
LONG = [{"role": "user", "content": "Paged attention keeps"}]


@pytest.fixture(scope="module")
def name(model_dir) -> str:
    return str(model_dir)  # the served model name: the model path


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def openai_chat(http: httpx.Client, name: str, messages: list[dict], max_tokens: int, **extra) -> dict:
    response = http.post(
        "/v1/chat/completions",
        json={"model": name, "messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra},
    )
    assert response.status_code == 200, response.text
    return response.json()


def metrics(http: httpx.Client) -> dict[str, float]:
    out = {}
    for line in http.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def metric(values: dict[str, float], name: str, **labels: str) -> float:
    total = 0.0
    for key, value in values.items():
        base, _, rest = key.partition("{")
        found = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if base == name and all(found.get(k) == v for k, v in labels.items()):
            total += value
    return total


def wait_idle(http: httpx.Client, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while metric(metrics(http), "llmp_num_requests_running") or metric(metrics(http), "llmp_num_requests_waiting"):
        assert time.monotonic() < deadline, "requests still running"
        time.sleep(0.02)


# -- generation ---------------------------------------------------------------


def test_greedy_text_equals_openai_chat(client, http, name, tokenizer):
    message = client.messages.create(model=name, messages=FOX, max_tokens=12, **GREEDY)
    reference = openai_chat(http, name, FOX, 12)
    assert message.type == "message" and message.role == "assistant" and message.model == name
    assert message.id.startswith("msg_")
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == reference["choices"][0]["message"]["content"]
    assert message.content[0].text  # a random model still says something in 12 tokens
    assert message.usage.input_tokens == reference["usage"]["prompt_tokens"] == len(chat_ids(tokenizer, FOX))
    assert message.usage.output_tokens == reference["usage"]["completion_tokens"]
    expected = {"length": "max_tokens", "stop": "end_turn"}[reference["choices"][0]["finish_reason"]]
    assert message.stop_reason == expected and message.stop_sequence is None


def test_system_prompt_string_and_blocks(client, http, name, tokenizer):
    system = "You are terse."
    as_string = client.messages.create(model=name, system=system, messages=FOX, max_tokens=8, **GREEDY)
    as_blocks = client.messages.create(
        model=name, system=[{"type": "text", "text": system}], messages=FOX, max_tokens=8, **GREEDY
    )
    reference = openai_chat(http, name, [{"role": "system", "content": system}, *FOX], 8)
    assert as_string.content[0].text == as_blocks.content[0].text == reference["choices"][0]["message"]["content"]
    expected = chat_ids(tokenizer, [{"role": "system", "content": system}, *FOX])
    assert as_string.usage.input_tokens == as_blocks.usage.input_tokens == len(expected)
    assert len(expected) > len(chat_ids(tokenizer, FOX))
    # Claude Code's billing header (a hash a request) is dropped: it would defeat the prefix cache
    billed = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.0; cch=9f2c;"},
        {"type": "text", "text": system},
    ]
    counted = client.messages.count_tokens(model=name, system=billed, messages=FOX).input_tokens
    assert counted == len(expected)
    only_header = client.messages.count_tokens(model=name, system=billed[:1], messages=FOX).input_tokens
    assert only_header == len(chat_ids(tokenizer, FOX))  # no empty system message either


def test_multi_turn_with_text_blocks(client, http, name, tokenizer):
    turns = [
        {"role": "user", "content": "Paged attention keeps"},
        {"role": "assistant", "content": "the KV cache"},
        {"role": "user", "content": "in fixed-size blocks."},
    ]
    blocks = [
        {**turns[0], "content": [{"type": "text", "text": "Paged attention"}, {"type": "text", "text": "keeps"}]},
        *turns[1:],
    ]
    message = client.messages.create(model=name, messages=turns, max_tokens=10, **GREEDY)
    reference = openai_chat(http, name, turns, 10)
    assert message.content[0].text == reference["choices"][0]["message"]["content"]
    assert message.usage.input_tokens == len(chat_ids(tokenizer, turns))
    joined = [{**turns[0], "content": "Paged attention\nkeeps"}, *turns[1:]]  # text blocks join with newlines
    assert client.messages.count_tokens(model=name, messages=blocks).input_tokens == len(chat_ids(tokenizer, joined))


def test_stop_sequence(client, name):
    full = client.messages.create(model=name, messages=FOX, max_tokens=24, **GREEDY).content[0].text
    stop = full[6:9]
    assert len(stop) == 3 and stop.strip(), full
    message = client.messages.create(
        model=name, messages=FOX, max_tokens=24, stop_sequences=["\x00never", stop], **GREEDY
    )
    assert message.stop_reason == "stop_sequence"
    assert message.stop_sequence == stop
    assert message.content[0].text == full[: full.index(stop)]  # the stop sequence itself is not returned


def test_max_tokens(client, name):
    message = client.messages.create(model=name, messages=FOX, max_tokens=5, **GREEDY)
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    assert message.usage.output_tokens == 5


def test_stream_event_sequence_and_text(client, http, name):
    whole = client.messages.create(model=name, messages=FOX, max_tokens=16, **GREEDY)
    events = list(client.messages.create(model=name, messages=FOX, max_tokens=16, stream=True, **GREEDY))
    kinds = [event.type for event in events]  # the SDK drops pings
    assert re.fullmatch(
        r"message_start content_block_start (content_block_delta )+content_block_stop "
        r"message_delta message_stop",
        " ".join(kinds),
    ), kinds
    start = events[0].message
    assert start.id.startswith("msg_") and start.content == [] and start.stop_reason is None
    assert start.usage.input_tokens == whole.usage.input_tokens and start.usage.output_tokens == 0
    assert events[1].index == 0 and events[1].content_block.type == "text" and events[1].content_block.text == ""
    deltas = [e for e in events if e.type == "content_block_delta"]
    assert all(e.index == 0 and e.delta.type == "text_delta" for e in deltas)
    assert "".join(e.delta.text for e in deltas) == whole.content[0].text
    delta = events[-2]
    assert delta.delta.stop_reason == whole.stop_reason and delta.delta.stop_sequence == whole.stop_sequence
    assert delta.usage.output_tokens == whole.usage.output_tokens

    # the SDK's stream helper assembles the same message
    with client.messages.stream(model=name, messages=FOX, max_tokens=16, **GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert (final.stop_reason, final.usage.input_tokens, final.usage.output_tokens) == (
        whole.stop_reason,
        whole.usage.input_tokens,
        whole.usage.output_tokens,
    )

    # on the wire: "event: <type>" lines naming each data's type
    raw = http.post(
        "/v1/messages", json={"model": name, "messages": FOX, "max_tokens": 16, "temperature": 0, "stream": True}
    )
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    wire = [kind for kind, _ in sse_events(raw.text)]
    assert wire == kinds[:2] + ["ping"] + kinds[2:]


def test_stream_with_stop_sequence(client, name):
    full = client.messages.create(model=name, messages=FOX, max_tokens=24, **GREEDY).content[0].text
    stop = full[6:9]
    with client.messages.stream(model=name, messages=FOX, max_tokens=24, stop_sequences=[stop], **GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == full[: full.index(stop)]
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop


def test_count_tokens(client, name, tokenizer):
    system = "Be brief."
    counted = client.messages.count_tokens(model=name, system=system, messages=FOX)
    expected = chat_ids(tokenizer, [{"role": "system", "content": system}, *FOX])
    assert counted.input_tokens == len(expected)
    created = client.messages.create(model=name, system=system, messages=FOX, max_tokens=1, **GREEDY)
    assert created.usage.input_tokens == counted.input_tokens


def test_tool_use_and_result_render_as_tool_turns(client, name, tokenizer):
    tools = [
        {
            "name": "get_weather",
            "description": "Weather of a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C, sunny"}]}
            ],
        },
    ]
    counted = client.messages.count_tokens(model=name, messages=messages, tools=tools)
    # the tiny template renders role and content: the tool result is a "tool" turn
    expected = chat_ids(
        tokenizer,
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Let me look."},
            {"role": "tool", "content": "18 C, sunny"},
        ],
    )
    assert counted.input_tokens == len(expected)
    message = client.messages.create(
        model=name, messages=messages, tools=tools, tool_choice={"type": "auto"}, max_tokens=4, **GREEDY
    )
    assert message.usage.input_tokens == len(expected) and message.content[0].type == "text"


# -- errors ---------------------------------------------------------------------------


def error_of(exc: anthropic.APIStatusError) -> dict:
    body = exc.response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return body["error"]


def test_unknown_model_is_not_found(client):
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-nonexistent", messages=FOX, max_tokens=4)
    assert caught.value.status_code == 404
    error = error_of(caught.value)
    assert error["type"] == "not_found_error" and "claude-nonexistent" in error["message"]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="claude-nonexistent", messages=FOX)


def test_bad_requests(client, name):
    with pytest.raises(anthropic.BadRequestError) as caught:  # the SDK insists on max_tokens: post the body raw
        client.post("/v1/messages", body={"model": name, "messages": FOX}, cast_to=httpx.Response)
    error = error_of(caught.value)
    assert error["type"] == "invalid_request_error" and "max_tokens" in error["message"]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=name, messages=FOX, max_tokens=0)
    assert "max_tokens" in error_of(caught.value)["message"]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=name, messages=FOX, max_tokens=100_000)
    assert "max_model_len" in error_of(caught.value)["message"]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=name, messages=[], max_tokens=4)
    assert "messages" in error_of(caught.value)["message"]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=name, messages=[{"role": "user", "content": [image]}], max_tokens=4)
    assert "'image'" in error_of(caught.value)["message"]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=name, messages=FOX, max_tokens=4, stop_sequences=[""])
    assert "empty" in error_of(caught.value)["message"]


def test_forced_tool_choice_needs_a_parser(client, name):
    tools = [{"name": "f", "input_schema": {"type": "object", "properties": {}}}]
    for choice in ({"type": "any"}, {"type": "tool", "name": "f"}):
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model=name, messages=FOX, max_tokens=4, tools=tools, tool_choice=choice)
        error = error_of(caught.value)
        assert error["type"] == "invalid_request_error" and "--tool-call-parser" in error["message"]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=name, messages=FOX, max_tokens=4, tool_choice={"type": "auto"})


def test_openai_paths_keep_openai_errors(http):
    response = http.post("/v1/chat/completions", json={"model": "nope", "messages": FOX})
    assert response.status_code == 404 and "message" in response.json()["error"]
    assert "type" not in response.json() or response.json().get("type") != "error"


def test_api_key(strict_server, name):
    with anthropic.Anthropic(base_url=strict_server.url, api_key="wrong", max_retries=0, timeout=60) as sdk:
        with pytest.raises(anthropic.AuthenticationError) as caught:
            sdk.messages.create(model=name, messages=FOX, max_tokens=2)
        assert error_of(caught.value)["type"] == "authentication_error"
    with anthropic.Anthropic(base_url=strict_server.url, api_key=API_KEY, max_retries=0, timeout=60) as sdk:
        message = sdk.messages.create(model=name, messages=FOX, max_tokens=2, **GREEDY)
        assert message.usage.output_tokens == 2
        prompt_tokens = message.usage.input_tokens + message.usage.cache_read_input_tokens
        assert sdk.messages.count_tokens(model=name, messages=FOX).input_tokens == prompt_tokens


def test_models_are_listed_in_anthropics_shape_when_alone(strict_server, server, name):
    """Anthropic's List Models on a server mounting only this front-end (the SDK's models.list and
    retrieve); beside the OpenAI front-end, /v1/models is that one's."""
    with anthropic.Anthropic(base_url=strict_server.url, api_key=API_KEY, max_retries=0, timeout=60) as sdk:
        page = sdk.models.list()
        assert [(m.id, m.type, m.display_name) for m in page.data] == [(name, "model", name)]
        assert page.has_more is False and page.first_id == page.last_id == name
        assert sdk.models.retrieve(name).created_at.year >= 2024
        with pytest.raises(anthropic.NotFoundError):
            sdk.models.retrieve("no-such-model")
    listed = httpx.get(f"{server.url}/v1/models", timeout=60).json()
    assert listed["object"] == "list" and listed["data"][0]["id"] == name  # OpenAI's, both front-ends mounted


def test_prefix_cache_reads_are_cache_read_input_tokens(strict_server, name):
    """With ``--enable-prompt-tokens-details`` (vLLM's flag) usage splits the prompt as Anthropic does:
    ``input_tokens`` + ``cache_read_input_tokens``, whole and streamed."""
    system = "You answer questions about foxes. " * 12  # several KV blocks, cached by the first request
    ask = {"model": name, "system": system, "messages": FOX, "max_tokens": 3, **GREEDY}
    with anthropic.Anthropic(base_url=strict_server.url, api_key=API_KEY, max_retries=0, timeout=60) as sdk:
        prompt_tokens = sdk.messages.count_tokens(model=name, system=system, messages=FOX).input_tokens
        sdk.messages.create(**ask)
        again = sdk.messages.create(**ask).usage
        assert again.cache_read_input_tokens > prompt_tokens // 2
        assert again.input_tokens + again.cache_read_input_tokens == prompt_tokens

        events = list(sdk.messages.create(**ask, stream=True))
        start, delta = events[0].message.usage, events[-2].usage
        assert (start.input_tokens, start.cache_read_input_tokens, start.output_tokens) == (
            again.input_tokens,
            again.cache_read_input_tokens,
            0,
        )
        assert (delta.input_tokens, delta.cache_read_input_tokens, delta.output_tokens) == (
            again.input_tokens,
            again.cache_read_input_tokens,
            3,
        )
        with sdk.messages.stream(**ask) as stream:
            assert stream.get_final_message().usage == again


def test_overload_is_529(strict_server, name):
    headers = {"x-api-key": API_KEY}
    body = {"model": name, "messages": LONG, "max_tokens": 480, "temperature": 0, "stream": True}
    with httpx.Client(base_url=strict_server.url, headers=headers, timeout=60) as http:
        with http.stream("POST", "/v1/messages", json=body) as first:
            assert first.status_code == 200
            lines = first.iter_lines()  # kept: a dropped iterator closes the response, which aborts it
            while not next(lines).startswith("event: content_block_delta"):
                pass  # generating: the one place is taken
            second = http.post("/v1/messages", json={**body, "stream": False})
        assert second.status_code == 529, second.text
        assert second.json() == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": second.json()["error"]["message"]},
        }
        wait_idle(http)
        with anthropic.Anthropic(base_url=strict_server.url, api_key=API_KEY, max_retries=0) as sdk:
            assert sdk.messages.create(model=name, messages=FOX, max_tokens=2).usage.output_tokens == 2


# -- fixes of the Messages API's finer points -------------------------------------------------


def test_assistant_prefill_is_continued(client, http, name, tokenizer):
    """A final assistant turn is a prefill: the reply continues it (no new assistant turn), and the
    content is only the continuation, as OpenAI's ``continue_final_message`` gives it."""
    turns = [*FOX, {"role": "assistant", "content": "jumps over"}]
    message = client.messages.create(model=name, messages=turns, max_tokens=10, **GREEDY)
    reference = openai_chat(http, name, turns, 10, continue_final_message=True, add_generation_prompt=False)
    assert message.content[0].text == reference["choices"][0]["message"]["content"]
    text = tokenizer.apply_chat_template(turns, continue_final_message=True, tokenize=False)
    assert text.endswith("jumps over")
    expected = tokenizer.encode(text, add_special_tokens=False)
    assert message.usage.input_tokens == len(expected) < len(chat_ids(tokenizer, turns))
    as_blocks = [*FOX, {"role": "assistant", "content": [{"type": "text", "text": "jumps over"}]}]
    assert client.messages.count_tokens(model=name, messages=as_blocks).input_tokens == len(expected)


def test_request_id_header(client, name):
    raw = client.messages.with_raw_response.create(model=name, messages=FOX, max_tokens=2)
    assert raw.headers["request-id"] == raw.headers["x-request-id"] and raw.parse()._request_id
    assert raw.parse()._request_id == raw.headers["request-id"]
    streamed = client.messages.with_raw_response.create(model=name, messages=FOX, max_tokens=2, stream=True)
    assert streamed.headers["request-id"] == streamed.headers["x-request-id"]
    list(streamed.parse())
    with pytest.raises(anthropic.BadRequestError) as caught:  # errors too, a body the route refuses included
        client.messages.create(model=name, messages=FOX, max_tokens=0)
    assert caught.value.request_id and caught.value.request_id == caught.value.response.headers["x-request-id"]
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="nope", messages=FOX, max_tokens=2)
    assert caught.value.request_id


def test_message_ids_are_unique_and_opaque(client, name):
    header = {"X-Request-Id": "same id <&>"}
    first, second = (
        client.messages.create(model=name, messages=FOX, max_tokens=1, extra_headers=header) for _ in range(2)
    )
    assert first.id != second.id
    for message in (first, second):
        assert re.fullmatch(r"msg_[0-9a-f]{32}", message.id), message.id


def test_failed_tool_result_says_so(client, name, tokenizer):
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}]
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "city not found", "is_error": True}
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    expected = chat_ids(
        tokenizer,
        [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": ""},
            {"role": "tool", "content": "Tool error: city not found"},
        ],
    )
    assert client.messages.count_tokens(model=name, messages=messages, tools=tools).input_tokens == len(expected)


def test_model_is_required(client, name):
    for body in ({"messages": FOX, "max_tokens": 2}, {"model": "", "messages": FOX, "max_tokens": 2}):
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            with pytest.raises(anthropic.BadRequestError) as caught:
                client.post(path, body=body, cast_to=httpx.Response)
            error = error_of(caught.value)
            assert error["type"] == "invalid_request_error" and "model" in error["message"], error
            assert name in error["message"]  # it names what is served


def test_ignored_tool_and_thinking_keys_are_logged(server, client, name):
    tools = [{"name": "lookup_fox_strict", "input_schema": {"type": "object"}, "strict": True, "cache_control": {}}]
    client.messages.count_tokens(
        model=name,
        messages=FOX,
        tools=tools,
        thinking={"type": "disabled"},
        extra_body={"thinking": {"type": "disabled", "depth_hint": 3}, "output_config": {"effort": "low"}},
    )
    log = server.log()
    line = next(line for line in log.splitlines() if "tools.strict" in line)
    assert "thinking.depth_hint" in line and "output_config.effort" in line and "cache_control" not in line


def test_lone_surrogate_is_not_valid_unicode(http, name):
    import json

    # the SDK cannot send one (it encodes UTF-8); JSON can, escaped
    for content in ("fox \ud800", [{"type": "text", "text": "\ud800"}]):
        body = {"model": name, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
        response = http.post("/v1/messages", content=json.dumps(body), headers={"content-type": "application/json"})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and "not valid Unicode" in error["message"], error


def test_thinking_types(client, name, tokenizer):
    counts = {
        kind: client.messages.count_tokens(model=name, messages=FOX, thinking={"type": kind}).input_tokens
        for kind in ("disabled", "between_tools")  # between_tools: thinking off
    }
    assert counts["between_tools"] == counts["disabled"] == len(chat_ids(tokenizer, FOX))
    message = client.messages.create(model=name, messages=FOX, max_tokens=2, thinking={"type": "between_tools"})
    assert message.usage.output_tokens == 2
    for thinking, wrong in (
        ({"type": "sometimes"}, "thinking.type"),
        ({"type": "adaptive", "display": "all"}, "thinking.display"),
    ):
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model=name, messages=FOX, max_tokens=2, extra_body={"thinking": thinking})
        message = error_of(caught.value)["message"]
        assert message.startswith(wrong) and "literal_error" not in message, message


SMALL = {
    "type": "object",
    "properties": {"size": {"type": "string", "enum": ["small", "large"]}},
    "required": ["size"],
    "additionalProperties": False,
}


def test_output_format_is_a_json_schema_constraint(client, name):
    import json

    for extra in (
        {"output_config": {"format": {"type": "json_schema", "schema": SMALL}}},
        {"output_format": {"type": "json_schema", "schema": SMALL}},
    ):
        message = client.messages.create(
            model=name, messages=FOX, max_tokens=40, extra_body={**extra, "temperature": 0}
        )
        assert message.stop_reason == "end_turn", message
        assert json.loads(message.content[0].text)["size"] in ("small", "large")
    with client.messages.stream(
        model=name,
        messages=FOX,
        max_tokens=40,
        output_config={"format": {"type": "json_schema", "schema": SMALL}},
        **GREEDY,
    ) as stream:
        assert json.loads(stream.get_final_message().content[0].text)["size"] in ("small", "large")


def test_output_format_with_the_sdk_parse(client, name):
    from typing import Literal

    from pydantic import BaseModel

    class Size(BaseModel):
        size: Literal["small", "large"]

    parsed = client.messages.parse(model=name, messages=FOX, max_tokens=40, output_format=Size, **GREEDY)
    assert parsed.parsed_output.size in ("small", "large")


def test_output_format_errors(client, name):
    bad = [
        (
            {"output_config": {"format": {"type": "json_schema", "schema": {"type": "no-such-type"}}}},
            "output_config.format",
        ),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format"),
        ({"output_config": {"format": {"type": "xml", "schema": {}}}}, "output_config.format"),
        (
            {
                "output_format": {"type": "json_schema", "schema": SMALL},
                "output_config": {"format": {"type": "json_schema", "schema": SMALL}},
            },
            "output",
        ),
        (
            {
                "output_config": {"format": {"type": "json_schema", "schema": SMALL}},
                "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "any"},
            },
            "tool_choice",
        ),
    ]
    for extra, says in bad:
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model=name, messages=FOX, max_tokens=4, extra_body=extra)
        error = error_of(caught.value)
        assert error["type"] == "invalid_request_error" and says in error["message"], (extra, error)
