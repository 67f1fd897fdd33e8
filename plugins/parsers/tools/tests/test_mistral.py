"""``mistral``: recorded Mistral outputs in both tokenizer generations, whole and streamed."""

from __future__ import annotations

import pytest
from llmp_parsers_tools.mistral import MistralToolParser
from parsers_tools_support import Case, assert_grows, check_case

WEATHER = '{"city": "San Francisco", "state": "CA", "unit": "celsius"}'

PRE_V11 = [
    Case(
        "single", '[TOOL_CALLS][{"name": "add", "arguments":{"a": 3.5, "b": 4}}]', "", [("add", '{"a": 3.5, "b": 4}')]
    ),
    Case(
        "spaced",  # raw arguments: the model's spacing is kept
        '[TOOL_CALLS]  [ {"name":"add" , "arguments" : {"a": 3, "b": 4} } ]',
        "",
        [("add", '{"a": 3, "b": 4}')],
    ),
    Case(
        "several",
        f'[TOOL_CALLS] [{{"name": "add", "arguments": {{"a": 3.5, "b": 4}}}}, '
        f'{{"name": "get_current_weather", "arguments":{WEATHER}}}]',
        "",
        [("add", '{"a": 3.5, "b": 4}'), ("get_current_weather", WEATHER)],
    ),
    Case(
        "arguments_before_name_and_name_in_arguments",
        '[TOOL_CALLS] [{"arguments":{"name": "John Doe"}, "name": "get_age"}]',
        "",
        [("get_age", '{"name": "John Doe"}')],
    ),
    Case(
        "text_before",
        'Hello[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1, "b": 2}}]',
        "Hello",
        [("add", '{"a": 1, "b": 2}')],
    ),
    Case(
        "trailing_data_after_json",  # kept as content, as vLLM streams it
        f'[TOOL_CALLS] [{{"name": "get_current_weather", "arguments":{WEATHER}}}]\nextra trailing data',
        "\nextra trailing data",
        [("get_current_weather", WEATHER)],
    ),
    Case(
        "nested",
        '[TOOL_CALLS] [{"name": "run", "arguments": {"cmd": "echo \\"[TOOL_CALLS]\\" ]}", '
        '"env": [{"k": "A", "v": "{1}"}], "flags": {"x": [true]}}}]',
        "",
        [("run", '{"cmd": "echo \\"[TOOL_CALLS]\\" ]}", "env": [{"k": "A", "v": "{1}"}], "flags": {"x": [true]}}')],
    ),
    Case(
        "cut_off_by_max_tokens",
        '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 3, "b',
        "",
        [("add", '{"a": 3, "b')],
        complete=False,
    ),
    Case("empty_arguments", '[TOOL_CALLS] [{"name": "get_time", "arguments": {}}]', "", [("get_time", "{}")]),
    Case("missing_arguments", '[TOOL_CALLS] [{"name": "get_time"}]', "", [("get_time", "{}")]),
    Case("not_json_is_content", "[TOOL_CALLS] not json at all", "not json at all"),
]

V11 = [
    Case(
        "single",
        '[TOOL_CALLS]add_this_and_that[ARGS]{"a": 3.5, "b": 4}',
        "",
        [("add_this_and_that", '{"a": 3.5, "b": 4}')],
    ),
    Case(
        "without_args_token",  # [ARGS] skipped by the detokenizer
        f"[TOOL_CALLS]get_current_weather{WEATHER}",
        "",
        [("get_current_weather", WEATHER)],
    ),
    Case(
        "several",
        '[TOOL_CALLS]add[ARGS]{"a": 3.5, "b": 4}[TOOL_CALLS]multiply[ARGS]{"a": 3, "b": 6}',
        "",
        [("add", '{"a": 3.5, "b": 4}'), ("multiply", '{"a": 3, "b": 6}')],
    ),
    Case(
        "complex_with_text_before",  # vLLM's "complex" case: braces in the content and the argument
        'hi{hi[TOOL_CALLS]bash[ARGS]{"command": "print(\\"hello world!\\")\\nre.compile(r\'{}\')"}',
        "hi{hi",
        [("bash", '{"command": "print(\\"hello world!\\")\\nre.compile(r\'{}\')"}')],
    ),
    Case(
        "markers_inside_strings",
        '[TOOL_CALLS]note[ARGS]{"text": "use [TOOL_CALLS]x[ARGS]{} here", "list": [{"a": []}]}',
        "",
        [("note", '{"text": "use [TOOL_CALLS]x[ARGS]{} here", "list": [{"a": []}]}')],
    ),
    Case(
        "unicode",
        'D\'accord 🙂[TOOL_CALLS]traduire[ARGS]{"texte": "Grüß Gott — 東京", "vers": "日本語"}',
        "D'accord 🙂",
        [("traduire", '{"texte": "Grüß Gott — 東京", "vers": "日本語"}')],
    ),
    Case(
        "cut_off_by_max_tokens",
        '[TOOL_CALLS]bash[ARGS]{"command": "ls -la /tm',
        "",
        [("bash", '{"command": "ls -la /tm')],
        complete=False,
    ),
    Case("empty_arguments", "[TOOL_CALLS]get_time[ARGS]{}", "", [("get_time", "{}")]),
    Case(
        "call_id",
        '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}',
        "",
        [("get_weather", '{"city": "Paris"}')],
    ),
    Case("no_call", "The answer is [42] and [TOOL] is not a marker.", "The answer is [42] and [TOOL] is not a marker."),
    Case("name_without_arguments_is_content", "[TOOL_CALLS]get_time", "get_time"),
    Case(
        "text_after",
        '[TOOL_CALLS]add[ARGS]{"a": 1}\nDone.',
        "\nDone.",
        [("add", '{"a": 1}')],
    ),
]


@pytest.mark.parametrize("case", PRE_V11, ids=[c.id for c in PRE_V11])
def test_recorded_outputs_pre_v11(case: Case) -> None:
    check_case(MistralToolParser(None), case)


@pytest.mark.parametrize("case", V11, ids=[c.id for c in V11])
def test_recorded_outputs_v11(case: Case) -> None:
    check_case(MistralToolParser(None), case)


@pytest.mark.parametrize("case", PRE_V11 + V11, ids=[f"pre_v11-{c.id}" for c in PRE_V11] + [f"v11-{c.id}" for c in V11])
def test_never_takes_back_what_was_streamed(case: Case) -> None:
    assert_grows(MistralToolParser(None), case.text)


def test_a_v11_call_appears_when_its_name_ends() -> None:
    parser = MistralToolParser(None)
    assert parser.parse("Hi [TOOL_C", final=False).content == "Hi "
    assert parser.parse("[TOOL_CALLS]get_wea", final=False).calls == []
    assert parser.parse("[TOOL_CALLS]get_weather[AR", final=False).calls == []
    started = parser.parse("[TOOL_CALLS]get_weather[ARGS]", final=False)
    assert [(c.name, c.arguments) for c in started.calls] == [("get_weather", "")]
