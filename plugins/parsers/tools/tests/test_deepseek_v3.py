"""``deepseek_v3``: recorded DeepSeek-V3 outputs, whole and streamed."""

from __future__ import annotations

import pytest
from llmp_parsers_tools.deepseek import DeepSeekV3ToolParser
from parsers_tools_support import Case, assert_grows, check_case

BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def call(name: str, arguments: str) -> str:
    return f"{CALL}function{SEP}{name}\n```json\n{arguments}\n```{CALL_END}"


CASES = [
    Case(
        "single",
        BEGIN + call("get_weather", '{"location": "Beijing"}') + END,
        "",
        [("get_weather", '{"location": "Beijing"}')],
    ),
    Case(
        "several",
        BEGIN
        + call("get_weather", '{"location": "Beijing"}')
        + "\n"
        + call("get_weather", '{"location": "Hangzhou", "unit": "celsius"}')
        + END,
        "",
        [("get_weather", '{"location": "Beijing"}'), ("get_weather", '{"location": "Hangzhou", "unit": "celsius"}')],
    ),
    Case(
        "text_before",
        "Let me check the weather for you." + BEGIN + call("get_weather", '{"city": "Paris"}') + END,
        "Let me check the weather for you.",
        [("get_weather", '{"city": "Paris"}')],
    ),
    Case(
        "nested",  # objects in arrays, braces, quotes, escapes, the fence and a marker inside strings
        BEGIN
        + call(
            "run",
            '{"code": "x = {\\"a\\": [1]}\\n```\\n' + CALL_END + '", '
            '"files": [{"p": "C:\\\\a", "n": [1, {"m": null}]}]}',
        )
        + END,
        "",
        [
            (
                "run",
                '{"code": "x = {\\"a\\": [1]}\\n```\\n' + CALL_END + '", '
                '"files": [{"p": "C:\\\\a", "n": [1, {"m": null}]}]}',
            )
        ],
    ),
    Case(
        "unicode",
        "好的，我来查一下。" + BEGIN + call("翻译", '{"text": "Grüß Gott 🙂", "to": "日本語"}') + END,
        "好的，我来查一下。",
        [("翻译", '{"text": "Grüß Gott 🙂", "to": "日本語"}')],
    ),
    Case(
        "no_call",
        "The weather in Beijing is sunny, 25°C. <｜tool is not a marker.",
        "The weather in Beijing is sunny, 25°C. <｜tool is not a marker.",
    ),
    Case(
        "cut_off_by_max_tokens",
        BEGIN + f'{CALL}function{SEP}get_weather\n```json\n{{"location": "Bei',
        "",
        [("get_weather", '{"location": "Bei')],
        complete=False,
    ),
    Case("empty_arguments", BEGIN + call("get_time", "{}") + END, "", [("get_time", "{}")]),
    Case(
        "text_after",
        BEGIN + call("get_time", "{}") + END + "\nDone.",
        "\nDone.",
        [("get_time", "{}")],
    ),
    Case(
        "cut_off_after_name",
        BEGIN + f"{CALL}function{SEP}get_time\n```js",
        "",
        [("get_time", "")],
        complete=False,
    ),
    Case(
        "block_without_separator_is_content",
        "Hm." + BEGIN + f"{CALL}get_time{CALL_END}" + END,
        f"Hm.{CALL}get_time{CALL_END}",
    ),
    Case(
        "broken_json_stops_at_the_fence",
        BEGIN + call("f", '{"a": 1') + call("g", "{}") + END,
        "",
        [("f", '{"a": 1'), ("g", "{}")],
        complete=False,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_recorded_outputs(case: Case) -> None:
    check_case(DeepSeekV3ToolParser(None), case)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_never_takes_back_what_was_streamed(case: Case) -> None:
    assert_grows(DeepSeekV3ToolParser(None), case.text)


def test_a_call_appears_when_its_name_line_ends() -> None:
    parser = DeepSeekV3ToolParser(None)
    assert parser.parse("Ok<｜tool▁ca", final=False).content == "Ok"
    assert parser.parse(f"{BEGIN}{CALL}function{SEP}get_wea", final=False).calls == []
    started = parser.parse(f"{BEGIN}{CALL}function{SEP}get_weather\n", final=False)
    assert [(c.name, c.arguments) for c in started.calls] == [("get_weather", "")]
