"""``/v1/responses`` through the official SDK: parity with chat, the streamed event grammar, the store."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai_frontend_support import assert_error

from llmp.testing import LiveServer, SlowSteps, plugin_site, serving

GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> SlowSteps:
    # slowed, a long generation lasts long whatever the machine (400 tokens: 20 s at least), and a
    # request made to be stopped cannot end first however late its client gets to stop it
    return SlowSteps(tmp_path_factory.mktemp("slow-site"))


@pytest.fixture(scope="module")
def store_server(tiny, slow: SlowSteps) -> Iterator[LiveServer]:
    with serving(tiny.path, "--enable-store", "--executor", "slow-steps", env=slow.env) as live:
        yield live


@pytest.fixture(scope="module")
def store(store_server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=store_server.api_url, api_key="x", max_retries=0, timeout=60) as sdk:
        yield sdk


def chat_text(client: openai.OpenAI, tiny, messages: list[dict], max_tokens: int) -> str:
    response = client.chat.completions.create(model=tiny.name, messages=messages, max_tokens=max_tokens, **GREEDY)
    return response.choices[0].message.content


def test_a_response_equals_the_chat_completion_of_the_same_conversation(client, tiny):
    response = client.responses.create(model=tiny.name, input="The quick brown fox", max_output_tokens=10, **GREEDY)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    assert response.output_text == chat_text(client, tiny, [{"role": "user", "content": "The quick brown fox"}], 10)
    usage = response.usage
    assert usage.output_tokens == 10 and usage.input_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_instructions_and_input_items_render_as_system_and_user_messages(client, tiny):
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Zürich"}]}]
    response = client.responses.create(
        model=tiny.name, instructions="Be brief.", input=items, max_output_tokens=8, **GREEDY
    )
    expected = chat_text(
        client, tiny, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Zürich"}], 8
    )
    assert response.output_text == expected
    as_string = client.responses.create(
        model=tiny.name, instructions="Be brief.", input="Zürich", max_output_tokens=8, **GREEDY
    )
    assert as_string.output_text == expected


def test_a_response_that_ends_by_itself_is_completed(client, tiny):
    response = client.responses.create(
        model=tiny.name,
        input="hi",
        max_output_tokens=200,
        temperature=0,
        extra_body={"stop": [" "], "include_stop_str_in_output": False},
    )
    assert response.status in ("completed", "incomplete")
    if response.usage.output_tokens < 200:
        assert response.status == "completed" and response.incomplete_details is None


def test_the_streamed_events_follow_the_grammar_and_spell_the_whole_text(client, tiny):
    whole = client.responses.create(model=tiny.name, input="Paged attention", max_output_tokens=12, **GREEDY)
    events = list(
        client.responses.create(model=tiny.name, input="Paged attention", max_output_tokens=12, stream=True, **GREEDY)
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-4].text
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens == 12
    assert events[0].response.status == "in_progress" and events[0].response.output == []


def test_without_the_store_nothing_is_kept(client, http, tiny):
    response = client.responses.create(model=tiny.name, input="hi", max_output_tokens=2)
    assert_error(http.get(f"/v1/responses/{response.id}"), 404, contains=response.id)
    body = {"model": tiny.name, "input": "again", "previous_response_id": response.id, "max_output_tokens": 2}
    assert_error(http.post("/v1/responses", json=body), 404, param="response_id")
    body = {"model": tiny.name, "input": "hi", "background": True, "max_output_tokens": 2}
    assert_error(http.post("/v1/responses", json=body), 400, param="background", contains="--enable-store")


def test_unsupported_requests_are_refused(http, tiny):
    schema = {"format": {"type": "json_schema", "name": "x"}}  # no schema
    assert_error(
        http.post("/v1/responses", json={"model": tiny.name, "input": "hi", "text": schema}), 400, param="text"
    )
    web = [{"type": "web_search"}]
    assert_error(http.post("/v1/responses", json={"model": tiny.name, "input": "hi", "tools": web}), 400, param="tools")
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    body = {"model": tiny.name, "input": "hi", "tools": tools, "tool_choice": "auto"}
    assert_error(http.post("/v1/responses", json=body), 400, param="tool_choice")
    assert_error(http.post("/v1/responses", json={"model": tiny.name, "input": []}), 400, param="input")
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]
    assert_error(http.post("/v1/responses", json={"model": tiny.name, "input": image}), 400, param="input")
    assert_error(http.post("/v1/responses", json={"model": "nope", "input": "hi"}), 404, param="model")


def test_text_format_json_schema_constrains_the_output(client, tiny):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"format": {"type": "json_schema", "name": "count", "schema": schema, "strict": True}}
    response = client.responses.create(model=tiny.name, input="hi", text=fmt, max_output_tokens=60, temperature=0)
    assert response.status == "completed", response
    value = json.loads(response.output_text)
    assert isinstance(value, dict) and isinstance(value["n"], int)


def test_stored_responses_are_retrieved_and_continued(store, tiny):
    first = store.responses.create(model=tiny.name, input="The quick brown fox", max_output_tokens=6, **GREEDY)
    again = store.responses.retrieve(first.id)
    assert again.id == first.id and again.output_text == first.output_text
    follow = store.responses.create(
        model=tiny.name, input="jumps", previous_response_id=first.id, max_output_tokens=6, **GREEDY
    )
    history = [
        {"role": "user", "content": "The quick brown fox"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "jumps"},
    ]
    assert follow.output_text == chat_text(store, tiny, history, 6)
    assert follow.previous_response_id == first.id
    # branches from the same response are independent
    other = store.responses.create(
        model=tiny.name, input="sleeps", previous_response_id=first.id, max_output_tokens=6, **GREEDY
    )
    history[-1] = {"role": "user", "content": "sleeps"}
    assert other.output_text == chat_text(store, tiny, history, 6)


def test_input_items_are_listed_and_a_response_deleted(store, store_server, tiny):
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "The quick"}]},
        {"role": "user", "content": "brown fox"},
    ]
    response = store.responses.create(model=tiny.name, input=items, max_output_tokens=3, **GREEDY)
    listed = store.responses.input_items.list(response.id)  # newest first, OpenAI's default
    texts = [item.content[0].text for item in listed.data]
    assert texts == ["brown fox", "The quick", "Be brief."] and [i.role for i in listed.data][-1] == "developer"
    assert all(item.type == "message" and item.id for item in listed.data) and not listed.has_more
    page = store.responses.input_items.list(response.id, order="asc", limit=2)
    assert [item.content[0].text for item in page.data] == ["Be brief.", "The quick"] and page.has_more
    rest = store.responses.input_items.list(response.id, order="asc", after=page.data[-1].id)
    assert [item.content[0].text for item in rest.data] == ["brown fox"]
    deleted = httpx.delete(f"{store_server.url}/v1/responses/{response.id}")
    assert deleted.json() == {"id": response.id, "object": "response", "deleted": True}
    assert_error(httpx.get(f"{store_server.url}/v1/responses/{response.id}"), 404)
    assert_error(httpx.delete(f"{store_server.url}/v1/responses/{response.id}"), 404)


def test_a_background_stream_is_followed_and_resumed(store, store_server, slow, tiny):
    """background and stream: the events of a response that runs on whatever becomes of the request;
    GET ?stream=true&starting_after=N gives those after N (the SDK's resume), then the rest as they come."""
    events = list(
        store.responses.create(
            model=tiny.name, input="The quick", max_output_tokens=6, background=True, stream=True, **GREEDY
        )
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    response_id = events[0].response.id
    resumed = list(store.responses.retrieve(response_id, stream=True, starting_after=3))
    assert [e.model_dump() for e in resumed] == [e.model_dump() for e in events[4:]]
    # following one that is still running: the client leaves, the response runs on, a resume gets the rest
    with slow.slowed():
        stream = store.responses.create(
            model=tiny.name, input="The quick", max_output_tokens=40, background=True, stream=True, **GREEDY
        )
        first = [next(iter(stream)) for _ in range(3)]
        stream.close()
        rest = list(store.responses.retrieve(first[0].response.id, stream=True, starting_after=2))
    assert rest[0].sequence_number == 3 and rest[-1].type == "response.incomplete"
    text = "".join(e.delta for e in rest if e.type == "response.output_text.delta")
    assert text == store.responses.retrieve(first[0].response.id).output_text
    plain = store.responses.create(model=tiny.name, input="hi", max_output_tokens=2, **GREEDY)
    assert_error(httpx.get(f"{store_server.url}/v1/responses/{plain.id}?stream=true"), 400, param="stream")


def test_a_conversation_is_refused_not_ignored(http, tiny):
    body = {"model": tiny.name, "input": "hi", "max_output_tokens": 2, "conversation": "conv_123"}
    assert_error(http.post("/v1/responses", json=body), 400, param="conversation", contains="previous_response_id")


def test_store_false_is_not_kept(store, store_server, tiny):
    response = store.responses.create(model=tiny.name, input="hi", max_output_tokens=2, store=False)
    assert_error(httpx.get(f"{store_server.url}/v1/responses/{response.id}"), 404)


def test_background_responses_run_and_can_be_cancelled(store, store_server, slow, tiny):
    queued = store.responses.create(model=tiny.name, input="hi", max_output_tokens=4, background=True, **GREEDY)
    assert queued.status == "queued"
    deadline = time.monotonic() + 30
    while store.responses.retrieve(queued.id).status not in ("completed", "incomplete"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    done = store.responses.retrieve(queued.id)
    assert done.usage.output_tokens == 4 and done.output_text
    response = httpx.post(f"{store_server.url}/v1/responses/{queued.id}/cancel")
    assert_error(response, 400, contains="Cannot cancel")

    # 400 slowed steps: 20 s at least, so the cancel finds it running however late it comes
    with slow.slowed():
        long = store.responses.create(model=tiny.name, input="hi", max_output_tokens=400, background=True, **GREEDY)
        cancelled = store.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    assert store.responses.retrieve(long.id).status == "cancelled"


def test_truncation_auto_drops_the_oldest_turns_to_fit_the_context(auth_server):
    from openai_frontend_support import ALIAS, API_KEY

    long = "the quick brown fox jumps over the lazy dog " * 4  # more than the server's 64-token context
    items = [
        {"role": "user", "content": long},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "Zürich"},
    ]
    with openai.OpenAI(base_url=auth_server.api_url, api_key=API_KEY, max_retries=0, timeout=60) as client:
        ask = {"model": ALIAS, "instructions": "Be brief.", "max_output_tokens": 6, **GREEDY}
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            client.responses.create(input=items, **ask)  # "disabled", the default: a 400
        truncated = client.responses.create(input=items, truncation="auto", **ask)
        last_turn = client.responses.create(input=items[2:], **ask)
        assert truncated.truncation == "auto" and truncated.output_text == last_turn.output_text
        assert truncated.usage.input_tokens == last_turn.usage.input_tokens
        # the last user turn is never dropped: alone too long, it is the same 400
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            client.responses.create(input=[*items, {"role": "user", "content": long}], truncation="auto", **ask)
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(input=items, truncation="sometimes", **ask)
        assert "truncation" in str(info.value)


def test_load_counts_the_requests_being_answered(store_server, slow, tiny):
    """vLLM's ``GET /load``: ``server_load`` is the number of model requests in flight (a stream counts
    until its last chunk is sent), 0 again once they are answered. Slowed steps keep them running."""
    body = {"model": tiny.name, "prompt": "The quick", "max_tokens": 400, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=store_server.url, timeout=60) as http:

        def load_becomes(value: int) -> int:
            deadline = time.monotonic() + 30
            while (load := http.get("/load").json()["server_load"]) != value and time.monotonic() < deadline:
                time.sleep(0.05)
            return load

        assert http.get("/load").json() == {"server_load": 0}
        with slow.slowed():
            with http.stream("POST", "/v1/completions", json=body) as first:
                with http.stream("POST", "/v1/completions", json=body) as second:
                    lines = first.iter_lines(), second.iter_lines()  # kept: a dropped iterator closes its stream
                    next(lines[0]), next(lines[1])
                    assert http.get("/load").json() == {"server_load": 2}
                assert load_becomes(1) == 1  # the closed stream's request is aborted and no longer counted
        assert load_becomes(0) == 0


def test_background_needs_the_store(store_server, tiny):
    """vLLM's validate_background: a background response not stored could never be read."""
    body = {"model": tiny.name, "input": "hi", "background": True, "store": False, "max_output_tokens": 2}
    assert_error(httpx.post(f"{store_server.url}/v1/responses", json=body), 400, param="background", contains="store")


LOGPROBS = ["message.output_text.logprobs"]


def test_output_logprobs_are_chats_whole_and_streamed(client, http, tiny):
    ask = {"model": tiny.name, "input": "The quick", "max_output_tokens": 6, **GREEDY}
    response = client.responses.create(include=LOGPROBS, top_logprobs=3, **ask)
    part = response.output[0].content[0]
    chat = client.chat.completions.create(
        model=tiny.name,
        messages=[{"role": "user", "content": "The quick"}],
        max_tokens=6,
        logprobs=True,
        top_logprobs=3,
        **GREEDY,
    )
    assert [lp.model_dump() for lp in part.logprobs] == [lp.model_dump() for lp in chat.choices[0].logprobs.content]
    assert len(part.logprobs) == 6 and all(len(lp.top_logprobs) == 3 for lp in part.logprobs)
    assert response.top_logprobs == 3
    events = list(client.responses.create(include=LOGPROBS, top_logprobs=3, stream=True, **ask))
    streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]

    def tokens(logprobs: list) -> list:
        return [(lp.token, lp.logprob, [(t.token, t.logprob) for t in lp.top_logprobs]) for lp in logprobs]

    assert tokens(streamed) == tokens(part.logprobs) == tokens(events[-4].logprobs)  # and output_text.done's
    # the include alone: the sampled tokens' logprobs, no alternatives
    alone = client.responses.create(include=LOGPROBS, **ask).output[0].content[0].logprobs
    assert [lp.logprob for lp in alone] == [lp.logprob for lp in part.logprobs] and not alone[0].top_logprobs
    # top_logprobs without the include is refused, not ignored; above --max-logprobs as in chat
    body = {"model": tiny.name, "input": "hi", "max_output_tokens": 2}
    assert_error(
        http.post("/v1/responses", json={**body, "top_logprobs": 3}), 400, param="top_logprobs", contains="include"
    )
    over = {**body, "top_logprobs": 10_000, "include": LOGPROBS}
    assert_error(http.post("/v1/responses", json=over), 400, param="top_logprobs", contains="--max-logprobs")


def test_the_response_echoes_the_request_as_openai_does(client, tiny):
    response = client.responses.create(
        model=tiny.name, input="hi", max_output_tokens=2, reasoning={"effort": "low"}, user="u-1", service_tier="flex"
    )
    assert response.reasoning.effort == "low" and response.user == "u-1"
    assert response.service_tier == "default"  # the one tier llmp has, as OpenAI reports the tier used
    assert response.temperature == 1.0 and response.top_p == 1.0  # the values used: the defaults where unset
    assert response.top_logprobs == 0 and response.max_tool_calls is None
    greedy = client.responses.create(model=tiny.name, input="hi", max_output_tokens=2, temperature=0, top_p=0.5)
    assert greedy.temperature == 0 and greedy.top_p == 0.5 and greedy.reasoning.effort is None


def test_input_items_list_an_assistants_text_as_output_text(store, tiny):
    items = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "go"},
    ]
    response = store.responses.create(model=tiny.name, input=items, max_output_tokens=2)
    listed = store.responses.input_items.list(response.id, order="asc").data
    assert [item.content[0].type for item in listed] == ["input_text", "output_text", "input_text"]


