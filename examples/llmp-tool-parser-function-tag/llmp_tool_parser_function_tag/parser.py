"""The ``function_tag`` tool-call parser: calls written as ``<function=NAME>{arguments}</function>``,
the format Llama 3.1 and 3.2 use for custom tools when the system prompt asks for it::

    Let me check.<function=get_weather>{"city": "Paris"}</function>

* A call is reported once its block is complete: a name of letters, digits, ``_``, ``-`` and
  ``.``, then a JSON object, the arguments (sent as JSON text), then ``</function>``.
* Content is the text outside the calls, as written. A block that is not a call (a name with
  other characters, no JSON object after the name, or a block cut off before its object ended)
  is content, markers included.
* Streaming: ``parse`` sees the whole text so far, and with ``final=False`` reports only what
  more text cannot change: a tail that could still become ``<function=`` and an unfinished block
  are held back. Later results only extend earlier ones, so the server's deltas add up.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from llmp.api import ParsedToolCall, ToolCallParse
from llmp.conformance import ParserSample
from llmp.parsing import held_back, json_value_end, skip_whitespace

START = "<function="
END = "</function>"
NAME = re.compile(r"[A-Za-z0-9_.-]*")  # what a (partial) function name may hold


class FunctionTagToolParser:
    #: the markers are plain text in Llama's tokenizer (only the end-of-turn tokens are special)
    keep_special_tokens = False

    #: outputs of this format for `llmp plugins verify` (it also streams llmp's recorded outputs
    #: of other formats through the parser): what the parser must make of each
    conformance_samples = [
        ParserSample(
            'Let me check.<function=get_weather>{"city": "Paris"}</function>',
            "one call after content",
            content="Let me check.",
            calls=[("get_weather", {"city": "Paris"})],
        ),
        ParserSample(
            '<function=get_time>{}</function>\n<function=web.search>{"query": "</function> in a string", '
            '"limit": 3}</function>',
            "two calls, a marker in a string",
            content="\n",
            calls=[("get_time", {}), ("web.search", {"query": "</function> in a string", "limit": 3})],
        ),
        ParserSample(
            "Write <function=NAME> then the arguments.",
            "a marker in text",
            content="Write <function=NAME> then the arguments.",
            calls=[],
        ),
        ParserSample("Use <function=my tool>{}</function>", "a name with a space: content", calls=[]),
        ParserSample("<function=f>[1, 2]</function>", "arguments not an object: content", calls=[]),
        ParserSample('<function=get_time>{"tz": "UT', "cut off: content", content='<function=get_time>{"tz": "UT'),
    ]

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer  # one instance serves every request: keep no per-request state

    def parse(self, text: str, *, final: bool, tools: Sequence[Mapping[str, Any]] = ()) -> ToolCallParse:
        content: list[str] = []
        calls: list[ParsedToolCall] = []
        pos = 0
        while True:
            start = text.find(START, pos)
            if start < 0:  # no more blocks: the rest is content, less a tail that may become START
                rest = text[pos:]
                content.append(rest if final else rest[: len(rest) - held_back(rest, [START])])
                return ToolCallParse("".join(content), calls)
            content.append(text[pos:start])
            name_start = start + len(START)
            name_end = NAME.match(text, name_start).end()
            if name_end == len(text) and not final:  # the name may go on
                return ToolCallParse("".join(content), calls)
            if name_end == name_start or not text.startswith(">", name_end):  # not a block: the marker is text
                content.append(START)
                pos = name_start
                continue
            body = skip_whitespace(text, name_end + 1)
            if body == len(text) and not final:  # nothing after the name yet
                return ToolCallParse("".join(content), calls)
            if not text.startswith("{", body):  # no arguments object: the tag is text
                content.append(text[start:body])
                pos = body
                continue
            end = json_value_end(text, body)
            if end is None:  # the object goes on: wait, or (cut off) it is content
                if final:
                    content.append(text[start:])
                return ToolCallParse("".join(content), calls)
            after = skip_whitespace(text, end)
            if not final and END.startswith(text[after : after + len(END)]) and after + len(END) > len(text):
                return ToolCallParse("".join(content), calls)  # END may still come: undecided
            block_end = after + len(END) if text.startswith(END, after) else end
            arguments = _arguments(text[body:end])
            if arguments is None:
                content.append(text[start:block_end])
            else:
                calls.append(ParsedToolCall(text[name_start:name_end], arguments))
            pos = block_end


def _arguments(body: str) -> str | None:
    """The arguments as JSON text, or None when ``body`` is not a JSON object."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else None
