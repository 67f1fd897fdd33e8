"""Helpers for tool-call and reasoning parsers, and the stream that turns their results into deltas.

A parser (:class:`llmp.api.ToolParser`, :class:`llmp.api.ReasoningParser`)
looks at the whole text generated so far and says what it holds. The server
keeps one :class:`MessageStream` per choice: it runs the parsers on each
longer prefix and sends the differences, so streamed deltas add up to the
non-streamed message by construction.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmp.api import ParsedToolCall, ReasoningParser, ToolCallParse, ToolParser

__all__ = [
    "MessageDelta",
    "MessageStream",
    "NamedToolCallParser",
    "ParsedMessage",
    "RequiredToolCallsParser",
    "ToolCallDelta",
    "ToolCallMessage",
    "held_back",
    "json_value_end",
    "new_tool_call_id",
    "skip_whitespace",
]

# -- text helpers --------------------------------------------------------------


def held_back(text: str, markers: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper start of one of ``markers``.

    A streaming parser keeps that tail out of ``content`` until more text says
    whether it is a marker.
    """
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


def skip_whitespace(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def json_value_end(text: str, start: int) -> int | None:
    """Index just past the JSON value that starts at ``text[start]``, or None if it is not complete yet.

    Only brackets and strings are tracked (the value is assumed well formed): an
    object, array or string ends at its closing character; a bare number or
    literal at the next ``,``, ``}``, ``]`` or whitespace.
    """
    if start >= len(text):
        return None
    first = text[start]
    if first not in '{["':
        pos = start
        while pos < len(text) and text[pos] not in ",}] \t\r\n":
            pos += 1
        return pos if pos < len(text) else None
    depth, in_string, escaped = 0, False, False
    for pos in range(start, len(text)):
        char = text[pos]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
                if depth == 0:
                    return pos + 1
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return pos + 1
    return None


def new_tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


# -- the stream ------------------------------------------------------------------


@dataclass(slots=True)
class ToolCallDelta:
    """A streamed piece of a tool call: id, name and type come with its first piece."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


@dataclass(slots=True)
class MessageDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


@dataclass(slots=True)
class ToolCallMessage:
    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class ParsedMessage:
    """Everything sent so far: the message a non-streamed response carries."""

    reasoning: str | None = None
    content: str = ""
    tool_calls: list[ToolCallMessage] = field(default_factory=list)


class MessageStream:
    """Splits one choice's text into reasoning, content and tool calls, as deltas.

    ``feed(text, final)`` takes the whole text so far and returns what is new.
    Results that do not extend what was sent (a parser breaking its contract)
    are held back rather than sent twice or retracted.
    """

    def __init__(
        self,
        reasoning_parser: ReasoningParser | None = None,
        tool_parser: ToolParser | None = None,
        *,
        in_reasoning: bool | None = None,
        tools: Sequence[Mapping[str, Any]] = (),
        make_id: Callable[[], str] = new_tool_call_id,
        max_tool_calls: int | None = None,
    ) -> None:
        self.reasoning_parser = reasoning_parser
        self.tool_parser = tool_parser
        self.max_tool_calls = max_tool_calls  # the calls past it are dropped (parallel_tool_calls false: 1)
        self.in_reasoning = in_reasoning
        self.tools = tools
        self.make_id = make_id
        self.sent = ParsedMessage()
        # after the final feed: whether the calls were whole (False: the text ended inside one, so a
        # lenient parser closed it; finish_reason is then not "tool_calls")
        self.calls_whole = True

    def feed(self, text: str, final: bool = False) -> MessageDelta:
        reasoning, content = None, text
        if self.reasoning_parser is not None:
            split = self.reasoning_parser.parse(text, final=final, in_reasoning=self.in_reasoning)
            reasoning, content = split.reasoning, split.content
        calls: list[ParsedToolCall] = []
        if self.tool_parser is not None:
            found = self.tool_parser.parse(content, final=final, tools=self.tools)
            calls = found.calls[: self.max_tool_calls]
            if final and calls:  # the calls kept: one dropped past max_tool_calls does not count
                settled = self.tool_parser.parse(content, final=False, tools=self.tools).calls
                self.calls_whole = settled[: len(calls)] == calls and all(_whole_json(c.arguments) for c in calls)
            content = found.content
        delta = MessageDelta()
        if reasoning is not None:
            delta.reasoning = self._extend("reasoning", self.sent.reasoning or "", reasoning)
        delta.content = self._extend("content", self.sent.content, content)
        for index, call in enumerate(calls):
            if index < len(self.sent.tool_calls):
                sent = self.sent.tool_calls[index]
                if call.name != sent.name:
                    continue
                extra = call.arguments[len(sent.arguments) :] if call.arguments.startswith(sent.arguments) else ""
                sent.arguments += extra
                if extra:
                    delta.tool_calls.append(ToolCallDelta(index, extra))
            elif index == len(self.sent.tool_calls):
                sent = ToolCallMessage(self.make_id(), call.name, call.arguments)
                self.sent.tool_calls.append(sent)
                delta.tool_calls.append(ToolCallDelta(index, call.arguments, sent.id, call.name))
        return delta

    def _extend(self, part: str, sent: str, now: str) -> str:
        if not now.startswith(sent):
            return ""
        extra = now[len(sent) :]
        if extra or (part == "reasoning" and self.sent.reasoning is None):
            setattr(self.sent, part, now)
        return extra


def _whole_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


# -- tool calls forced by tool_choice (constrained decoding writes them as JSON) ------------------


class NamedToolCallParser:
    """``tool_choice`` naming a function: the whole completion is that function's arguments object."""

    keep_special_tokens = False

    def __init__(self, name: str) -> None:
        self.name = name

    def parse(self, text: str, *, final: bool, tools: Sequence[Mapping[str, Any]] = ()) -> ToolCallParse:
        arguments = text.strip() if final else text.lstrip().rstrip(" \t\r\n")
        # the call appears with its first argument character (not while a reasoning parser holds the text)
        return ToolCallParse("", [ParsedToolCall(self.name, arguments)] if arguments else [])


class RequiredToolCallsParser:
    """``tool_choice: required``: the completion is a JSON array of ``{"name": ..., "parameters": {...}}``.

    A call appears once its name is complete, with its arguments as far as they were generated. A
    final text cut short (``max_tokens``) before a call's name is content, as vLLM returns an
    array it cannot parse: the whole text when no call was made, else the unfinished object.
    """

    keep_special_tokens = False

    def parse(self, text: str, *, final: bool, tools: Sequence[Mapping[str, Any]] = ()) -> ToolCallParse:
        calls: list[ParsedToolCall] = []
        pos = skip_whitespace(text, 0)
        if not text.startswith("[", pos):
            return ToolCallParse(text.strip() if final else "", calls)
        pos += 1
        while True:
            pos = skip_whitespace(text, pos)
            if text.startswith(",", pos):
                pos = skip_whitespace(text, pos + 1)
            if not text.startswith("{", pos):
                break
            start = pos
            call, pos = _scan_call_object(text, pos + 1)
            if call is not None:
                calls.append(call)
            if pos is None:  # the text ends inside this object
                if final and call is None:
                    return ToolCallParse(text[start:] if calls else text.strip(), calls)
                break
        return ToolCallParse(text.strip() if final and not calls else "", calls)


def _scan_call_object(text: str, pos: int) -> tuple[ParsedToolCall | None, int | None]:
    """Read ``"name": ..., "parameters": ...`` pairs from inside an object; (call so far, index past it or None)."""
    import json

    name, arguments = None, None
    while True:
        pos = skip_whitespace(text, pos)
        if text.startswith(",", pos):
            pos = skip_whitespace(text, pos + 1)
        if text.startswith("}", pos):
            return (ParsedToolCall(name, arguments or "") if name is not None else None), pos + 1
        key_end = json_value_end(text, pos) if text.startswith('"', pos) else None
        if key_end is None:
            break
        key = json.loads(text[pos:key_end])
        colon = skip_whitespace(text, key_end)
        if not text.startswith(":", colon):
            break
        value = skip_whitespace(text, colon + 1)
        end = json_value_end(text, value)
        if key == "parameters":
            arguments = text[value:end] if end is not None else text[value:].rstrip(" \t\r\n")
        elif key == "name" and end is not None:
            name = json.loads(text[value:end])
        if end is None:
            break
        pos = end
    return (ParsedToolCall(name, arguments or "") if name is not None else None), None
