"""``/v1/messages`` on servers with a ``--tool-call-parser`` (forced tool calls) and a ``--reasoning-parser``
(thinking blocks), through the ``anthropic`` SDK.

This package's tests run without the parser distributions: the servers load a one-module plugin
installed for the test, with a tool parser that finds no calls (forced calls need some parser) and a
reasoning parser for which the prompt opens the reasoning and ``</think>`` ends it (the tiny random
model never writes it: its whole reply is thinking).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest

from llmp.testing import plugin_site, serving

GREEDY = {"extra_body": {"temperature": 0}}
FOX = [{"role": "user", "content": "The quick brown fox"}]
WEATHER = {
    "name": "get_weather",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
PLUGIN = textwrap.dedent(
    """
    from llmp import hookimpl
    from llmp.api import ReasoningParse, ReasoningParserSpec, ToolCallParse, ToolParserSpec


    class PlainParser:
        keep_special_tokens = False

        def __init__(self, tokenizer=None):
            pass

        def parse(self, text, *, final, tools=()):
            return ToolCallParse(text, [])


    class ThinkParser:
        keep_special_tokens = False

        def __init__(self, tokenizer):
            self.end_token_ids = tokenizer.encode("</think>", add_special_tokens=False)

        def parse(self, text, *, final, in_reasoning=None):
            reasoning, end, content = text.partition("</think>")
            return ReasoningParse(reasoning, content if end else "")

        def prompt_state(self, prompt_token_ids):
            return True


    @hookimpl
    def llmp_register_tool_parsers():
        yield ToolParserSpec(name="plain", impl="llmp_test_anthropic_parsers:PlainParser", description="no calls")


    @hookimpl
    def llmp_register_reasoning_parsers():
        yield ReasoningParserSpec(
            name="think", impl="llmp_test_anthropic_parsers:ThinkParser", description="all is thinking"
        )
    """
)


@pytest.fixture(scope="module")
def parser_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return plugin_site(tmp_path_factory.mktemp("parser-site"), "llmp_test_anthropic_parsers", PLUGIN)


def _client(model: Path, env: dict[str, str], *args: str) -> Iterator[anthropic.Anthropic]:
    with serving(model, "--dtype", "float32", "--frontend", "anthropic", *args, env=env) as live:
        with anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0, timeout=60) as sdk:
            yield sdk
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


@pytest.fixture(scope="module")
def tools_client(model_dir: Path, parser_env: dict[str, str]) -> Iterator[anthropic.Anthropic]:
    yield from _client(model_dir, parser_env, "--tool-call-parser", "plain")


@pytest.fixture(scope="module")
def thinking_client(model_dir: Path, parser_env: dict[str, str]) -> Iterator[anthropic.Anthropic]:
    yield from _client(model_dir, parser_env, "--reasoning-parser", "think")


@pytest.fixture(scope="module")
def name(model_dir: Path) -> str:
    return str(model_dir)


@pytest.mark.parametrize(
    "choice", [{"type": "tool", "name": "get_weather"}, {"type": "any", "disable_parallel_tool_use": True}]
)
def test_stop_sequence_inside_a_forced_call(tools_client, name, choice):
    """A stop string that cuts a tool call short wins: ``stop_sequence``, and the text generated is a
    text block, not a call with arguments the model did not finish."""
    ask = {"model": name, "messages": FOX, "max_tokens": 80, "tools": [WEATHER], "tool_choice": choice, **GREEDY}
    called = tools_client.messages.create(**ask)
    assert called.stop_reason == "tool_use" and [b.type for b in called.content] == ["tool_use"], called
    assert set(called.content[0].input) == {"city"}
    cut = tools_client.messages.create(**ask, stop_sequences=["city"])
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", "city"), cut
    assert [b.type for b in cut.content] == ["text"], cut
    assert cut.content[0].text.replace(" ", "").endswith('{"'), cut  # the arguments' start, cut before "city"
    with tools_client.messages.stream(**ask, stop_sequences=["city"]) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "city")


def test_thinking_display_omitted(thinking_client, name):
    ask = {"model": name, "messages": FOX, "max_tokens": 8, **GREEDY}
    shown = thinking_client.messages.create(**ask)
    assert [b.type for b in shown.content] == ["thinking"] and shown.content[0].thinking, shown
    assert shown.content[0].signature
    thinking = {"type": "adaptive", "display": "omitted"}  # enabled needs more room than the tiny model has
    omitted = thinking_client.messages.create(**ask, thinking=thinking)
    assert [b.type for b in omitted.content] == ["thinking"], omitted
    assert omitted.content[0].thinking == "" and omitted.content[0].signature
    events = list(thinking_client.messages.create(**ask, thinking=thinking, stream=True))
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert deltas == ["signature_delta"], deltas  # no thinking text
    start = next(e for e in events if e.type == "content_block_start")
    assert start.content_block.type == "thinking"


def test_output_format_applies_after_the_thinking(thinking_client, name):
    """The constraint waits for the end of the reasoning (which the tiny model never writes): the
    thinking is free text, not held to the schema."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    message = thinking_client.messages.create(
        model=name,
        messages=FOX,
        max_tokens=12,
        output_config={"format": {"type": "json_schema", "schema": schema}},
        **GREEDY,
    )
    text = message.content[0].thinking
    assert message.content[0].type == "thinking" and text and not text.lstrip().startswith("{"), message
    with pytest.raises(ValueError):
        json.loads(text)
