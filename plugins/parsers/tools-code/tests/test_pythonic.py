"""The ``pythonic`` parser on recorded-style outputs (shapes from Llama 3.2/4 and vLLM's tests), whole and streamed."""

from __future__ import annotations

import json

import pytest
from llmp_parsers_tools_code.pythonic import PythonicToolParser

from llmp.testing import assert_streams_agree

PARSER = PythonicToolParser(None)

MORE_TYPES = (
    "register_user(name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, "
    "role=None, passed_test=True, aliases=['John', 'Johnny'])"
)
MORE_TYPES_ARGS = {
    "name": "John Doe",
    "age": 37,
    "address": {"city": "San Francisco", "state": "CA"},
    "role": None,
    "passed_test": True,
    "aliases": ["John", "Johnny"],
}

# id, completion, content, [(name, arguments as a dict)]
CASES = [
    (
        "single",
        "[get_weather(city='San Francisco', metric='celsius')]",
        "",
        [("get_weather", {"city": "San Francisco", "metric": "celsius"})],
    ),
    (
        "double_quotes_and_spaces",
        '[get_weather(city = "Paris", unit="c" )]',
        "",
        [("get_weather", {"city": "Paris", "unit": "c"})],
    ),
    (
        "several",
        f"[get_weather(city='San Francisco', metric='celsius'), {MORE_TYPES}]",
        "",
        [("get_weather", {"city": "San Francisco", "metric": "celsius"}), ("register_user", MORE_TYPES_ARGS)],
    ),
    (
        "several_llama4_newlines",
        '[\n  get_time(tz="Europe/Paris"),\n  get_time(tz="Asia/Tokyo")\n]',
        "",
        [("get_time", {"tz": "Europe/Paris"}), ("get_time", {"tz": "Asia/Tokyo"})],
    ),
    (
        "nested",
        (
            "[search(q=\"f(x), g(y)]\", filters={'tags': ['a', \"b's\"], 'range': {'min': -1.5, 'max': 1e3}}, "
            "opts=[{'k': None}, {'k': (1, 2)}])]"
        ),
        "",
        [
            (
                "search",
                {
                    "q": "f(x), g(y)]",
                    "filters": {"tags": ["a", "b's"], "range": {"min": -1.5, "max": 1000.0}},
                    "opts": [{"k": None}, {"k": [1, 2]}],
                },
            )
        ],
    ),
    (
        "escapes",
        r"""[get_weather(city='Martha\'s Vineyard', metric='\"cool units\"', path='C:\\tmp\n')]""",
        "",
        [("get_weather", {"city": "Martha's Vineyard", "metric": '"cool units"', "path": "C:\\tmp\n"})],
    ),
    (
        "unicode",
        "[translate(text='Café – 東京 🙂', target=\"ja\")]",
        "",
        [("translate", {"text": "Café – 東京 🙂", "target": "ja"})],
    ),
    ("no_arguments", "[get_current_time()]", "", [("get_current_time", {})]),
    (
        "empty_containers",
        "[do_something_cool(additional_data={}, steps=[])]",
        "",
        [("do_something_cool", {"additional_data": {}, "steps": []})],
    ),
    (
        "trailing_commas_and_json_names",
        "[f(a=true, b=null, c=[1, 2,],), g(x=false),]",
        "",
        [("f", {"a": True, "b": None, "c": [1, 2]}), ("g", {"x": False})],
    ),
    ("leading_whitespace", "\n [ping(host='10.0.0.1')]\n", "", [("ping", {"host": "10.0.0.1"})]),
    ("no_call", "How can I help you today?", "How can I help you today?", []),
    ("list_of_numbers_is_content", "[1, 2, 3] are the first numbers.", "[1, 2, 3] are the first numbers.", []),
    (
        "markdown_link_is_content",
        "[the docs](https://example.com) say so",
        "[the docs](https://example.com) say so",
        [],
    ),
    ("text_before_list_is_content", "Sure! [get_weather(city='Paris')]", "Sure! [get_weather(city='Paris')]", []),
    ("lone_bracket_is_content", "[", "[", []),
    (
        "cut_in_string",
        "[get_weather(city='San Francisco', metric='cel",
        "",
        [("get_weather", {"city": "San Francisco", "metric": "cel"})],
    ),
    (
        "cut_in_nested_value",
        "[search(q='x', filters={'tags': ['a', 'b",
        "",
        [("search", {"q": "x", "filters": {"tags": ["a", "b"]}})],
    ),
    (
        "cut_after_equals",
        "[get_weather(city='Paris'), get_time(tz=",
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    ("cut_in_dict_key", "[search(filters={'tag", "", [("search", {})]),
    ("cut_in_number", "[set_volume(level=4", "", [("set_volume", {"level": 4})]),
    ("cut_after_escape", "[say(text='a\\", "", [("say", {"text": "a"})]),
    ("positional_argument_ends_the_list", "[f(1, x=2), g()]", "", [("f", {})]),
    ("expression_ends_the_call", "[f(a=1, b=2 + 3, c=4)]", "", [("f", {"a": 1})]),
    ("text_after_the_list_is_ignored", "[f(a=1)] and that is all", "", [("f", {"a": 1})]),
    ("set_is_not_a_value", "[f(a={1, 2})]", "", [("f", {})]),
    ("infinity_is_not_a_value", "[calc(x=1e999)]", "", [("calc", {})]),
]


@pytest.mark.parametrize(("text", "content", "calls"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_recorded_outputs(text: str, content: str, calls: list[tuple[str, dict]]) -> None:
    whole = PARSER.parse(text, final=True)
    assert whole.content == content
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == calls
    # the arguments text is what json.dumps writes, so clients see the usual spacing
    assert [c.arguments for c in whole.calls] == [json.dumps(args, ensure_ascii=False) for _, args in calls]
    message = assert_streams_agree(text, tool_parser=PARSER)
    assert message.content == content
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == calls


def test_prefixes_report_only_what_cannot_change() -> None:
    def parse(text: str) -> tuple[str, list[tuple[str, str]]]:
        result = PARSER.parse(text, final=False)
        return result.content, [(c.name, c.arguments) for c in result.calls]

    assert parse("") == ("", [])
    assert parse("  ") == ("", [])
    assert parse("[") == ("", [])
    assert parse("[get_wea") == ("", [])
    assert parse("[get_weather ") == ("", [])
    assert parse("[get_weather(") == ("", [("get_weather", "{")])
    assert parse("[get_weather(city='Paris'") == ("", [("get_weather", "{")])  # 'Paris' 'ian' is one string
    assert parse("[get_weather(city='Paris',") == ("", [("get_weather", '{"city": "Paris"')])
    assert parse("[get_weather(city='Paris', n=1") == ("", [("get_weather", '{"city": "Paris"')])
    assert parse("[get_weather(city='Paris', n=1)") == ("", [("get_weather", '{"city": "Paris", "n": 1}')])
    assert parse("[get_weather(city='Paris', n=1), get_t") == ("", [("get_weather", '{"city": "Paris", "n": 1}')])
    assert parse("[1") == ("[1", [])
    assert parse("Hi [") == ("Hi [", [])


def test_final_closes_a_cut_off_call_as_streamed() -> None:
    text = "[get_weather(city='Paris', unit='cel"
    streamed = PARSER.parse(text, final=False).calls[0].arguments
    final = PARSER.parse(text, final=True).calls[0].arguments
    assert streamed == '{"city": "Paris"'
    assert final == '{"city": "Paris", "unit": "cel"}'
    assert final.startswith(streamed)


def test_every_split_of_a_long_nested_call() -> None:
    text = (
        "[run_code(language='python', code='def f(x):\\n    return {\"a\": [x, (1, 2)]}\\nprint(f(\\'y\\'))', "
        "timeout=30.5, env={'PATH': '/usr/bin', 'DEBUG': None}), notify(to=['ops@example.com'], urgent=False)]"
    )
    message = assert_streams_agree(text, tool_parser=PARSER)
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == [
        (
            "run_code",
            {
                "language": "python",
                "code": "def f(x):\n    return {\"a\": [x, (1, 2)]}\nprint(f('y'))",
                "timeout": 30.5,
                "env": {"PATH": "/usr/bin", "DEBUG": None},
            },
        ),
        ("notify", {"to": ["ops@example.com"], "urgent": False}),
    ]