def test_a_function_call_output_of_text_parts_is_their_text(client, tiny):
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}

    def input_tokens(output: object) -> int:
        items = [
            {"role": "user", "content": "hi"},
            call,
            {"type": "function_call_output", "call_id": "c1", "output": output},
        ]
        return client.responses.create(model=tiny.name, input=items, max_output_tokens=1).usage.input_tokens

    parts = [{"type": "input_text", "text": "sunny"}, {"type": "input_text", "text": "warm"}]
    joined = input_tokens("sunny\nwarm")
    assert input_tokens(parts) == joined != input_tokens("x")  # joined as chat joins a tool message's parts


def test_bad_input_shapes_are_named(http, tiny):
    body = {"model": tiny.name, "max_output_tokens": 2}
    bad = http.post("/v1/responses", json={**body, "input": [{"role": "user", "content": 5}]})
    assert_error(bad, 400, param="input", contains="input[0].content must be a string or a list")
    bad = http.post("/v1/responses", json={**body, "input": [{"role": "user", "content": ["hi"]}]})
    assert_error(bad, 400, param="input", contains="input[0].content")
    output = [{"type": "function_call_output", "call_id": "c", "output": {"text": "x"}}]
    assert_error(
        http.post("/v1/responses", json={**body, "input": output}), 400, param="input", contains="input[0].output"
    )
    bad = http.post("/v1/responses", json={**body, "input": "hi", "text": {"format": "json"}})
    assert_error(bad, 400, param="text", contains="text.format must be an object")


