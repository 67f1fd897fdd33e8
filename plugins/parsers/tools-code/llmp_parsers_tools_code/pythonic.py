"""The ``pythonic`` tool-call parser: a completion that is a Python list of calls.

Llama 3.2, Llama 4 (its ``<|python_start|>`` markers are special tokens, removed in
decoding), ToolACE and other models answer a tool call with a list of calls whose
arguments are keyword arguments with literal values::

    [get_weather(city='Paris', unit="c"), search(q="x", filters={"a": [1, 2]})]

Rules (after vLLM's ``pythonic`` parser):

* The completion is a call list only if it starts (leading whitespace aside) with ``[``,
  a name and ``(``; anything else is plain content, text before a list included. While
  streaming, text that may still become a call list (a lone ``[``, ``[get_wea``) is
  held back, and leading whitespace with it.
* Values are Python literals: strings, numbers, ``True``/``False``/``None``, lists,
  tuples (as arrays) and dicts; ``true``/``false``/``null`` are accepted too. The
  arguments become a JSON object text equal to ``json.dumps(kwargs, ensure_ascii=False)``.
* Streaming: a call appears once ``name(`` is complete; its arguments grow by one
  ``"key": value`` pair when the ``,`` or ``)`` ending the value arrives (only then is the
  value known: ``'a' 'b'`` is one string), and ``}`` comes with the ``)`` of the call.
* Once the list has started, everything is calls. Text after the closing ``]``, and
  everything from the first thing that is not a keyword argument with a literal value
  (a positional argument, an expression, unbalanced brackets), is ignored: calls already
  streamed cannot be taken back, so vLLM's rule (an unparsable list is all content)
  cannot be followed here. The call being parsed there ends with the pairs it had.
* ``final=True`` closes a call cut off by ``max_tokens``: a value cut off is completed
  when closing its open string and brackets makes it a literal (``city='Par`` gives
  ``"city": "Par"``), otherwise dropped, and ``}`` is added. The arguments of a cut-off
  call are therefore always valid JSON; the ``length`` finish reason tells the client
  they may be incomplete.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from llmp.api import ParsedToolCall, ToolCallParse
from llmp.parsing import skip_whitespace
from llmp_parsers_tools_code._arguments import NotALiteral, arguments_text, json_pair, python_literal

_NAME = re.compile(r"[^\W\d]\w*")
_CLOSERS = {"(": ")", "[": "]", "{": "}"}
_SCAN = re.compile(r"""["'()\[\]{},]""")  # what _scan_value stops at outside strings
_STRING_STOPS = {"'": re.compile(r"[\\']"), '"': re.compile(r'[\\"]')}


class PythonicToolParser:
    """``--tool-call-parser pythonic``: ``[name(key=literal, ...), ...]``."""

    keep_special_tokens = False

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer  # unused: parsing is text-based

    def parse(self, text: str, *, final: bool, tools: Sequence[Mapping[str, Any]] = ()) -> ToolCallParse:
        calls, undecided = _parse_call_list(text, final)
        if calls:
            return ToolCallParse(content="", calls=calls)
        if undecided and not final:
            return ToolCallParse(content="")
        return ToolCallParse(content=text)


def _parse_call_list(text: str, final: bool) -> tuple[list[ParsedToolCall], bool]:
    """The calls of the list ``text`` starts with, and (when there are none) whether more text could make one."""
    n = len(text)
    pos = skip_whitespace(text, 0)
    if pos == n:
        return [], True
    if text[pos] != "[":
        return [], False
    calls: list[ParsedToolCall] = []
    pos += 1
    while True:
        pos = skip_whitespace(text, pos)
        if pos == n:
            return calls, True
        name = _NAME.match(text, pos)
        if name is None:  # `]` closing the list, or not a call
            return calls, False
        if name.end() == n:  # the name may go on
            return calls, True
        pos = skip_whitespace(text, name.end())
        if pos == n:
            return calls, True
        if text[pos] != "(":
            return calls, False
        pairs: list[str] = []
        closed, pos = _parse_arguments(text, pos + 1, pairs, final)
        calls.append(ParsedToolCall(name.group(), arguments_text(pairs, closed or final)))
        if not closed:
            return calls, False
        pos = skip_whitespace(text, pos)
        if pos == n or text[pos] != ",":  # `]`, the end of the text so far, or something else: the list ends
            return calls, False
        pos += 1


def _parse_arguments(text: str, pos: int, pairs: list[str], final: bool) -> tuple[bool, int]:
    """Append the JSON pairs of the keyword arguments at ``pos``; True and the position after ``)`` if the call
    is complete, False if the text ends first or is not a keyword argument with a literal value."""
    n = len(text)
    while True:
        pos = skip_whitespace(text, pos)
        if pos == n:
            return False, pos
        if text[pos] == ")":
            return True, pos + 1
        keyword = _NAME.match(text, pos)
        if keyword is None or keyword.end() == n:
            return False, pos
        equals = skip_whitespace(text, keyword.end())
        if equals == n or text[equals] != "=":
            return False, pos
        start = equals + 1
        end, completion = _scan_value(text, start)
        if end is None:
            if final and completion is not None:  # cut off: complete the value if that makes a literal
                closers, drop = completion
                _add_pair(pairs, keyword.group(), text[start : n - drop] + closers)
            return False, pos
        if text[end] not in ",)" or not _add_pair(pairs, keyword.group(), text[start:end]):
            return False, pos
        if text[end] == ")":
            return True, end + 1
        pos = end + 1


def _add_pair(pairs: list[str], key: str, value_text: str) -> bool:
    if not value_text.strip():
        return False
    try:
        pair = json_pair(key, python_literal(value_text))
    except NotALiteral:
        return False
    if pair is None:
        return False
    pairs.append(pair)
    return True


def _scan_value(text: str, pos: int) -> tuple[int | None, tuple[str, int] | None]:
    """Find where the literal starting at ``pos`` ends: the index of the ``,`` or ``)`` (or a stray closing
    bracket) at bracket depth 0 outside strings, and None.

    If the text ends first: None, and ``(closers, drop)``: the text that closes the literal's open string
    and brackets, and how many characters to drop from its end first (a dangling backslash).
    """
    stack: list[str] = []
    n = len(text)
    i = pos
    while True:
        found = _SCAN.search(text, i)
        if found is None:
            return None, (_closing(stack), 0)
        i = found.start()
        char = text[i]
        if char in "'\"":
            if text.startswith(char * 3, i):
                quote = char * 3
            elif i + 2 == n and text[i + 1] == char:  # `''` at the end: empty, or a triple quote to come
                return None, (_closing(stack), 0)
            else:
                quote = char
            j = i + len(quote)
            while True:
                stop = _STRING_STOPS[char].search(text, j)
                if stop is None:
                    return None, (quote + _closing(stack), 0)
                j = stop.start()
                if text[j] == "\\":
                    if j + 1 == n:
                        return None, (quote + _closing(stack), 1)
                    j += 2
                elif text.startswith(quote, j):
                    j += len(quote)
                    break
                else:
                    j += 1
            i = j
            continue
        if char in "([{":
            stack.append(char)
        elif char in ")]}":
            if not stack or _CLOSERS[stack.pop()] != char:
                return i, None
        elif not stack:  # a comma
            return i, None
        i += 1


def _closing(stack: list[str]) -> str:
    return "".join(_CLOSERS[opener] for opener in reversed(stack))
