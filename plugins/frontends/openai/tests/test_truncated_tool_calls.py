"""A forced tool call cut short by ``max_tokens`` is never dropped: what the model generated reaches
the client, as content (before the call's name is complete, as vLLM returns an array it cannot parse)
or as a partial call (after), the same streamed and not, through the ``openai`` SDK.

``tool_choice`` required and named need some ``--tool-call-parser``; this package's tests run without
the parser distributions, so the server loads a one-line parser plugin installed for the test.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai_frontend_support import TinyLlama

from llmp.testing import LiveServer, plugin_site, serving

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 0, "maximum": 99},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


def _parser_plugin(site: Path) -> dict[str, str]:
    """A real plugin distribution (found through its entry point) with a parser that calls nothing; the
    environment that finds it."""
    return plugin_site(
        site,
        "llmp_test_plain_parser",
        textwrap.dedent(
            """
            from llmp import hookimpl
            from llmp.api import ParsedToolCall, ToolCallParse, ToolParserSpec


            class PlainParser:
                keep_special_tokens = False

                def __init__(self, tokenizer=None):
                    pass

                def parse(self, text, *, final, tools=()):
                    return ToolCallParse(text, [])


            @hookimpl
            def llmp_register_tool_parsers():
                yield ToolParserSpec(name="plain", impl="llmp_test_plain_parser:PlainParser", description="no calls")
            """
        ),
        name="test-plain-parser",
        version="0.1.0",
    )


@pytest.fixture(scope="module")
def tools_server(tiny: TinyLlama, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = _parser_plugin(tmp_path_factory.mktemp("parser-site"))
    with serving(tiny.path, "--tool-call-parser", "plain", env=env) as live:
        yield live


@pytest.fixture(scope="module")
def sdk(tools_server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=tools_server.api_url, api_key="unused", max_retries=0, timeout=60) as client:
        yield client


def _ask(sdk: openai.OpenAI, tiny: TinyLlama, tool_choice, max_tokens: int):
    request = {
        "model": tiny.name,
        "messages": MESSAGES,
        "tools": [WEATHER],
        "tool_choice": tool_choice,
        "max_tokens": max_tokens,
        "temperature": 0,
        "extra_body": {"return_token_ids": True},
    }
    whole = sdk.chat.completions.create(**request).choices[0]
    content, calls, finish = "", [], []
    for chunk in sdk.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for piece in choice.delta.tool_calls or []:
                if piece.function.name is not None:
                    calls.append([piece.function.name, ""])
                calls[piece.index][1] += piece.function.arguments or ""
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    text = tiny.tokenizer.decode(whole.model_extra["token_ids"], skip_special_tokens=True)
    return whole, (content, [tuple(c) for c in calls], finish), text


def _visible(message) -> tuple[str, list[tuple[str, str]]]:
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    return message.content or "", calls


def test_required_cut_short_shows_what_was_generated(sdk, tiny):
    seen = set()
    for max_tokens in (1, 2, 3, 8, 13, 30, 50):  # cut in "[{", in the name, after it, in the arguments
        whole, streamed, text = _ask(sdk, tiny, "required", max_tokens)
        assert whole.finish_reason == "length", whole
        content, calls = _visible(whole.message)
        assert text.strip(), "the model generated something"
        compact = text.replace(" ", "")
        if calls:  # the name is complete: the call carries the arguments so far
            assert [name for name, _ in calls] == ["get_weather"] and content == "", whole.message
            assert compact.startswith('[{"name":"get_weather",'), text
            if calls[0][1]:
                assert '"parameters":' + calls[0][1].replace(" ", "") in compact, (calls, text)
            seen.add("call" if calls[0][1] else "call without arguments yet")
        else:  # cut before the name: the generated text is the content
            assert content == text.strip(), (content, text)
            seen.add("content")
        assert streamed == (content, calls, ["length"]), max_tokens
    assert {"content", "call"} <= seen, seen


@pytest.mark.parametrize("max_tokens", [1, 3, 8])
def test_named_cut_short_is_a_partial_call(sdk, tiny, max_tokens):
    whole, streamed, text = _ask(sdk, tiny, NAMED, max_tokens)
    assert whole.finish_reason == "length", whole
    content, calls = _visible(whole.message)
    assert calls == [("get_weather", text.strip())] and content == "", (whole.message, text)
    assert streamed == (content, calls, ["length"])


def test_a_call_that_fits_is_whole(sdk, tiny):
    whole, streamed, _ = _ask(sdk, tiny, "required", 120)
    assert whole.finish_reason == "tool_calls", whole
    content, calls = _visible(whole.message)
    assert content == "" and calls and all(name == "get_weather" for name, _ in calls)
    assert json.loads(calls[0][1])["city"] is not None
    assert streamed == (content, calls, ["tool_calls"])
