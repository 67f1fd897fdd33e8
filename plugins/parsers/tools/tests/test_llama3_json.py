"""``llama3_json``: recorded Llama 3.1 / 3.2 JSON tool-call outputs, whole and streamed."""

from __future__ import annotations

import pytest
from llmp_parsers_tools.llama import Llama3JsonToolParser
from parsers_tools_support import Case, assert_grows, check_case

CASES = [
    Case(
        "single",
        '{"name": "get_weather", "parameters": {"city": "San Francisco", "metric": "celsius"}}',
        "",
        [("get_weather", '{"city": "San Francisco", "metric": "celsius"}')],
    ),
    Case(
        "python_tag",
        '<|python_tag|>{"name": "searchCVE", "parameters": {"cve_id": "CVE-2024-1234"}}',
        "",
        [("searchCVE", '{"cve_id": "CVE-2024-1234"}')],
    ),
    Case(
        "several",
        '{"name": "get_weather", "parameters": {"city": "San Francisco"}}; '
        '{"name": "get_time", "parameters": {"timezone": "America/Los_Angeles"}}',
        "",
        [("get_weather", '{"city": "San Francisco"}'), ("get_time", '{"timezone": "America/Los_Angeles"}')],
    ),
    Case(
        "several_after_python_tag_with_arguments_key",
        '<|python_tag|>{"name": "add", "arguments": {"a": 1, "b": 2}};{"name": "mul", "arguments": {"a": 3}}',
        "",
        [("add", '{"a": 1, "b": 2}'), ("mul", '{"a": 3}')],
    ),
    Case(
        "nested",  # objects in arrays, braces, ';', quotes, escapes and the tag inside strings
        '{"name": "run", "parameters": {"code": "if (x) { y(); } // \\"q\\" <|python_tag|>", '
        '"items": [{"id": 1, "tags": ["a;b", "{c}"]}, {"id": 2, "path": "C:\\\\dir"}], "n": null}}',
        "",
        [
            (
                "run",
                (
                    '{"code": "if (x) { y(); } // \\"q\\" <|python_tag|>", '
                    '"items": [{"id": 1, "tags": ["a;b", "{c}"]}, {"id": 2, "path": "C:\\\\dir"}], "n": null}'
                ),
            )
        ],
    ),
    Case(
        "unicode",
        '{"name": "translate", "parameters": {"text": "Grüß Gott — 東京 🙂", "to": "日本語"}}',
        "",
        [("translate", '{"text": "Grüß Gott — 東京 🙂", "to": "日本語"}')],
    ),
    Case("no_call", "Hello! How can I help you today? {not a call}", "Hello! How can I help you today? {not a call}"),
    Case(
        "text_before_json_is_all_content",  # calls only when the message starts with one, as vLLM streams
        'Here you go: {"name": "get_weather", "parameters": {"city": "Paris"}}',
        'Here you go: {"name": "get_weather", "parameters": {"city": "Paris"}}',
    ),
    Case(
        "cut_off_by_max_tokens",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "San Fr',
        "",
        [("get_weather", '{"city": "San Fr')],
        complete=False,
    ),
    Case(
        "empty_parameters",
        '{"name": "get_current_time", "parameters": {}}',
        "",
        [("get_current_time", "{}")],
    ),
    Case(
        "parameters_before_name",
        '{"parameters": {"name": "John Doe"}, "name": "get_age"}',
        "",
        [("get_age", '{"name": "John Doe"}')],
    ),
    Case(
        "json_answer_is_content",
        '{"answer": 42, "name": "not a call"}',
        '{"answer": 42, "name": "not a call"}',
    ),
    Case(
        "builtin_tool_call_is_content_without_the_tag",
        '<|python_tag|>brave_search.call(query="weather in Paris")',
        'brave_search.call(query="weather in Paris")',
    ),
    Case(
        "trailing_separator_dropped",
        '{"name": "a", "parameters": {"x": 1}};\n',
        "",
        [("a", '{"x": 1}')],
    ),
    Case(
        "text_after",
        '{"name": "a", "parameters": {"x": 1}}\n\nI called a.',
        "\n\nI called a.",
        [("a", '{"x": 1}')],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_recorded_outputs(case: Case) -> None:
    check_case(Llama3JsonToolParser(None), case)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_never_takes_back_what_was_streamed(case: Case) -> None:
    assert_grows(Llama3JsonToolParser(None), case.text)


def test_plain_text_streams_at_once_and_a_possible_tag_is_held() -> None:
    parser = Llama3JsonToolParser(None)
    assert parser.parse("Hel", final=False).content == "Hel"
    assert parser.parse("<|pyth", final=False).content == ""
    assert parser.parse("<|pyth", final=True).content == "<|pyth"
    assert parser.parse("<|pyx", final=False).content == "<|pyx"
    assert parser.parse("  ", final=True).content == "  "
