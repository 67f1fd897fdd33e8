"""``hermes``: recorded Hermes 2 Pro / Qwen2.5 / Qwen3 outputs, whole and streamed."""

from __future__ import annotations

import pytest
from llmp_parsers_tools.hermes import HermesToolParser
from parsers_tools_support import Case, assert_grows, check_case

WEATHER = '{"city": "Dallas", "state": "TX", "unit": "fahrenheit"}'

CASES = [
    Case(
        "single",
        f'<tool_call>\n{{"name": "get_current_weather", "arguments": {WEATHER}}}\n</tool_call>',
        "",
        [("get_current_weather", WEATHER)],
    ),
    Case(
        "several",  # Qwen2.5 / Qwen3: one block per call, a newline between
        '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": "San Francisco, CA, USA"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_temperature_date", "arguments": '
        '{"location": "San Francisco, CA, USA", "date": "2024-10-01"}}\n</tool_call>',
        "",
        [
            ("get_current_temperature", '{"location": "San Francisco, CA, USA"}'),
            ("get_temperature_date", '{"location": "San Francisco, CA, USA", "date": "2024-10-01"}'),
        ],
    ),
    Case(
        "text_before",
        "I'll check the weather for you.\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "I'll check the weather for you.\n\n",
        [("get_weather", '{"city": "Paris"}')],
    ),
    Case(
        "nested",  # objects in arrays, braces, quotes, escapes and both markers inside strings
        '<tool_call>\n{"name": "run", "arguments": {"code": "print(\\"{}\\".format(x))  # </tool_call>", '
        '"files": [{"path": "C:\\\\tmp\\\\a.py", "lines": [1, 2]}, {"path": "<tool_call>"}], '
        '"opts": {"deep": [true, null, -1.5e3]}}}\n</tool_call>',
        "",
        [
            (
                "run",
                (
                    '{"code": "print(\\"{}\\".format(x))  # </tool_call>", '
                    '"files": [{"path": "C:\\\\tmp\\\\a.py", "lines": [1, 2]}, {"path": "<tool_call>"}], '
                    '"opts": {"deep": [true, null, -1.5e3]}}'
                ),
            )
        ],
    ),
    Case(
        "unicode",
        'Voilà ☀️ :\n<tool_call>\n{"name": "translate", "arguments": {"text": "Grüß Gott — 東京 🙂", '
        '"target": "日本語"}}\n</tool_call>',
        "Voilà ☀️ :\n",
        [("translate", '{"text": "Grüß Gott — 東京 🙂", "target": "日本語"}')],
    ),
    Case(
        "no_call",  # "<tool_calls>" starts like the marker but is not it
        "The capital of France is Paris. Wrap calls in <tool_calls> tags; 1 < 2.",
        "The capital of France is Paris. Wrap calls in <tool_calls> tags; 1 < 2.",
    ),
    Case(
        "cut_off_by_max_tokens",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "San Fran',
        "",
        [("get_weather", '{"city": "San Fran')],
        complete=False,
    ),
    Case(
        "empty_arguments",
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        "",
        [("get_time", "{}")],
    ),
    Case(
        "arguments_before_name",  # and "name" inside the arguments
        '<tool_call>\n{"arguments": {"name": "John Doe"}, "name": "get_age"}\n</tool_call>',
        "",
        [("get_age", '{"name": "John Doe"}')],
    ),
    Case(
        "text_after",
        '<tool_call>\n{"name": "send", "arguments": {"to": "bob"}}\n</tool_call>\nI have sent it.',
        "\nI have sent it.",
        [("send", '{"to": "bob"}')],
    ),
    Case(
        "arguments_as_json_string",  # unwrapped: the arguments are the JSON text inside
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>',
        "",
        [("get_weather", '{"city": "Paris"}')],
    ),
    Case(
        "null_arguments",
        '<tool_call>{"name": "get_time", "arguments": null}</tool_call>',
        "",
        [("get_time", "{}")],
    ),
    Case(
        "no_arguments_key",
        '<tool_call>{"name": "get_time"}</tool_call>',
        "",
        [("get_time", "{}")],
    ),
    Case(
        "malformed_block_is_content",
        "Sure.\n<tool_call>\nnot json\n</tool_call>",
        "Sure.\n<tool_call>\nnot json\n</tool_call>",
    ),
    Case(
        "cut_off_before_name_is_content",
        'Sure.\n<tool_call>\n{"na',
        'Sure.\n<tool_call>\n{"na',
    ),
    Case(
        "unterminated_string_keeps_what_was_streamed",
        '<tool_call>{"name": "f", "arguments": {"a": "x}}</tool_call>',
        "",
        [("f", '{"a": "x}}</tool_call>')],
        complete=False,
    ),
    Case(
        "missing_brace_ends_at_closing_tag",
        '<tool_call>{"name": "f", "arguments": {"a": 1</tool_call>\n<tool_call>{"name": "g", "arguments": {}}'
        "</tool_call>",
        "",
        [("f", '{"a": 1'), ("g", "{}")],
        complete=False,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_recorded_outputs(case: Case) -> None:
    check_case(HermesToolParser(None), case)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_never_takes_back_what_was_streamed(case: Case) -> None:
    assert_grows(HermesToolParser(None), case.text)


def test_holds_back_a_possible_marker_and_reports_a_call_once_its_name_is_complete() -> None:
    parser = HermesToolParser(None)
    assert parser.parse("Hi <tool_ca", final=False).content == "Hi "
    assert parser.parse("Hi <tool_ca", final=True).content == "Hi <tool_ca"
    assert parser.parse('Hi <tool_call>{"name": "get_w', final=False).calls == []
    opened = parser.parse('Hi <tool_call>{"name": "get_weather", "arguments": {"ci', final=False)
    assert [(c.name, c.arguments) for c in opened.calls] == [("get_weather", '{"ci')]
    assert opened.content == "Hi "
