"""Shared by the tool-parser tests: recorded-output fixtures and the checks run on each."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from llmp.api import ToolCallParse
from llmp.testing import assert_streams_agree


@dataclass(frozen=True)
class Case:
    """A model output and what the parser must make of it.

    ``calls`` are ``(name, arguments)``; ``complete`` says the calls are whole,
    so their arguments must be valid JSON objects.
    """

    id: str
    text: str
    content: str
    calls: list[tuple[str, str]] = field(default_factory=list)
    complete: bool = True


def check_case(parser: Any, case: Case) -> None:
    """Whole parse as expected, and streamed parses (per character, split anywhere) add up to it."""
    whole = parser.parse(case.text, final=True)
    assert whole.content == case.content
    assert [(c.name, c.arguments) for c in whole.calls] == case.calls
    if case.complete:
        for _, arguments in case.calls:
            assert isinstance(json.loads(arguments), dict), arguments
    message = assert_streams_agree(case.text, tool_parser=parser)
    assert message.content == case.content
    assert [(c.name, c.arguments) for c in message.tool_calls] == case.calls


def extends(later: ToolCallParse, earlier: ToolCallParse) -> bool:
    """``later`` only adds to ``earlier``: longer content, more calls, same names, longer arguments."""
    if not later.content.startswith(earlier.content) or len(later.calls) < len(earlier.calls):
        return False
    return all(
        now.name == then.name and now.arguments.startswith(then.arguments)
        for now, then in zip(later.calls, earlier.calls)
    )


def assert_grows(parser: Any, text: str) -> None:
    """Every prefix's streaming result extends the previous one's, and the final parse of every prefix
    (a completion cut off there) extends its streaming result: what was streamed is never taken back."""
    previous = parser.parse("", final=False)
    for end in range(1, len(text) + 1):
        now = parser.parse(text[:end], final=False)
        assert extends(now, previous), f"{text[:end]!r}: {now} does not extend {previous}"
        cut = parser.parse(text[:end], final=True)
        assert extends(cut, now), f"{text[:end]!r} cut off: {cut} does not extend {now}"
        previous = now
