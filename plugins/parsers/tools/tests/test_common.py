"""The shared scanning helpers on the edge cases the recorded outputs rarely hit."""

from __future__ import annotations

import pytest
from llmp_parsers_tools._common import ContentBuilder, arguments_so_far, scan_call_object, scan_value

STOPS = ("</tool_call>",)


@pytest.mark.parametrize(
    ("text", "end", "stop", "in_string"),
    [
        ('{"p": "C:\\\\"} tail', 13, None, False),  # a string ending in an escaped backslash
        ('{"q": "say \\"}\\" now"}', 22, None, False),  # an escaped quote, then a brace, in a string
        ('"ab\\"', None, None, True),  # ends inside the string, on an escaped quote
        ('"ab\\', None, None, True),  # ends on a backslash
        ('[1, [2, {"a": "]"}]]', 20, None, False),
        ('{"a": 1 </tool_call>', None, 8, False),  # the format's marker cuts the object short
        ('{"a": "</tool_call>"}', 21, None, False),  # but not inside a string
        ("true, 1", 4, None, False),
        ("12", None, None, False),  # a literal is complete only once something follows it
    ],
)
def test_scan_value(text: str, end: int | None, stop: int | None, in_string: bool) -> None:
    scan = scan_value(text, 0, STOPS)
    assert (scan.end, scan.stop, scan.in_string) == (end, stop, in_string)


@pytest.mark.parametrize(
    ("text", "final", "expected"),
    [
        ('{"a": 1,\n  ', False, '{"a": 1,'),  # trailing whitespace may precede the closing marker
        ('{"a": 1 </tool_c', False, '{"a": 1'),  # so may a start of it, outside strings
        ('{"a": "x </tool_c', False, '{"a": "x </tool_c'),  # inside a string it is text
        ('{"a": 1,\n  ', True, '{"a": 1,\n  '),  # a cut-off completion keeps what was generated
        ('"{\\"a\\": 1}"', False, '{"a": 1}'),  # a JSON string holding JSON is unwrapped
        ('"not json"', False, '"not json"'),
        ('"{\\"a\\"', False, ""),  # a string is only reported whole
        ("null,", False, "{}"),
    ],
)
def test_arguments_so_far(text: str, final: bool, expected: str) -> None:
    assert arguments_so_far(text, 0, scan_value(text, 0, STOPS), STOPS, final) == expected


def test_call_object_in_either_order_and_not_fooled_by_nested_names() -> None:
    text = '{"arguments": {"name": "inner", "x": [1]}, "id": 7, "name": "outer"}'
    scan = scan_call_object(text, 0, final=False)
    assert (scan.name, scan.arguments, scan.state, scan.end) == (
        "outer",
        '{"name": "inner", "x": [1]}',
        "closed",
        len(text),
    )
    partial = scan_call_object('{"name": "outer", "arguments": {"x": ', 0, final=False)
    assert (partial.name, partial.arguments, partial.state) == ("outer", '{"x":', "open")
    assert scan_call_object('{"name": "f" x', 0, final=False).state == "bad"


def test_content_builder_drops_whitespace_between_calls_only() -> None:
    content = ContentBuilder()
    content.add("\n\n")
    assert content.result(final=False) == ""
    content.call()
    content.add("\n")
    content.call()
    content.add(" done")
    assert content.result(final=True) == " done"
    plain = ContentBuilder()
    plain.add("  ")
    assert plain.result(final=False) == "" and plain.result(final=True) == "  "
