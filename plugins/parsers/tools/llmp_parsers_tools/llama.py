"""``--tool-call-parser llama3_json``: Llama 3.1 / 3.2 JSON tool calls.

With tools in the prompt, Llama 3.x answers either in plain text or with the
whole message being calls, optionally after the ``<|python_tag|>`` token, each
call a JSON object, several separated by ``;``::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}

* **Calls or text.** As vLLM does when streaming, the completion is read as
  calls only when it starts (after whitespace) with ``{`` or
  ``<|python_tag|>``; anything else is plain content, all of it.
  ``<|python_tag|>`` followed by something other than ``{`` (Llama 3.1's
  built-in ``brave_search.call(...)`` tools) is content too, without the tag.
* **Calls.** The name is under ``name`` and the arguments under
  ``parameters`` (``arguments`` is accepted too), in either order; the
  arguments are their raw JSON text as written (a JSON string holding JSON is
  unwrapped, ``null`` is ``{}``). An object without both a name and an
  arguments value is not a call: it, and everything after it, is content (a
  plain JSON answer such as ``{"answer": 42}`` stays content). A call cut off by
  ``max_tokens`` keeps its name and the arguments generated so far.
* **After the calls.** A trailing ``;`` and whitespace are dropped; other text
  after the last call is content (vLLM drops it).
* **Malformed JSON.** Once a call's name is read and its arguments began, the
  call stands with every argument character streamed, up to a ``;`` met outside
  a string or the end of the text; nothing sent is taken back.

``keep_special_tokens`` is True: ``<|python_tag|>`` is a special token, and it
is how the model marks a call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmp.api import ParsedToolCall, ToolCallParse
from llmp.parsing import skip_whitespace
from llmp_parsers_tools._common import ContentBuilder, scan_call_object

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = ";"


class Llama3JsonToolParser:
    keep_special_tokens = True

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    def parse(self, text: str, *, final: bool, tools: Sequence[Mapping[str, Any]] = ()) -> ToolCallParse:
        content, calls = ContentBuilder(), []
        n = len(text)
        first = skip_whitespace(text, 0)
        if first >= n or (not final and PYTHON_TAG.startswith(text[first:])):
            # only whitespace, or a possible start of the tag, so far
            content.add(text if final else "")
            return ToolCallParse(content.result(final), calls)
        content.add(text[:first])
        body = first + len(PYTHON_TAG) if text.startswith(PYTHON_TAG, first) else first
        pos = skip_whitespace(text, body)
        content.add(text[body:pos])
        if pos >= n:
            return ToolCallParse(content.result(final), calls)
        if text[pos] != "{":
            content.add(text[pos:])
            return ToolCallParse(content.result(final), calls)
        while True:
            obj = scan_call_object(text, pos, final=final, stops=(SEPARATOR,))
            if not obj.is_call(require_arguments=True):
                if obj.state != "open" or final:
                    content.add(text[pos:])
                return ToolCallParse(content.result(final), calls)
            content.call()
            calls.append(ParsedToolCall(obj.name, obj.call_arguments()))
            if obj.state == "open":
                return ToolCallParse(content.result(final), calls)
            after = obj.end
            cursor = skip_whitespace(text, after)
            if cursor < n and text[cursor] == SEPARATOR:
                cursor = skip_whitespace(text, cursor + 1)
                if cursor < n and text[cursor] == "{":
                    pos = cursor
                    continue
            if cursor >= n:  # only whitespace and perhaps a separator after the call, so far
                return ToolCallParse(content.result(final), calls)
            content.add(text[after:])
            return ToolCallParse(content.result(final), calls)