def _split_parser(site) -> dict[str, str]:
    """A tool parser plugin whose calls are spans of the text: its first 4 characters are content, the next
    4 the arguments of a call to f, the 4 after those of g, the rest of h (each once the text reaches it)."""
    return plugin_site(
        site,
        "llmp_test_split_parser",
        textwrap.dedent(
            """
            from llmp import hookimpl
            from llmp.api import ParsedToolCall, ToolCallParse, ToolParserSpec


            class SplitParser:
                keep_special_tokens = False

                def __init__(self, tokenizer=None):
                    pass

                def parse(self, text, *, final, tools=()):
                    spans = [("f", text[4:8]), ("g", text[8:12]), ("h", text[12:])]
                    reached = [span for i, span in enumerate(spans) if len(text) > 4 + 4 * i]
                    calls = [ParsedToolCall(name, args) for name, args in reached]
                    return ToolCallParse(text[:4], calls)


            @hookimpl
            def llmp_register_tool_parsers():
                yield ToolParserSpec(name="split", impl="llmp_test_split_parser:SplitParser", description="spans")
            """
        ),
        name="test-split-parser",
    )


@pytest.fixture(scope="module")
def tools_client(tiny, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    env = _split_parser(tmp_path_factory.mktemp("split-parser-site"))
    with serving(tiny.path, "--tool-call-parser", "split", "--enable-auto-tool-choice", env=env) as live:
        with openai.OpenAI(base_url=live.api_url, api_key="x", max_retries=0, timeout=60) as sdk:
            yield sdk


TOOLS = [{"type": "function", "name": name, "parameters": {"type": "object"}} for name in "fgh"]


def test_streamed_items_are_done_one_at_a_time(tools_client, tiny):
    """OpenAI streams items one at a time: each item's done events before the next item is added, the
    text before a call done once the parser has moved past it."""
    ask = {"model": tiny.name, "input": "hi", "tools": TOOLS, "max_output_tokens": 30, **GREEDY}
    events = list(tools_client.responses.create(stream=True, **ask))
    steps: list[tuple[str, int | None]] = []
    for event in events:  # runs of deltas as one step
        step = (event.type, getattr(event, "output_index", None))
        if not (steps and step == steps[-1] and event.type.endswith(".delta")):
            steps.append(step)
    message = [
        ("response.output_item.added", 0),
        ("response.content_part.added", 0),
        ("response.output_text.delta", 0),
        ("response.output_text.done", 0),
        ("response.content_part.done", 0),
        ("response.output_item.done", 0),
    ]
    calls = [
        step
        for index in (1, 2, 3)
        for step in (
            ("response.output_item.added", index),
            ("response.function_call_arguments.delta", index),
            ("response.function_call_arguments.done", index),
            ("response.output_item.done", index),
        )
    ]
    ends = [("response.created", None), ("response.in_progress", None)], [("response.incomplete", None)]
    assert steps == ends[0] + message + calls + ends[1]
    final = events[-1].response.output
    assert [item.type for item in final] == ["message", "function_call", "function_call", "function_call"]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item.model_dump() for item in done[:-1]] == [item.model_dump() for item in final[:-1]]
    whole = tools_client.responses.create(**ask).output
    assert [(i.type, getattr(i, "arguments", None)) for i in whole] == [
        (i.type, getattr(i, "arguments", None)) for i in final
    ]


