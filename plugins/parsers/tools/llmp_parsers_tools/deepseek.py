"""``--tool-call-parser deepseek_v3``: DeepSeek-V3 (and R1-0528) tool calls.

The calls come in one section of special tokens, each with its arguments in a
fenced JSON block::

    Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time
    ```json
    {}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

* **Calls.** A call starts at ``<｜tool▁call▁begin｜>``; the call type before
  ``<｜tool▁sep｜>`` is ignored; the name runs to the end of its line and the
  call is reported as soon as that line ends. The arguments are the raw JSON
  value after the opening fence, as written (vLLM also passes them raw). The
  value is read as JSON, so fences or markers inside a string argument are just
  text. A call closed without arguments gets ``{}``; a call cut off by
  ``max_tokens`` keeps the arguments generated so far.
* **Content.** As in vLLM, the text before the calls is content, as written.
  The section markers are dropped, and so is whitespace between calls; other
  text outside calls (before, between, after) is content. What follows a call's
  JSON value inside the call (the closing fence) is dropped.
* **Malformed calls.** A call block without ``<｜tool▁sep｜>`` and a name line
  (or cut off before its name line ended) is content, markers included (vLLM
  returns the whole output as content when it cannot parse). When the JSON of
  a call is broken, its arguments stop at the closing fence or marker met
  outside a string, or run to the end; nothing streamed is taken back.

``keep_special_tokens`` is True: all the markers are special tokens of the
DeepSeek-V3 tokenizer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmp.api import ParsedToolCall, ToolCallParse
from llmp.parsing import held_back, skip_whitespace
from llmp_parsers_tools._common import (
    ContentBuilder,
    arguments_so_far,
    find_first,
    proper_prefix_of_any,
    scan_value,
    value_start,
)

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
FENCE = "```"
OUTSIDE_MARKERS = (CALLS_BEGIN, CALLS_END, CALL_BEGIN)
BLOCK_ENDS = (CALL_END, CALL_BEGIN, CALLS_END)  # what ends a call block (only the first is consumed)
NAME_ENDS = ("\n", FENCE, *BLOCK_ENDS)
ARGUMENT_STOPS = (FENCE, *BLOCK_ENDS)


class DeepSeekV3ToolParser:
    keep_special_tokens = True

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    def parse(self, text: str, *, final: bool, tools: Sequence[Mapping[str, Any]] = ()) -> ToolCallParse:
        content, calls = ContentBuilder(), []
        pos = 0
        while True:
            index, marker = find_first(text, OUTSIDE_MARKERS, pos)
            if marker is None:
                content.add(text[pos:])
                held = 0 if final else held_back(text[pos:], OUTSIDE_MARKERS)
                return ToolCallParse(content.result(final, held), calls)
            content.add(text[pos:index])
            if marker != CALL_BEGIN:  # the section markers are layout
                pos = index + len(marker)
                continue
            start = index
            sep, _ = find_first(text, (SEP,), start + len(CALL_BEGIN))
            stop, stop_marker = find_first(text, BLOCK_ENDS, start + len(CALL_BEGIN))
            if sep < 0 or 0 <= stop < sep:  # no name part
                if stop >= 0:
                    end = stop + len(CALL_END) if stop_marker == CALL_END else stop
                    content.add(text[start:end])
                    pos = end
                    continue
                if final:
                    content.add(text[start:])
                return ToolCallParse(content.result(final), calls)
            name_start = sep + len(SEP)
            name_end, _ = find_first(text, NAME_ENDS, name_start)
            name = text[name_start:name_end].strip() if name_end >= 0 else ""
            if name_end < 0 or not name:
                if name_end < 0 and not final:  # the name line goes on
                    return ToolCallParse(content.result(final), calls)
                end, _ = _block_end(text, name_start, final)
                if end is None:
                    return ToolCallParse(content.result(final), calls)
                content.add(text[start:end])
                pos = end
                continue
            content.call()
            call = ParsedToolCall(name, "")
            calls.append(call)
            cursor = _skip_fence(text, name_end, final)
            if cursor is None:  # (a start of) the fence, so far
                return ToolCallParse(content.result(final), calls)
            state = value_start(text, cursor, ARGUMENT_STOPS, final)
            has_arguments = state == "value"
            if has_arguments:
                scan = scan_value(text, cursor, ARGUMENT_STOPS)
                call.arguments = arguments_so_far(text, cursor, scan, ARGUMENT_STOPS, final)
                if scan.end is None and scan.stop is None:
                    return ToolCallParse(content.result(final), calls)
                cursor = scan.end if scan.end is not None else scan.stop
            elif state == "wait" and not final:
                return ToolCallParse(content.result(final), calls)
            end, closed = _block_end(text, cursor, final)
            if end is None:
                return ToolCallParse(content.result(final), calls)
            if not has_arguments and closed:
                call.arguments = "{}"
            pos = end


def _skip_fence(text: str, pos: int, final: bool) -> int | None:
    """Index after the whitespace and opening ```json fence that follow the name; None while the
    text so far ends inside them."""
    pos = skip_whitespace(text, pos)
    if text.startswith(FENCE, pos):
        pos += len(FENCE)
        if text.startswith("json", pos):
            pos += len("json")
        elif not final and proper_prefix_of_any(text[pos:], ("json",)):
            return None
        pos = skip_whitespace(text, pos)
    elif not final and proper_prefix_of_any(text[pos:], (FENCE,)):
        return None
    if not final and pos >= len(text):
        return None
    return pos


def _block_end(text: str, pos: int, final: bool) -> tuple[int | None, bool]:
    """(end, closed): past the ``<｜tool▁call▁end｜>`` of the block, or at the marker that starts
    something else (closed); the end of a final text (not closed); None while unknown."""
    index, marker = find_first(text, BLOCK_ENDS, pos)
    if marker == CALL_END:
        return index + len(CALL_END), True
    if marker is not None:
        return index, True
    return (len(text) if final else None), False
