"""The ``qwen3_xml`` parser on recorded-style Qwen3-Coder outputs (shapes from vLLM's tests), whole and streamed."""

from __future__ import annotations

import json

import pytest
from llmp_parsers_tools_code.qwen3_xml import Qwen3XMLToolParser, convert_value

from llmp.testing import assert_streams_agree

PARSER = Qwen3XMLToolParser(None)


def tool(name: str, **properties: dict) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": properties, "required": list(properties)[:1]},
        },
    }


TOOLS = [
    tool(
        "get_current_weather",
        city={"type": "string"},
        state={"type": "string"},
        unit={"type": "string", "enum": ["fahrenheit", "celsius"]},
    ),
    tool("calculate_area", shape={"type": "string"}, dimensions={"type": "object"}, precision={"type": "integer"}),
    tool("write_file", path={"type": "string"}, content={"type": "string"}),
    tool("list_files"),
]


def call(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


DALLAS = call("get_current_weather", ("city", "Dallas"), ("state", "TX"), ("unit", "fahrenheit"))
DALLAS_ARGS = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}
CODE = 'if a < b and "<x>" != c:\n    print(f"{a}\\n<done>")\n'

# id, completion, content, [(name, arguments as a dict)]
CASES = [
    ("single", DALLAS, "", [("get_current_weather", DALLAS_ARGS)]),
    (
        "content_before",
        "Sure! Let me check the weather for you." + DALLAS,
        "Sure! Let me check the weather for you.",
        [("get_current_weather", DALLAS_ARGS)],
    ),
    (
        "content_before_with_newline",
        "Let me check:\n" + DALLAS,
        "Let me check:\n",
        [("get_current_weather", DALLAS_ARGS)],
    ),
    (
        "several",
        DALLAS + "\n" + call("get_current_weather", ("city", "Orlando"), ("state", "FL")),
        "",
        [("get_current_weather", DALLAS_ARGS), ("get_current_weather", {"city": "Orlando", "state": "FL"})],
    ),
    (
        "typed_multiline_object",
        call(
            "calculate_area",
            ("shape", "rectangle"),
            ("dimensions", '{"width": 10, \n "height": [20, {"d": null}]}'),
            ("precision", "2"),
        ),
        "",
        [
            (
                "calculate_area",
                {"shape": "rectangle", "dimensions": {"width": 10, "height": [20, {"d": None}]}, "precision": 2},
            )
        ],
    ),
    (
        "code_with_angle_brackets_and_newlines",
        call("write_file", ("path", "a.py"), ("content", CODE)),
        "",
        [("write_file", {"path": "a.py", "content": CODE})],
    ),
    (
        "quotes_and_escapes",
        call("write_file", ("path", 'C:\\tmp\\"x".txt'), ("content", "it's \\n not a newline")),
        "",
        [("write_file", {"path": 'C:\\tmp\\"x".txt', "content": "it's \\n not a newline"})],
    ),
    (
        "unicode",
        "好的，我来查。" + call("get_current_weather", ("city", "Zürich 東京 🙂"), ("state", "ZH")),
        "好的，我来查。",
        [("get_current_weather", {"city": "Zürich 東京 🙂", "state": "ZH"})],
    ),
    ("no_arguments", "<tool_call>\n<function=list_files>\n</function>\n</tool_call>", "", [("list_files", {})]),
    ("no_call", "This is a test response without any tool calls", "This is a test response without any tool calls", []),
    ("less_than_in_content", "Use a <b>bold</b> tag when x < 3.", "Use a <b>bold</b> tag when x < 3.", []),
    (
        "without_tool_call_wrapper",
        (
            "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
            "<parameter=state>\nTX\n</parameter>\n</function>"
        ),
        "",
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
    ),
    (
        "missing_parameter_end",
        (
            "Checking:\n<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n"
            "<parameter=state>\nTX\n</parameter>\n</function>\n</tool_call>"
        ),
        "Checking:\n",
        [("get_current_weather", {"city": "Dallas", "state": "TX"})],
    ),
    (
        "missing_function_end",
        (
            "<tool_call>\n<function=list_files>\n</tool_call>\n<tool_call>\n<function=write_file>\n"
            "<parameter=path>\nx\n</parameter>\n</tool_call>"
        ),
        "",
        [("list_files", {}), ("write_file", {"path": "x"})],
    ),
    (
        "cut_in_value",
        (
            "<tool_call>\n<function=write_file>\n<parameter=path>\nmain.py\n</parameter>\n"
            "<parameter=content>\nimport os\nprint(os.getcwd())\n</param"
        ),
        "",
        [("write_file", {"path": "main.py", "content": "import os\nprint(os.getcwd())"})],
    ),
    (
        "cut_in_typed_value",
        ("<tool_call>\n<function=calculate_area>\n<parameter=shape>\nsquare\n</parameter>\n<parameter=precision>\n12"),
        "",
        [("calculate_area", {"shape": "square", "precision": 12})],
    ),
    (
        "cut_in_parameter_name",
        ("<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=sta"),
        "",
        [("get_current_weather", {"city": "Dallas"})],
    ),
    ("cut_before_function_end", DALLAS[: DALLAS.index("</function>")], "", [("get_current_weather", DALLAS_ARGS)]),
    (
        "cut_in_function_name_is_content",
        "Let me check.<tool_call>\n<function=get_curr",
        "Let me check.<tool_call>\n<function=get_curr",
        [],
    ),
    ("cut_after_tool_call_is_content", "One moment.\n<tool_call>\n", "One moment.\n<tool_call>\n", []),
    (
        "text_after_calls_is_ignored",
        DALLAS + "\nI will wait for the result.",
        "",
        [("get_current_weather", DALLAS_ARGS)],
    ),
]