def test_max_tool_calls_caps_the_calls(tools_client, tiny):
    ask = {"model": tiny.name, "input": "hi", "tools": TOOLS, "max_output_tokens": 30, **GREEDY}
    response = tools_client.responses.create(max_tool_calls=2, **ask)
    assert [item.type for item in response.output] == ["message", "function_call", "function_call"]
    assert [item.name for item in response.output[1:]] == ["f", "g"] and response.max_tool_calls == 2
    events = list(tools_client.responses.create(max_tool_calls=1, stream=True, **ask))
    assert [item.type for item in events[-1].response.output] == ["message", "function_call"]
    with pytest.raises(openai.BadRequestError, match="max_tool_calls"):
        tools_client.responses.create(max_tool_calls=0, **ask)


def test_a_calls_last_arguments_come_before_its_done_events_when_text_follows_in_one_piece():
    """One feed may end a call and write text after it: the call's arguments delta goes first, then
    the call is done (with its whole arguments), then the new message item."""
    from llmp_frontend_openai.responses import OutputItems

    from llmp.api import ParsedToolCall, ToolCallParse
    from llmp.frontend import OutputPlan

    class Brackets:  # "text[arguments]text": one call of f
        keep_special_tokens = False

        def parse(self, text, *, final, tools=()):
            start = text.find("[")
            if start < 0:
                return ToolCallParse(text, [])
            end = text.find("]", start)
            arguments = text[start + 1 : end if end >= 0 else len(text)]
            return ToolCallParse(text[:start] + (text[end + 1 :] if end >= 0 else ""), [ParsedToolCall("f", arguments)])

    items = OutputItems(OutputPlan(tool_parser=Brackets()))
    full = 'Sure.[{"a": 1}] Done.'
    events = [*items.feed(full[: full.index("1}")], final=False), *items.feed(full, final=True), *items.close()]
    kinds = [(kind, body.get("output_index")) for kind, body in events]
    done = next(body for kind, body in events if kind == "response.function_call_arguments.done")
    assert done["arguments"] == '{"a": 1}', events
    last_delta = max(i for i, (kind, _) in enumerate(kinds) if kind == "response.function_call_arguments.delta")
    assert (
        last_delta
        < kinds.index(("response.function_call_arguments.done", 1))
        < kinds.index(("response.output_item.added", 2))
    ), kinds
