"""``--tool-call-parser hermes``: Hermes 2 Pro / Qwen2.5 / Qwen3 ``<tool_call>`` blocks.

The model writes each call as a JSON object in its own block::

    Let me look that up.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {}}
    </tool_call>

* **Calls.** The ``name`` and ``arguments`` keys may come in either order; the
  arguments are the raw JSON text of the ``arguments`` value as written (an
  arguments value that is a JSON string holding JSON is unwrapped, ``null`` is
  ``{}``, a missing one is ``{}``). The object is read as JSON, so
  ``</tool_call>`` or ``<tool_call>`` inside a string argument is just text. A
  call is reported once its name is read and its arguments have begun. A block
  cut off by ``max_tokens`` keeps its call, with the arguments generated so far.
* **Content.** As in vLLM, the text before the first block is content (kept as
  written, e.g. ``"Let me look that up.\\n"``). Text between or after blocks is
  content too when it is more than whitespace; the newlines between blocks are
  dropped. Anything after a call's JSON object inside its block is dropped.
* **Malformed blocks.** A block whose body is not a JSON object with a name
  (``<tool_call>oops</tool_call>``, or cut off before the name was complete) is
  content, markers included (vLLM returns the whole output as content when a
  block fails to parse). When a call's JSON is broken after its name and
  arguments began (say an unterminated string), the call keeps every argument
  character streamed, up to the ``</tool_call>`` met outside a string or the end;
  nothing sent is ever taken back.

``keep_special_tokens`` is True: ``<tool_call>`` is a special token in some of
these models' tokenizers (vLLM also keeps special tokens for this parser).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmp.api import ParsedToolCall, ToolCallParse
from llmp.parsing import held_back, skip_whitespace
from llmp_parsers_tools._common import ContentBuilder, find_first, scan_call_object

START = "<tool_call>"
END = "</tool_call>"


class HermesToolParser:
    keep_special_tokens = True

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    def parse(self, text: str, *, final: bool, tools: Sequence[Mapping[str, Any]] = ()) -> ToolCallParse:
        content, calls = ContentBuilder(), []
        n, pos = len(text), 0
        while True:
            start = text.find(START, pos)
            if start < 0:
                content.add(text[pos:])
                return ToolCallParse(content.result(final, 0 if final else held_back(text[pos:], [START])), calls)
            content.add(text[pos:start])
            body = skip_whitespace(text, start + len(START))
            is_call = False
            if body < n and text[body] == "{":
                obj = scan_call_object(text, body, final=final, stops=(END,))
                is_call = obj.is_call(require_arguments=False)
                if is_call:
                    content.call()
                    calls.append(ParsedToolCall(obj.name, obj.call_arguments()))
                if obj.state == "open":
                    if final and not is_call:
                        content.add(text[start:])
                    return ToolCallParse(content.result(final), calls)
                block_end = obj.end + len(END) if obj.state == "stop" else _block_end(text, obj.end, final)
            elif body >= n and not final:
                block_end = None
            else:
                block_end = _block_end(text, body, final)
            if block_end is None:  # the block goes on and nothing more in it is settled
                return ToolCallParse(content.result(final), calls)
            if not is_call:
                content.add(text[start:block_end])
            pos = block_end


def _block_end(text: str, pos: int, final: bool) -> int | None:
    """End of a block whose JSON part ended at ``pos``: past its ``</tool_call>``, or at a new
    ``<tool_call>`` (the closing tag forgotten), or the end of a final text; None while unknown."""
    index, marker = find_first(text, (END, START), pos)
    if marker == END:
        return index + len(END)
    if marker == START:
        return index
    return len(text) if final else None
