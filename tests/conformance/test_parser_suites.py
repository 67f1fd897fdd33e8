"""The parser suites pass conforming parsers and fail deliberately broken ones with a precise message.

The parsers are registered in-process. A whole ``verify`` runs for a conforming pair and for a
parser that drops a delta; each other broken parser runs only the check its bug must fail.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmp import hookimpl, registry
from llmp.api import ParsedToolCall, ReasoningParse, ReasoningParserSpec, ToolCallParse, ToolParserSpec
from llmp.conformance import CheckResult, ParserSample, verify
from llmp.conformance.parsers import reasoning_parser_suite, tool_parser_suite
from llmp.conformance.runner import Context, _run_check
from llmp.parsing import held_back, json_value_end, skip_whitespace
from llmp.testing import registered

START, END = "<call>", "</call>"


class CallTags:
    """A conforming tool parser: ``<call>{"name": ..., "arguments": {...}}</call>`` blocks."""

    keep_special_tokens = False
    conformance_samples = [
        ParserSample(
            'Hi.<call>{"name": "f", "arguments": {"a": 1}}</call>', "one call", content="Hi.", calls=[("f", {"a": 1})]
        ),
        ParserSample('<call>{"name": "g", "arguments": {}}</call> done', "call then text", content=" done"),
        ParserSample("<call>oops</call>", "not a call", content="<call>oops</call>", calls=[]),
    ]
    hold_back = True  # hold back a tail that may become START
    strict_json = False  # json.loads a block without catching its error
    keep_bad_blocks = True  # a block that is not a call stays content

    def __init__(self, tokenizer: Any) -> None:
        pass

    def parse(self, text: str, *, final: bool, tools: Any = ()) -> ToolCallParse:
        content, calls, pos = [], [], 0
        while True:
            start = text.find(START, pos)
            if start < 0:
                rest = text[pos:]
                held = held_back(rest, [START]) if self.hold_back and not final else 0
                content.append(rest[: len(rest) - held])
                return ToolCallParse("".join(content), calls)
            content.append(text[pos:start])
            body = skip_whitespace(text, start + len(START))
            if body == len(text) and not final:
                return ToolCallParse("".join(content), calls)
            if not text.startswith("{", body):
                content.append(START)
                pos = start + len(START)
                continue
            end = json_value_end(text, body)
            if end is None:
                content.append(text[start:] if final else "")
                return ToolCallParse("".join(content), calls)
            call = self.call(text[body:end])
            after = skip_whitespace(text, end)
            if not final and END.startswith(text[after : after + len(END)]) and after + len(END) > len(text):
                return ToolCallParse("".join(content), calls)
            block_end = after + len(END) if text.startswith(END, after) else end
            if call is not None:
                calls.append(call)
            elif self.keep_bad_blocks:
                content.append(text[start:block_end])
            pos = block_end

    def call(self, body: str) -> ParsedToolCall | None:
        try:
            value = json.loads(body)
        except ValueError:
            if self.strict_json:
                raise
            return None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
            return None
        if not isinstance(value.get("arguments", {}), dict):
            return None
        return ParsedToolCall(value["name"], json.dumps(value.get("arguments", {})))


class DropsADelta:
    """Streams a call's arguments as the model writes them, then reports them re-serialized once
    complete: the server cannot send a change, so the last piece never reaches a streaming client."""

    keep_special_tokens = False
    conformance_samples = [ParserSample('<call>{"name": "f", "arguments": {"a":1,"b":[2]}}</call>', "compact JSON")]
    _HEAD = re.compile(r'\s*\{"name": "([^"]+)", "arguments": ')

    def __init__(self, tokenizer: Any) -> None:
        pass

    def parse(self, text: str, *, final: bool, tools: Any = ()) -> ToolCallParse:
        start = text.find(START)
        if start < 0:
            return ToolCallParse(text if final else text[: len(text) - held_back(text, [START])])
        head = self._HEAD.match(text, start + len(START))
        if head is None:
            return ToolCallParse(text if final else text[:start])
        end = json_value_end(text, head.end())
        if end is None:
            arguments = text[head.end() :].rstrip()
        else:
            arguments = json.dumps(json.loads(text[head.end() : end]))  # the bug: normalized once complete
        return ToolCallParse(text[:start], [ParsedToolCall(head.group(1), arguments)])


class Eager(CallTags):
    """Sends text that may still become ``<call>``, then must take it back."""

    hold_back = False


class RaisesOnBadJSON(CallTags):
    strict_json = True


class LosesText(CallTags):
    """A block that is not a call disappears."""

    keep_bad_blocks = False


class Stateful(CallTags):
    """Keeps the calls it reported until a final parse: right for one request at a time only."""

    def __init__(self, tokenizer: Any) -> None:
        self.reported: list[ParsedToolCall] = []

    def parse(self, text: str, *, final: bool, tools: Any = ()) -> ToolCallParse:
        result = super().parse(text, final=final, tools=tools)
        calls = self.reported + result.calls[len(self.reported) :]
        self.reported = [] if final else calls
        return ToolCallParse(result.content, calls)


class NeverFindsCalls(CallTags):
    conformance_samples: list[ParserSample] = []

    def parse(self, text: str, *, final: bool, tools: Any = ()) -> ToolCallParse:
        return ToolCallParse(text)


class MisdeclaredSample(CallTags):
    conformance_samples = [ParserSample('Hi.<call>{"name": "f", "arguments": {}}</call>', "wrong", content="Hi!")]


class ReturnsADict(CallTags):
    def parse(self, text: str, *, final: bool, tools: Any = ()) -> Any:
        return {"content": text, "calls": []}


def broken_factory(tokenizer: Any) -> Any:
    raise RuntimeError("needs a model-specific tokenizer")


class Think:
    """A conforming reasoning parser: ``<think>`` reasoning ``</think>`` answer, opened by the model or the prompt."""

    keep_special_tokens = False
    conformance_samples = [ParserSample("<think>a</think>b", "think", reasoning="a", content="b"), "plain"]
    hold_back = True
    closed_prompt_is_answer = True

    def __init__(self, tokenizer: Any) -> None:
        self.end_token_ids = tuple(tokenizer.encode("</think>", add_special_tokens=False)) if tokenizer else ()

    def prompt_state(self, prompt_token_ids: Any) -> bool | None:
        return None

    def parse(self, text: str, *, final: bool, in_reasoning: bool | None = None) -> ReasoningParse:
        if in_reasoning is False and self.closed_prompt_is_answer:
            return ReasoningParse(None, text)
        begin = 0
        if not in_reasoning:
            opening = text.lstrip()
            if opening.startswith("<think>"):
                begin = len(text) - len(opening) + len("<think>")
            elif not final and "<think>".startswith(opening):
                return ReasoningParse(None, "")
            else:
                return ReasoningParse(None, text)
        end = text.find("</think>", begin)
        if end < 0:
            held = held_back(text[begin:], ["</think>"]) if self.hold_back and not final else 0
            return ReasoningParse(text[begin : len(text) - held], "")
        return ReasoningParse(text[begin:end], text[end + len("</think>") :])


class ThinkWithoutHoldingBack(Think):
    hold_back = False


class ThinkIgnoringAClosedPrompt(Think):
    closed_prompt_is_answer = False


class ThinkWithTextEndTokens(Think):
    def __init__(self, tokenizer: Any) -> None:
        self.end_token_ids = "</think>"


def _plugin(tool_parsers: dict[str, str] = {}, reasoning_parsers: dict[str, str] = {}) -> Any:  # noqa: B006
    """A plugin registering ``{component name: attribute of this module}`` parsers."""

    class Plugin:
        @hookimpl
        def llmp_register_tool_parsers(self) -> Iterator[ToolParserSpec]:
            for name, attribute in tool_parsers.items():
                yield ToolParserSpec(name=name, impl=f"{__name__}:{attribute}")

        @hookimpl
        def llmp_register_reasoning_parsers(self) -> Iterator[ReasoningParserSpec]:
            for name, attribute in reasoning_parsers.items():
                yield ReasoningParserSpec(name=name, impl=f"{__name__}:{attribute}")

    return Plugin()


BROKEN_TOOLS = {
    f"conformance-test-{name}": name
    for name in (
        "Eager",
        "RaisesOnBadJSON",
        "LosesText",
        "Stateful",
        "NeverFindsCalls",
        "MisdeclaredSample",
        "ReturnsADict",
        "broken_factory",
    )
}
BROKEN_REASONING = {
    f"conformance-test-{name}": name
    for name in ("ThinkWithoutHoldingBack", "ThinkIgnoringAClosedPrompt", "ThinkWithTextEndTokens")
}


@pytest.fixture(scope="module", autouse=True)
def test_parsers() -> Iterator[None]:
    with (
        registered(
            _plugin({"conformance-test-calls": "CallTags"}, {"conformance-test-think": "Think"}), "good-parsers"
        ),
        registered(_plugin({"conformance-test-drops": "DropsADelta"}), "delta-dropping-parser"),
        registered(_plugin(BROKEN_TOOLS, BROKEN_REASONING), "broken-parsers"),
    ):
        yield


def run_one(kind: str, component: str, check: str) -> CheckResult:
    """Run only the check named ``check`` of ``component``'s suite (after the ones before it: a
    suite's checks may share what the first built)."""
    suite = tool_parser_suite if kind == "tool_parser" else reasoning_parser_suite
    with tempfile.TemporaryDirectory() as workdir:
        for found in suite(registry.get_component(kind, component), Context(Path(workdir))):
            if found.name == check:
                return _run_check(kind, component, found)
    raise LookupError(check)


