"""The ``qwen3_xml`` tool-call parser: Qwen3-Coder's XML-like calls.

::

    I'll look that up.<tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

Rules (after vLLM's ``qwen3_coder`` / ``qwen3_xml`` parsers):

* ``content`` is the text before the first ``<tool_call>`` or ``<function=``. Text outside
  calls after that (the newlines between calls) is not content. A completion in which no
  call gets a complete ``<function=NAME>`` is all content.
* A call is ``<function=NAME>`` and its parameters, up to ``</function>``; the
  ``<tool_call>``/``</tool_call>`` wrapper is optional. A model that leaves out
  ``</parameter>`` or ``</function>`` is forgiven: a value also ends at the next
  ``<parameter=``, ``</function>`` or ``</tool_call>``, a call at ``</tool_call>``,
  ``<tool_call>`` or the next ``<function=``.
* A value loses one leading and one trailing newline and is converted with the type its
  parameter has in the request's tool schema (``type``, a ``type`` list, or the first
  non-null ``anyOf``/``oneOf`` option): string types keep the text; integer, number and
  boolean are parsed from it; object and array are parsed as JSON (then as a Python
  literal); other or missing types are tried as JSON. A value that does not convert stays
  a string; ``null``/``None`` is null for non-string types (and for a nullable string).
  A parameter the schema does not declare (or a request without tools) keeps the text.
* Streaming: a call appears once ``<function=NAME>`` is complete; its arguments grow by one
  ``"key": value`` pair when the value's end marker arrives (a string value is only known
  then: its trailing newline is stripped), and ``}`` comes with the end of the call. The
  arguments equal ``json.dumps(params, ensure_ascii=False)`` (a repeated parameter appears
  twice; JSON readers keep the last).
* ``final=True`` closes a call cut off by ``max_tokens``: a value cut off is converted from
  the text generated (less a partial end marker and the newlines), a parameter whose name is
  cut off is dropped, and ``}`` is added, so the arguments are valid JSON; the ``length``
  finish reason tells the client they may be incomplete.

Out of scope: values that contain the markers themselves (code writing ``</parameter>``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from llmp.api import ParsedToolCall, ToolCallParse
from llmp.parsing import held_back
from llmp_parsers_tools_code._arguments import NotALiteral, arguments_text, json_pair, python_literal

TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"

_STARTS = (TOOL_CALL, FUNCTION)
_BODY_MARKERS = (PARAMETER, FUNCTION_END, TOOL_CALL_END, TOOL_CALL, FUNCTION)
_VALUE_ENDS = (PARAMETER_END, PARAMETER, FUNCTION_END, TOOL_CALL_END)

_STRING_TYPES = {"string", "str", "text", "varchar", "char", "enum"}
_INTEGER_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_NUMBER_PREFIXES = ("num", "float", "double", "decimal")
_BOOLEAN_TYPES = {"boolean", "bool", "binary"}
_CONTAINER_TYPES = {"object", "array", "arr"}
_CONTAINER_PREFIXES = ("dict", "list")
_NULLS = {"null", "none"}


class Qwen3XMLToolParser:
    """``--tool-call-parser qwen3_xml``: ``<tool_call><function=NAME><parameter=P>VALUE</parameter>...``."""

    #: ``<tool_call>`` is not a special token in Qwen tokenizers, and ``<function=`` is plain text
    keep_special_tokens = False

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer  # unused: parsing is text-based

    def parse(self, text: str, *, final: bool, tools: Sequence[Mapping[str, Any]] = ()) -> ToolCallParse:
        first, _ = _find_first(text, _STARTS, 0)
        if first < 0:
            return ToolCallParse(content=text if final else text[: len(text) - held_back(text, _STARTS)])
        calls = _parse_calls(text, first, final, tools)
        if not calls:
            return ToolCallParse(content=text if final else text[:first])
        return ToolCallParse(content=text[:first], calls=calls)


def _find_first(text: str, markers: Sequence[str], start: int) -> tuple[int, str]:
    """The earliest of ``markers`` in ``text`` from ``start``: its index and itself, or ``(-1, "")``."""
    best, found = -1, ""
    for marker in markers:
        index = text.find(marker, start, best + len(marker) if best >= 0 else len(text))
        if index >= 0 and (best < 0 or index < best):
            best, found = index, marker
    return best, found


def _parse_calls(text: str, pos: int, final: bool, tools: Sequence[Mapping[str, Any]]) -> list[ParsedToolCall]:
    calls: list[ParsedToolCall] = []
    while True:
        start = text.find(FUNCTION, pos)
        if start < 0:
            return calls
        name_start = start + len(FUNCTION)
        name_end = text.find(">", name_start)
        if name_end < 0:  # the name may go on
            return calls
        name = text[name_start:name_end].strip()
        pos = name_end + 1
        if not name:
            continue
        pairs: list[str] = []
        closed, pos = _parse_body(text, pos, pairs, final, _properties(tools, name))
        calls.append(ParsedToolCall(name, arguments_text(pairs, closed or final)))
        if not closed:
            return calls


def _parse_body(
    text: str, pos: int, pairs: list[str], final: bool, properties: Mapping[str, Any] | None
) -> tuple[bool, int]:
    """Append the JSON pairs of the parameters from ``pos``; True and where the call ends if it is complete."""
    while True:
        index, marker = _find_first(text, _BODY_MARKERS, pos)
        if index < 0:
            return False, len(text)
        if marker == FUNCTION_END:
            return True, index + len(FUNCTION_END)
        if marker != PARAMETER:  # the model left out </function>
            return True, index
        name_start = index + len(PARAMETER)
        name_end = text.find(">", name_start)
        if name_end < 0:
            return False, len(text)
        name = text[name_start:name_end].strip()
        value_start = name_end + 1
        value_end, end_marker = _find_first(text, _VALUE_ENDS, value_start)
        if value_end < 0:
            if final and name:  # cut off: the value as far as it was generated
                raw = text[value_start:]
                _add_pair(pairs, name, raw[: len(raw) - held_back(raw, _VALUE_ENDS)], properties)
            return False, len(text)
        if name:
            _add_pair(pairs, name, text[value_start:value_end], properties)
        pos = value_end + len(PARAMETER_END) if end_marker == PARAMETER_END else value_end


def _add_pair(pairs: list[str], name: str, raw: str, properties: Mapping[str, Any] | None) -> None:
    raw = raw.removeprefix("\n")
    raw = raw.removesuffix("\n")
    schema = properties.get(name) if properties is not None else None
    pair = json_pair(name, convert_value(raw, schema)) if schema is not None else None
    pairs.append(pair or f"{json.dumps(name, ensure_ascii=False)}: {json.dumps(raw, ensure_ascii=False)}")


def _properties(tools: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    """The ``properties`` of tool ``name``'s parameter schema; None if the request has no such tool."""
    for tool in tools or ():
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function")
        if not isinstance(function, Mapping):
            function = tool  # a flat definition (Responses API style)
        if function.get("name") != name:
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        return properties if isinstance(properties, Mapping) else {}
    return None


