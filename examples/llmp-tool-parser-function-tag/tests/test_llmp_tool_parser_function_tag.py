"""Tests of the parser beyond the conformance kit's (tests/test_conformance.py): its own format."""

import json

import pytest
from llmp.testing import assert_streams_agree

from llmp_tool_parser_function_tag.parser import FunctionTagToolParser


def calls_of(text: str) -> tuple[str, list[tuple[str, dict]]]:
    message = assert_streams_agree(text, tool_parser=FunctionTagToolParser())
    return message.content, [(call.name, json.loads(call.arguments)) for call in message.tool_calls]


def test_a_call_after_content_streams_as_it_parses_whole():
    text = 'Sure.\n<function=get_time>{"tz": "UTC"}</function>'
    assert calls_of(text) == ("Sure.\n", [("get_time", {"tz": "UTC"})])


def test_llama_writes_a_call_alone_and_may_leave_out_the_end_tag():
    assert calls_of('<function=spotify_trending_songs>{"n": "5"}</function>') == (
        "",
        [("spotify_trending_songs", {"n": "5"})],
    )
    assert calls_of('<function=get_time>{"tz": "UTC"}') == ("", [("get_time", {"tz": "UTC"})])


@pytest.mark.parametrize(
    "text",
    [
        "Use <function=my tool>{}</function>",  # not a name
        "<function=>{}</function>",  # no name
        '<function=f> "text" </function>',  # no object
        '<function=get_time>{"tz": "UT',  # cut off
        "a < b and <function",  # a start of the marker, at the end
    ],
)
def test_what_is_not_a_call_is_content_as_written(text):
    assert calls_of(text) == (text, [])


def test_arguments_come_as_json_text_with_unicode_kept():
    parse = FunctionTagToolParser().parse('<function=translate>{"to": "français"}</function>', final=True)
    assert parse.calls[0].arguments == '{"to": "français"}'