@pytest.mark.parametrize(("text", "content", "calls"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_recorded_outputs(text: str, content: str, calls: list[tuple[str, dict]]) -> None:
    whole = PARSER.parse(text, final=True, tools=TOOLS)
    assert whole.content == content
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == calls
    assert [c.arguments for c in whole.calls] == [json.dumps(args, ensure_ascii=False) for _, args in calls]
    message = assert_streams_agree(text, tool_parser=PARSER, tools=TOOLS)
    assert message.content == content
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == calls


def test_prefixes_report_only_what_cannot_change() -> None:
    def parse(text: str) -> tuple[str, list[tuple[str, str]]]:
        result = PARSER.parse(text, final=False, tools=TOOLS)
        return result.content, [(c.name, c.arguments) for c in result.calls]

    assert parse("Sure <tool") == ("Sure ", [])
    assert parse("Sure <b>") == ("Sure <b>", [])
    assert parse("Sure <tool_call>\n<function=get_current_wea") == ("Sure ", [])
    assert parse("Sure <tool_call>\n<function=get_current_weather>") == ("Sure ", [("get_current_weather", "{")])
    # a string value is known only at its end marker: its trailing newline is stripped
    head = "<function=get_current_weather>\n<parameter=city>\nDallas\n"
    assert parse(head) == ("", [("get_current_weather", "{")])
    assert parse(head + "</parameter>") == ("", [("get_current_weather", '{"city": "Dallas"')])
    assert parse(head + "</parameter>\n<parameter=state>\nTX\n</parameter>\n</function>") == (
        "",
        [("get_current_weather", '{"city": "Dallas", "state": "TX"}')],
    )


def test_final_closes_a_cut_off_call_as_streamed() -> None:
    text = "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nT"
    streamed = PARSER.parse(text, final=False, tools=TOOLS).calls[0].arguments
    final = PARSER.parse(text, final=True, tools=TOOLS).calls[0].arguments
    assert streamed == '{"city": "Dallas"'
    assert final == '{"city": "Dallas", "state": "T"}'


# -- schema-typed conversion ---------------------------------------------------------------------------------------

TYPED = tool(
    "typed",
    count={"type": "integer"},
    ratio={"type": "number"},
    price={"type": "number"},
    flag={"type": "boolean"},
    options={"type": "object"},
    items={"type": "array", "items": {"type": "string"}},
    zip={"type": "string"},
    maybe={"anyOf": [{"type": "integer"}, {"type": "null"}]},
    listed={"type": ["integer", "null"]},
    note={"type": ["string", "null"]},
    anything={"description": "no type"},
    custom={"type": "uuid"},
    choice={"enum": ["1", "2"]},
)


@pytest.mark.parametrize(
    ("param", "raw", "expected"),
    [
        ("count", "42", 42),
        ("count", " -7 ", -7),
        ("count", "forty", "forty"),
        ("ratio", "3.14", 3.14),
        ("ratio", "1e-3", 0.001),
        ("price", "10", 10),
        ("price", "NaN", "NaN"),
        ("flag", "true", True),
        ("flag", "False", False),
        ("flag", "yes", "yes"),
        ("options", '{"key": "value", "n": [1, 2]}', {"key": "value", "n": [1, 2]}),
        ("options", "{'key': 'value', 'ok': True}", {"key": "value", "ok": True}),
        ("options", "{not json", "{not json"),
        ("items", '["a", "b", "c"]', ["a", "b", "c"]),
        ("zip", "02134", "02134"),
        ("zip", "12.50", "12.50"),
        ("zip", "null", "null"),
        ("zip", "  padded  ", "  padded  "),
        ("count", "null", None),
        ("maybe", "5", 5),
        ("maybe", "None", None),
        ("listed", "42", 42),
        ("note", "null", None),
        ("note", "hello", "hello"),
        ("anything", '{"a": 1}', {"a": 1}),
        ("anything", "plain words", "plain words"),
        ("custom", "123", 123),
        ("custom", "3f2a-77", "3f2a-77"),
        ("choice", "1", "1"),
        ("undeclared", "123", "123"),
    ],
)
def test_schema_typed_values(param: str, raw: str, expected: object) -> None:
    text = f"<tool_call>\n<function=typed>\n<parameter={param}>\n{raw}\n</parameter>\n</function>\n</tool_call>"
    whole = PARSER.parse(text, final=True, tools=[TYPED])
    got = json.loads(whole.calls[0].arguments)[param]
    assert got == expected and type(got) is type(expected)
    message = assert_streams_agree(text, tool_parser=PARSER, tools=[TYPED], every_split=False)
    assert message.tool_calls[0].arguments == whole.calls[0].arguments


def test_without_tools_values_stay_strings() -> None:
    text = call("calculate_area", ("shape", "circle"), ("precision", "3"), ("dimensions", '{"radius": 15.5}'))
    whole = PARSER.parse(text, final=True)
    assert json.loads(whole.calls[0].arguments) == {
        "shape": "circle",
        "precision": "3",
        "dimensions": '{"radius": 15.5}',
    }


def test_typed_values_stream_like_the_whole() -> None:
    text = "Computing.\n" + call(
        "calculate_area", ("shape", "circle"), ("dimensions", '{"radius": 15.5}'), ("precision", "3")
    )
    message = assert_streams_agree(text, tool_parser=PARSER, tools=TOOLS)
    assert message.content == "Computing.\n"
    assert json.loads(message.tool_calls[0].arguments) == {
        "shape": "circle",
        "dimensions": {"radius": 15.5},
        "precision": 3,
    }


def test_convert_value_without_a_schema_entry() -> None:
    assert convert_value("7", None) == 7  # an unknown (missing) type is tried as JSON
    assert convert_value("seven", {}) == "seven"