def schema_type(schema: Any) -> tuple[str | None, bool]:
    """The first non-null type a property schema names (lower case) and whether it admits null."""
    if not isinstance(schema, Mapping):
        return None, False
    names: list[str] = []
    declared = schema.get("type")
    if isinstance(declared, str):
        names.append(declared)
    elif isinstance(declared, list):
        names += [t for t in declared if isinstance(t, str)]
    nullable = schema.get("nullable") is True
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        for option in options if isinstance(options, list) else ():
            option_type, option_nullable = schema_type(option)
            nullable = nullable or option_nullable or (isinstance(option, Mapping) and option.get("type") == "null")
            if option_type is not None:
                names.append(option_type)
    names = [t.strip().lower() for t in names]
    nullable = nullable or "null" in names
    names = [t for t in names if t != "null"]
    if not names:
        choices = schema.get("enum")
        if isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices):
            return "string", nullable
        return None, nullable
    return names[0], nullable


def convert_value(raw: str, schema: Any) -> Any:
    """``raw`` converted to the type ``schema`` gives it; ``raw`` itself when it does not convert."""
    kind, nullable = schema_type(schema)
    text = raw.strip()
    if text.lower() in _NULLS and (nullable or (kind is not None and kind not in _STRING_TYPES)):
        return None
    if kind in _STRING_TYPES:
        return raw
    if kind is not None and kind.startswith(_INTEGER_PREFIXES):
        try:
            return int(text)
        except ValueError:
            return raw
    if kind is not None and kind.startswith(_NUMBER_PREFIXES):
        try:
            return int(text)
        except ValueError:
            pass
        try:
            number = float(text)
        except ValueError:
            return raw
        return number if math.isfinite(number) else raw
    if kind in _BOOLEAN_TYPES:
        return {"true": True, "false": False}.get(text.lower(), raw)
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    if kind is not None and (kind in _CONTAINER_TYPES or kind.startswith(_CONTAINER_PREFIXES)):
        try:
            return python_literal(text)
        except NotALiteral:
            pass
    return raw
