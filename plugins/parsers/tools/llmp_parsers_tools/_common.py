"""Scanning helpers shared by the JSON-based tool-call parsers of this package.

Every parser here is a pure function of the text generated so far (see
:class:`llmp.api.ToolParser`): it scans the text from the start on each call
and reports only what later text cannot change. These helpers hold the parts
that are the same across formats; they are candidates for ``llmp.parsing``.

* :func:`scan_value`: where a JSON value ends, or where a format's *stop marker*
  (``</tool_call>``, ``[TOOL_CALLS]``...) cuts a malformed one short. Stop
  markers are only looked for outside JSON strings, where valid JSON never has
  them, so marker text inside a string argument is just text.
* :func:`arguments_so_far`: the raw argument text to report for a value.
* :func:`scan_call_object`: the ``name`` and raw arguments of a
  ``{"name": ..., "arguments": {...}}`` object, in either key order.
* :class:`ContentBuilder`: which text outside calls is content.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from llmp.parsing import held_back, skip_whitespace

WHITESPACE = " \t\r\n"
JSON_VALUE_START = '{["-0123456789tfn'
_LITERAL_END = ",}]" + WHITESPACE


def proper_prefix_of_any(tail: str, markers: Sequence[str]) -> bool:
    """``tail`` is non-empty and a proper start of one of ``markers`` (more text decides)."""
    return bool(tail) and any(len(tail) < len(m) and m.startswith(tail) for m in markers)


def starts_with_any(text: str, pos: int, markers: Sequence[str]) -> str | None:
    for marker in markers:
        if text.startswith(marker, pos):
            return marker
    return None


def find_first(text: str, markers: Sequence[str], start: int) -> tuple[int, str | None]:
    """Earliest occurrence of any of ``markers`` at or after ``start``: (index, marker), or (-1, None)."""
    best, found = -1, None
    for marker in markers:
        index = text.find(marker, start)
        if index >= 0 and (best < 0 or index < best):
            best, found = index, marker
    return best, found


# -- JSON values -------------------------------------------------------------------


@dataclass(slots=True)
class ValueScan:
    end: int | None = None  # index just past the value, when it is complete
    stop: int | None = None  # index of a stop marker met outside strings before the value ended
    in_string: bool = False  # the text ends inside a JSON string


def scan_value(text: str, start: int, stops: Sequence[str] = ()) -> ValueScan:
    """Scan the JSON value starting at ``text[start]`` (which must exist).

    Objects and arrays end at their matching bracket; strings at their closing
    quote; bare literals at the next delimiter or stop marker. Inside objects and
    arrays, a stop marker outside strings ends the scan early (the value is
    malformed: the format's own structure took over). Brackets are only
    counted, not matched, as :func:`llmp.parsing.json_value_end` does.
    """
    first = text[start]
    if first == '"':
        end = _string_end(text, start + 1)
        return ValueScan(end=end, in_string=end is None)
    if first not in "{[":
        for pos in range(start, len(text)):
            if text[pos] in _LITERAL_END or starts_with_any(text, pos, stops):
                return ValueScan(end=pos)
        return ValueScan()
    pattern = _structure_pattern(tuple(stops))
    depth, pos = 0, start
    while True:
        match = pattern.search(text, pos)
        if match is None:
            return ValueScan()
        pos = match.start()
        char = text[pos]
        if char == '"':
            end = _string_end(text, pos + 1)
            if end is None:
                return ValueScan(in_string=True)
            pos = end
            continue
        if stops and starts_with_any(text, pos, stops):
            return ValueScan(stop=pos)
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return ValueScan(end=pos + 1)
        pos += 1


# a string's contents and closing quote (the unrolled form: no backtracking, linear in C)
_STRING_REST = re.compile(r'[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)


def _string_end(text: str, pos: int) -> int | None:
    """Index just past the closing quote of the string whose contents start at ``pos``; None if the
    text ends inside it."""
    quote = text.find('"', pos)
    if quote < 0:
        return None
    if text.find("\\", pos, quote) < 0:  # no escapes before the first quote: it closes the string
        return quote + 1
    match = _STRING_REST.match(text, pos)
    return match.end() if match else None


@functools.lru_cache(maxsize=64)
def _structure_pattern(stops: tuple[str, ...]) -> re.Pattern[str]:
    """Characters that matter outside strings: quotes, brackets, and the first characters of stop markers."""
    chars = sorted(set('"{}[]').union(stop[0] for stop in stops if stop))
    return re.compile("[" + "".join(re.escape(c) for c in chars) + "]")


def convert_scalar_arguments(raw: str) -> str:
    """Arguments given as a complete scalar: a JSON string holding JSON text is unwrapped, ``null``
    is ``{}``; anything else stays as written."""
    if raw == "null":
        return "{}"
    if raw.startswith('"'):
        try:
            inner = json.loads(raw)
            json.loads(inner)
        except ValueError:
            return raw
        return inner
    return raw


def arguments_so_far(text: str, start: int, scan: ValueScan, stops: Sequence[str], final: bool) -> str:
    """The argument text to report for the value at ``start`` scanned as ``scan``.

    An object or array streams raw: on a prefix, the text so far less a tail
    that may still turn out to be trailing whitespace or a stop marker (outside
    strings only). A string or bare literal can only be judged whole, so it is
    reported once complete (see :func:`convert_scalar_arguments`). At
    ``final`` an unfinished value is reported as far as it was generated.
    """
    if text[start] in "{[":
        if scan.end is not None:
            return text[start : scan.end]
        if scan.stop is not None:
            return text[start : scan.stop].rstrip(WHITESPACE)
        tail = text[start:]
        if final:
            return tail
        if not scan.in_string:
            tail = tail[: len(tail) - held_back(tail, stops)].rstrip(WHITESPACE)
        return tail
    if scan.end is not None:
        return convert_scalar_arguments(text[start : scan.end])
    return text[start:] if final else ""


def value_start(text: str, pos: int, stops: Sequence[str], final: bool) -> str:
    """What begins at ``pos`` where a JSON value is expected: ``"value"``, ``"wait"`` (nothing yet,
    or a possible start of a stop marker) or ``"none"`` (a stop marker or a non-JSON character)."""
    if pos >= len(text):
        return "wait"
    if starts_with_any(text, pos, stops):
        return "none"
    if not final and proper_prefix_of_any(text[pos:], stops):
        return "wait"
    return "value" if text[pos] in JSON_VALUE_START else "none"


# -- {"name": ..., "arguments": ...} objects -------------------------------------------


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


@dataclass(slots=True)
class ObjectScan:
    name: str | None = None  # the complete name, once read
    arguments: str | None = None  # the raw arguments so far; None until their value has begun
    state: str = "open"  # open: the text ends inside; closed: past its "}"; stop/bad: see end
    end: int | None = None  # closed: index past "}"; stop: index of the stop marker; bad: of the bad character

    def is_call(self, require_arguments: bool) -> bool:
        """A call once the name is read and its arguments have begun (or the object closed without them)."""
        if self.name is None:
            return False
        return self.arguments is not None or (self.state == "closed" and not require_arguments)

    def call_arguments(self) -> str:
        return self.arguments if self.arguments is not None else "{}"


def scan_call_object(
    text: str,
    start: int,
    *,
    final: bool,
    stops: Sequence[str] = (),
    name_keys: Sequence[str] = ("name",),
    argument_keys: Sequence[str] = ("arguments", "parameters"),
) -> ObjectScan:
    """Read the call object whose ``{`` is at ``text[start]``.

    The first complete string under a name key is the name; the first value
    under an argument key gives the arguments (:func:`arguments_so_far`); other
    keys are skipped. Scanning stops at the end of the object, at a stop marker
    outside strings (``state="stop"``) or at a character that cannot continue
    the object (``state="bad"``).
    """
    result = ObjectScan()
    n, pos = len(text), start + 1

    def unexpected(at: int) -> ObjectScan:
        if starts_with_any(text, at, stops):
            result.state, result.end = "stop", at
        elif final or not proper_prefix_of_any(text[at:], stops):
            result.state, result.end = "bad", at
        return result

    while True:
        pos = skip_whitespace(text, pos)
        if pos >= n:
            return result
        char = text[pos]
        if char == "}":
            result.state, result.end = "closed", pos + 1
            return result
        if char == ",":
            pos += 1
            continue
        if char != '"':
            return unexpected(pos)
        key_scan = scan_value(text, pos)
        if key_scan.end is None:
            return result
        key = _loads(text[pos : key_scan.end])
        pos = skip_whitespace(text, key_scan.end)
        if pos >= n:
            return result
        if text[pos] != ":":
            return unexpected(pos)
        pos = skip_whitespace(text, pos + 1)
        if pos >= n:
            return result
        if text[pos] not in JSON_VALUE_START:
            return unexpected(pos)
        scan = scan_value(text, pos, stops)
        if key in argument_keys and result.arguments is None:
            result.arguments = arguments_so_far(text, pos, scan, stops, final)
        elif key in name_keys and result.name is None and text[pos] == '"' and scan.end is not None:
            name = _loads(text[pos : scan.end])
            if isinstance(name, str) and name:
                result.name = name
        if scan.stop is not None:
            result.state, result.end = "stop", scan.stop
            return result
        if scan.end is None:
            return result
        pos = scan.end


# -- content -------------------------------------------------------------------------


class ContentBuilder:
    """Collects the text outside tool calls and decides which of it is content.

    The text between two calls, or between the start (or the last call) and the
    end, is a *gap*. A gap that is only whitespace is layout (the newlines
    around ``<tool_call>`` blocks) and is dropped, unless the completion has no
    call at all, in which case all of it is content. Any other gap is content,
    kept exactly as written. While streaming, the open gap is sent once it holds
    something besides whitespace, less a tail that may still become a marker.
    """

    __slots__ = ("calls_seen", "gap", "parts")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.gap = ""
        self.calls_seen = False

    def add(self, text: str) -> None:
        self.gap += text

    def call(self) -> None:
        """A call follows the current gap."""
        if self.gap.strip(WHITESPACE):
            self.parts.append(self.gap)
        self.gap = ""
        self.calls_seen = True

    def result(self, final: bool, held: int = 0) -> str:
        gap = self.gap
        if final:
            keep = gap if gap.strip(WHITESPACE) or not self.calls_seen else ""
        else:
            visible = gap[: len(gap) - held]
            keep = visible if visible.strip(WHITESPACE) else ""
        return "".join(self.parts) + keep