def test_conforming_parsers_pass():
    report = verify("good-parsers")
    assert report.passed, "\n".join(f"{r.component}: {r.check}: {r.detail}" for r in report.failed)
    assert {r.component for r in report.results} == {"conformance-test-calls", "conformance-test-think"}
    assert not [r for r in report.results if r.status == "skipped"]


def test_a_parser_that_drops_a_delta_fails_verify_saying_where():
    report = verify("delta-dropping-parser")
    failed = {r.check: r.detail for r in report.failed}
    assert not report.passed
    streamed = failed["recorded outputs: streamed deltas add up to the whole parse"]
    assert streamed.startswith("sample 'compact JSON' (")
    assert "streamed one character at a time: tool call 0 arguments differs at character 5: " in streamed
    assert """streamed '{"a":1,"b":[2]' (14 characters), whole '{"a": 1, "b": [2]}' (18 characters)""" in streamed
    grows = failed["results only grow, prefix by prefix"]
    assert "the result for its first 48 characters takes back what the result for 47 reported" in grows
    assert """tool call 0 arguments '{"a":1,"b":[2]' became '{"a": 1, "b": [2]}'""" in grows


@pytest.mark.parametrize(
    ("component", "check", "expected"),
    [
        (
            "Eager",
            "recorded outputs: streamed deltas add up to the whole parse",
            "sample 'one call' ('Hi.<call>",
        ),
        ("Eager", "results only grow, prefix by prefix", "content 'Hi.<call' became 'Hi.'"),
        (
            "RaisesOnBadJSON",
            "malformed output never raises and keeps the text",
            "raised JSONDecodeError: Expecting property name enclosed in double quotes",
        ),
        (
            "LosesText",
            "malformed output never raises and keeps the text",
            "no tool call was found, yet the whole parse lost text outside markup and whitespace",
        ),
        (
            "Stateful",
            "one instance serves interleaved requests",
            "parse must keep no per-request state",
        ),
        (
            "NeverFindsCalls",
            "finds tool calls in outputs of its format, with JSON arguments",
            "give the parser class conformance_samples",
        ),
        ("MisdeclaredSample", "its own samples parse as they declare", "content differs at character 2"),
        (
            "ReturnsADict",
            "recorded outputs: streamed deltas add up to the whole parse",
            "returned {'content': 'Hello! How can I help you today?', 'calls': []}: expected a ToolCallParse",
        ),
        ("broken_factory", "builds from its record", "RuntimeError: needs a model-specific tokenizer"),
    ],
)
def test_a_broken_tool_parser_fails_its_check(component: str, check: str, expected: str):
    result = run_one("tool_parser", f"conformance-test-{component}", check)
    assert result.status == "failed" and expected in result.detail, result


