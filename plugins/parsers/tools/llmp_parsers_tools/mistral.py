"""``--tool-call-parser mistral``: Mistral's ``[TOOL_CALLS]`` tool calls, both tokenizer generations.

* Before tokenizer v11 (Mistral-7B-Instruct-v0.3, Mixtral-8x22B-Instruct):
  one JSON array of call objects after the token::

      [TOOL_CALLS] [{"name": "add", "arguments": {"a": 3, "b": 4}}, {"name": ...}]

* v11 and later (Mistral-Small-3.x, Devstral, Magistral, Ministral-3): the
  token before each call, the name, then the arguments object, with the
  ``[ARGS]`` token in between when special tokens are kept (and
  ``[CALL_ID]id`` before it, where a tokenizer has one)::

      [TOOL_CALLS]add[ARGS]{"a": 3, "b": 4}[TOOL_CALLS]multiply[ARGS]{"a": 3, "b": 6}
      [TOOL_CALLS]add{"a": 3, "b": 4}

The format is told apart by what follows ``[TOOL_CALLS]`` (``[`` opens the
array), so one parser serves both, whatever the tokenizer.

* **Calls.** Arguments are the raw JSON text of the arguments object, as
  written (vLLM re-serialises the pre-v11 ones; we keep the model's text, so
  streamed pieces add up to it). In the array, ``name`` and ``arguments`` may
  come in either order; a missing arguments value is ``{}``, as in vLLM. A v11
  call is reported when its name ends (at ``[ARGS]``, ``[CALL_ID]`` or ``{``); a
  v11 call closed without an arguments object gets ``{}``. A call cut off by
  ``max_tokens`` keeps the arguments generated so far.
* **Content.** The text before the first ``[TOOL_CALLS]`` is content, as
  written (as in vLLM). Text after a call (after the array's ``]``, or after a
  v11 call's arguments object) is content when it is more than whitespace, as in
  vLLM's streaming.
* **Malformed calls.** What follows ``[TOOL_CALLS]`` when it is neither a call
  array nor ``name{...}`` (say ``[TOOL_CALLS] not json``), or cut off before a
  v11 name ended, is content without the token and the whitespace after it (as
  vLLM's fallback returns it);
  in an array, from the first item that is not a call on. Arguments whose JSON is
  broken stop at a ``[TOOL_CALLS]`` met outside a string, or run to the end;
  nothing streamed is taken back.

``keep_special_tokens`` is True: ``[TOOL_CALLS]`` (and ``[ARGS]``) are special
tokens, skipped by default detokenization.
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
    scan_call_object,
    scan_value,
    value_start,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
STOPS = (TOOL_CALLS,)
_NAME_PUNCTUATION = set("_-.:")


def _is_name_char(char: str) -> bool:
    return char.isalnum() or char in _NAME_PUNCTUATION


class MistralToolParser:
    keep_special_tokens = True

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    def parse(self, text: str, *, final: bool, tools: Sequence[Mapping[str, Any]] = ()) -> ToolCallParse:
        content, calls = ContentBuilder(), []
        n, pos = len(text), 0
        while True:
            marker = text.find(TOOL_CALLS, pos)
            if marker < 0:
                content.add(text[pos:])
                held = 0 if final else held_back(text[pos:], STOPS)
                return ToolCallParse(content.result(final, held), calls)
            content.add(text[pos:marker])
            cursor = skip_whitespace(text, marker + len(TOOL_CALLS))
            if cursor >= n or (not final and proper_prefix_of_any(text[cursor:], STOPS)):
                return ToolCallParse(content.result(final), calls)
            if text[cursor] == "[" and not text.startswith(TOOL_CALLS, cursor):
                pos = self._array(text, cursor, cursor + 1, final, content, calls)
            else:
                pos = self._named(text, cursor, final, content, calls)
            if pos is None:
                return ToolCallParse(content.result(final), calls)

    @staticmethod
    def _array(
        text: str, start: int, pos: int, final: bool, content: ContentBuilder, calls: list[ParsedToolCall]
    ) -> int | None:
        """Read ``[{...}, ...]`` from after its ``[``; where the text after it begins, or None when the
        text so far ends inside it. Text from a malformed item on is left to the caller as content."""
        n, produced = len(text), False
        while True:
            pos = skip_whitespace(text, pos)
            if pos >= n:
                return None if not final else n
            char = text[pos]
            if char == ",":
                pos += 1
                continue
            if char == "]":
                return pos + 1
            malformed_from = pos if produced else start
            if char != "{":
                if not final and proper_prefix_of_any(text[pos:], STOPS):
                    return None
                return malformed_from
            obj = scan_call_object(text, pos, final=final, stops=STOPS, argument_keys=("arguments",))
            if not obj.is_call(require_arguments=False):
                if obj.state == "open" and not final:
                    return None
                return malformed_from
            content.call()
            calls.append(ParsedToolCall(obj.name, obj.call_arguments()))
            produced = True
            if obj.state == "open":
                return None if not final else n
            if obj.state != "closed":  # a stop marker or junk cut the call short
                return obj.end
            pos = obj.end

    @staticmethod
    def _named(text: str, cursor: int, final: bool, content: ContentBuilder, calls: list[ParsedToolCall]) -> int | None:
        """Read ``name[CALL_ID]id[ARGS]{...}`` (v11+); where the text after it begins, or None when the
        text so far ends inside it."""
        n = len(text)
        name_end = cursor
        while name_end < n and _is_name_char(text[name_end]):
            name_end += 1
        name = text[cursor:name_end]
        after = skip_whitespace(text, name_end)
        arguments_at: int | None = None
        if not name:
            pass
        elif text.startswith("{", after):
            arguments_at = after
        elif text.startswith(ARGS, after):
            arguments_at = after + len(ARGS)
        elif text.startswith(CALL_ID, after):
            index, found = find_first(text, (ARGS, "{"), after + len(CALL_ID))
            arguments_at = -1 if found is None else index + (len(ARGS) if found == ARGS else 0)
        elif not final and (after >= n or proper_prefix_of_any(text[after:], (ARGS, CALL_ID))):
            return None  # the name may go on
        if arguments_at is None:  # not a call: the text after the marker is content
            return cursor
        call = ParsedToolCall(name, "")
        content.call()
        calls.append(call)
        if arguments_at < 0:  # the call id so far
            return None if not final else n
        start = skip_whitespace(text, arguments_at)
        state = value_start(text, start, STOPS, final)
        if state == "wait":
            return None if not final else n
        if state == "none":
            call.arguments = "{}"
            return start
        scan = scan_value(text, start, STOPS)
        call.arguments = arguments_so_far(text, start, scan, STOPS, final)
        if scan.end is not None:
            return scan.end
        if scan.stop is not None:
            return scan.stop
        return None if not final else n