def test_the_other_checks_of_a_parser_that_cannot_be_built_are_skipped():
    result = run_one("tool_parser", "conformance-test-broken_factory", "results only grow, prefix by prefix")
    assert result.status == "skipped" and "could not be built (RuntimeError" in result.detail


@pytest.mark.parametrize(
    ("component", "check", "expected"),
    [
        (
            "ThinkWithoutHoldingBack",
            "results only grow, prefix by prefix",
            "reasoning '\\nThe user greets me. I should greet back.\\n</think' became",
        ),
        (
            "ThinkIgnoringAClosedPrompt",
            "a prompt that closed the reasoning makes it all answer",
            "the completion is all answer (reasoning None, content the whole text)",
        ),
        ("ThinkWithTextEndTokens", "builds from its record", "end_token_ids is '</think>'"),
    ],
)
def test_a_broken_reasoning_parser_fails_its_check(component: str, check: str, expected: str):
    result = run_one("reasoning_parser", f"conformance-test-{component}", check)
    assert result.status == "failed" and expected in result.detail, result


def test_a_sample_of_its_own_is_streamed_and_checked_against_what_it_declares():
    """The own samples run through every chunking: a failure names the chunking's seed."""
    result = run_one(
        "tool_parser", "conformance-test-Eager", "recorded outputs: streamed deltas add up to the whole parse"
    )
    assert re.search(r"streamed (one character at a time|token by token|in random chunks \(seed \d+)", result.detail)
