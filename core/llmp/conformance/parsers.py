"""The suites of tool-call and reasoning parsers (``llmp.api.ToolParser``, ``llmp.api.ReasoningParser``).

A parser is a function of the text generated so far; the server streams by running it on each
longer prefix and sending the differences (``llmp.parsing.MessageStream``). The suites check
what that asks of ``parse``, on the kit's recorded outputs of every format it knows (see
:mod:`llmp.conformance.parser_samples`), on malformed outputs made from them, and on the
parser's own samples (its ``conformance_samples`` class attribute, :class:`ParserSample`):

- streamed deltas add up to the whole-text parse, however the text is cut: one character at
  a time, token by token, and in seeded random chunks drawn to split inside markers (for the
  outputs the parser finds something in: another format's output is plain text to it);
- results only grow: each prefix's result extends the previous one's, and the final parse of
  a prefix (a completion cut off there) extends its streaming result (so the deltas add up
  whatever the cuts, not only those tried);
- malformed output never raises, and a parse adds no text and, without a tool call, loses none
  but markup and whitespace; a prompt that closed the reasoning makes the completion all answer;
- the parser finds calls (reasoning) in outputs of its own format, with JSON-object arguments
  for a complete call, and parses its own samples as they declare;
- one instance serves interleaved requests.

A failure names the sample, how it was cut (with the seed of a random chunking) and the first
field that differs. The suites give the parser a tiny byte-level BPE tokenizer in which the known
markers are single tokens (as in real models' tokenizers).
"""

from __future__ import annotations

import functools
import json
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from llmp.api import ComponentSpec
from llmp.conformance.parser_samples import (
    KNOWN_MARKERS,
    RECORDED,
    TOOLS,
    ParserSample,
    _excerpt,
    malformed_samples,
    markup_spans,
)
from llmp.conformance.runner import Check, Context, SkipCheck

__all__ = ["reasoning_parser_suite", "tool_parser_suite"]

RANDOM_CHUNKINGS = 3  # seeded random chunkings per recorded output
TURN_TOKENS = ("<|im_start|>", "<|im_end|>", "<｜User｜>", "<｜Assistant｜>", "[INST]", "[/INST]")
# markers that are plain added tokens in their models' tokenizers; the others are special tokens
PLAIN_MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>")


@functools.lru_cache(maxsize=1)
def suite_tokenizer() -> Any:
    """``llmp.testing.tiny_tokenizer`` with turn delimiters and the known markers as single tokens."""
    from llmp.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(list(PLAIN_MARKERS), special_tokens=False)
    tokenizer.add_tokens([*TURN_TOKENS, *(m for m in KNOWN_MARKERS if m not in PLAIN_MARKERS)], special_tokens=True)
    return tokenizer


# -- what a parse says, as plain data --------------------------------------------------------------

Message = tuple[str | None, str, list[tuple[str, str]]]  # reasoning, content, [(name, arguments)]


def _first_difference(got: Message, expected: Message, got_label: str, expected_label: str) -> str | None:
    """The first field in which two messages differ, said precisely; None when they agree."""
    (got_reasoning, got_content, got_calls), (want_reasoning, want_content, want_calls) = got, expected
    if got_reasoning != want_reasoning:
        if got_reasoning is None or want_reasoning is None:
            return f"reasoning: {got_label} {got_reasoning!r}, {expected_label} {want_reasoning!r}"
        return "reasoning " + _text_difference(got_reasoning, want_reasoning, got_label, expected_label)
    if got_content != want_content:
        return "content " + _text_difference(got_content, want_content, got_label, expected_label)
    for index, (got_call, want_call) in enumerate(zip(got_calls, want_calls)):
        if got_call[0] != want_call[0]:
            return f"tool call {index} name: {got_label} {got_call[0]!r}, {expected_label} {want_call[0]!r}"
        if got_call[1] != want_call[1]:
            return f"tool call {index} arguments " + _text_difference(
                got_call[1], want_call[1], got_label, expected_label
            )
    if len(got_calls) != len(want_calls):
        return (
            f"tool calls: {got_label} {len(got_calls)} ({[c[0] for c in got_calls]}), "
            f"{expected_label} {len(want_calls)} ({[c[0] for c in want_calls]})"
        )
    return None


def _text_difference(got: str, want: str, got_label: str, want_label: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    start = max(0, at - 20)

    def around(text: str) -> str:
        return ("…" if start else "") + repr(text[start : at + 20]) + ("…" if len(text) > at + 20 else "")

    return (
        f"differs at character {at}: {got_label} {around(got)} ({len(got)} characters), "
        f"{want_label} {around(want)} ({len(want)} characters)"
    )


def _not_extending(later: Message, earlier: Message) -> str | None:
    """How ``later`` takes back something ``earlier`` reported; None when it only adds."""
    if earlier[0] is not None and (later[0] is None or not later[0].startswith(earlier[0])):
        return f"reasoning {earlier[0]!r} became {later[0]!r}"
    if not later[1].startswith(earlier[1]):
        return f"content {_excerpt(earlier[1])} became {_excerpt(later[1])}"
    if len(later[2]) < len(earlier[2]):
        return f"{len(earlier[2])} tool calls became {len(later[2])}"
    for index, ((name, arguments), (then_name, then_arguments)) in enumerate(zip(later[2], earlier[2])):
        if name != then_name:
            return f"tool call {index} was named {then_name!r}, then {name!r}"
        if not arguments.startswith(then_arguments):
            return f"tool call {index} arguments {_excerpt(then_arguments)} became {_excerpt(arguments)}"
    return None


def _finds_something(whole: Message, case: _Case) -> bool:
    """The parse found calls or reasoning, or dropped markers: the text is in the parser's format."""
    reasoning, content, calls = whole
    return bool(calls) or reasoning is not None or content != case.sample.text


def _bare(text: str) -> str:
    """``text`` without markup and whitespace: what no parse may drop unless it is part of a tool call."""
    for start, end in reversed(markup_spans(text)):
        text = text[:start] + text[end:]
    return "".join(text.split())


def _is_subsequence(part: str, text: str) -> bool:
    """Every character of ``part`` is in ``text``, in order (a parse may drop markers, not add text)."""
    characters = iter(text)
    return all(char in characters for char in part)


# -- a parser under test ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Case:
    """One sample as a parser reads it: with the tools (tool parsers) or prompt state (reasoning)."""

    sample: ParserSample
    tools: Sequence[Any] = ()
    in_reasoning: bool | None = None

    def label(self, reasoning: bool) -> str:
        text = f"sample {self.sample.label!r} ({_excerpt(self.sample.text)}, {len(self.sample.text)} characters)"
        return text + (f", in_reasoning={self.in_reasoning}" if reasoning else "")


class _ParserUnderTest:
    """One component of a parser kind, built once, with the text of its checks' failures."""

    def __init__(self, spec: ComponentSpec, reasoning: bool) -> None:
        self.spec = spec
        self.reasoning = reasoning
        self._parser: Any = None

    def build(self) -> Any:
        """The parser, built as the server builds it: ``factory(tokenizer)``."""
        if self._parser is None:
            self._parser = self.spec.load()(suite_tokenizer())
        return self._parser

    @property
    def parser(self) -> Any:
        """The parser, for the checks after the first (which fails when it cannot be built)."""
        try:
            return self.build()
        except Exception as error:
            raise SkipCheck(f"the parser could not be built ({type(error).__name__}: {error})") from error

    # -- parsing, with what went wrong said precisely

    def checked_parse(self, case: _Case, text: str, final: bool, parser: Any = None) -> Any:
        """``parser.parse`` of ``text`` as the server calls it; an exception or a result of the
        wrong shape is an AssertionError saying where."""
        parser = parser or self.parser
        try:
            if self.reasoning:
                result = parser.parse(text, final=final, in_reasoning=case.in_reasoning)
            else:
                result = parser.parse(text, final=final, tools=case.tools)
        except Exception as error:
            raise AssertionError(f"{self._where(case, text, final)} raised {type(error).__name__}: {error}") from error
        problem = self._shape_problem(result)
        if problem:
            raise AssertionError(f"{self._where(case, text, final)} returned {result!r}: {problem}")
        return result

    def parse(self, case: _Case, text: str, final: bool, parser: Any = None) -> Message:
        result = self.checked_parse(case, text, final, parser)
        if self.reasoning:
            return result.reasoning, result.content, []
        return None, result.content, [(call.name, call.arguments) for call in result.calls]

    def _where(self, case: _Case, text: str, final: bool) -> str:
        return f"{case.label(self.reasoning)}: parse(text[:{len(text)}], final={final})"

    def _shape_problem(self, result: Any) -> str | None:
        if self.reasoning:
            reasoning, content = getattr(result, "reasoning", 0), getattr(result, "content", None)
            if (reasoning is None or isinstance(reasoning, str)) and isinstance(content, str):
                return None
            return "expected a ReasoningParse (reasoning a str or None, content a str)"
        content, calls = getattr(result, "content", None), getattr(result, "calls", None)
        if not isinstance(content, str) or not isinstance(calls, list):
            return "expected a ToolCallParse (content a str, calls a list)"
        for call in calls:
            name, arguments = getattr(call, "name", None), getattr(call, "arguments", None)
            if not (isinstance(name, str) and name and isinstance(arguments, str)):
                return f"the call {call!r} is not a ParsedToolCall with a non-empty name and arguments as text"
        return None

    def stream(self, case: _Case, ends: Sequence[int], parser: Any = None) -> Message:
        """What a client receives when the server streams ``case``, fed the prefixes ending at ``ends``."""
        stream = self.new_stream(case, parser)
        reasoning, content, calls = None, "", []
        text = case.sample.text
        for end in ends:
            delta = stream.feed(text[:end], final=end == len(text))
            if delta.reasoning or (reasoning is None and stream.sent.reasoning is not None):
                reasoning = (reasoning or "") + delta.reasoning
            content += delta.content
            for piece in delta.tool_calls:
                if piece.name is not None:
                    calls.append([piece.name, ""])
                calls[piece.index][1] += piece.arguments
        return reasoning, content, [(name, arguments) for name, arguments in calls]

    def new_stream(self, case: _Case, parser: Any = None) -> Any:
        """The server's stream of one choice of a request, parsing with this parser."""
        from llmp.parsing import MessageStream

        checked = _Checked(self, case, parser or self.parser)
        if self.reasoning:
            return MessageStream(checked, in_reasoning=case.in_reasoning)
        return MessageStream(None, checked, tools=case.tools)

    def whole(self, case: _Case) -> Message:
        """The non-streamed message: the whole text parsed once."""
        return self.stream(case, [len(case.sample.text)])


class _Checked:
    """The parser as the server's MessageStream sees it, each result checked by
    ``_ParserUnderTest.checked_parse``."""

    def __init__(self, subject: _ParserUnderTest, case: _Case, parser: Any) -> None:
        self.subject, self.case, self.parser = subject, case, parser

    def parse(self, text: str, *, final: bool, **_: Any) -> Any:
        return self.subject.checked_parse(self.case, text, final, self.parser)


# -- how a text is cut into the pieces a stream receives ----------------------------------------------


def _token_ends(text: str) -> list[int]:
    offsets = suite_tokenizer()(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return sorted({end for _, end in offsets if 0 < end < len(text)} | {len(text)})


def random_ends(text: str, seed: int) -> list[int]:
    """Seeded random pieces of 1 to 12 characters, every other cut drawn inside a marker when
    the text has markup."""
    rng = random.Random(seed)
    spans = [span for span in markup_spans(text) if span[1] - span[0] > 1]
    ends, at = set(), 0
    while at < len(text):
        if spans and rng.random() < 0.5:
            start, stop = rng.choice(spans)
            ends.add(rng.randint(start + 1, stop - 1))
        at += rng.randint(1, 12)
        ends.add(min(at, len(text)))
    return sorted(ends | {len(text)}) if text else [0]


def _chunkings(text: str, *, random_count: int, seed_base: int) -> Iterator[tuple[str, list[int]]]:
    """(how it was cut, the ends of the pieces) of the streams a text is checked with."""
    if not text:
        yield "as one empty final piece", [0]
        return
    yield "one character at a time", list(range(1, len(text) + 1))
    yield "token by token", _token_ends(text)
    for seed in range(seed_base, seed_base + random_count):
        ends = random_ends(text, seed)
        shown = ", ".join(map(str, ends[:8])) + (", …" if len(ends) > 8 else "")
        yield f"in random chunks (seed {seed}: pieces end at {shown})", ends


# -- the checks --------------------------------------------------------------------------------------


class _ParserSuite:
    """The checks of one parser component (``reasoning`` says which kind)."""

    def __init__(self, spec: ComponentSpec, reasoning: bool) -> None:
        self.subject = _ParserUnderTest(spec, reasoning)
        self.reasoning = reasoning

    # -- the cases

    def own_samples(self) -> list[ParserSample]:
        samples = getattr(self.subject.parser, "conformance_samples", ()) or ()
        own = []
        for index, sample in enumerate(samples):
            if isinstance(sample, str):
                sample = ParserSample(sample)
            assert isinstance(sample, ParserSample), (
                f"conformance_samples[{index}] is {sample!r}: expected a str or llmp.conformance.ParserSample"
            )
            own.append(sample if sample.name else _renamed(sample, f"own/{index}"))
        return own

    def cases(self, samples: Sequence[ParserSample], *, own: bool = False) -> list[_Case]:
        if self.reasoning:
            return [_Case(s, in_reasoning=s.in_reasoning) for s in samples]
        return [_Case(s, tools=s.tools if own else (s.tools or TOOLS)) for s in samples]

    def recorded_cases(self) -> list[_Case]:
        return self.cases(RECORDED) + self.cases(self.own_samples(), own=True)

    def relevant_samples(self) -> list[ParserSample]:
        """The parser's own samples and the recorded outputs it finds something in (its format)."""
        found = [case.sample for case in self.cases(RECORDED) if _finds_something(self.subject.whole(case), case)]
        return self.own_samples() + found

    def malformed_cases(self) -> list[_Case]:
        return self.cases(malformed_samples(relevant=self.relevant_samples()))

    # -- checks

    def checks(self) -> Iterator[Check]:
        yield Check("builds from its record", self.check_builds)
        yield Check("recorded outputs: streamed deltas add up to the whole parse", self.check_recorded_streams)
        yield Check("results only grow, prefix by prefix", self.check_results_grow)
        yield Check("malformed output never raises and keeps the text", self.check_malformed)
        if self.reasoning:
            yield Check("finds the reasoning in outputs of its format", self.check_finds_reasoning)
            yield Check("a prompt that closed the reasoning makes it all answer", self.check_closed_reasoning)
        else:
            yield Check("finds tool calls in outputs of its format, with JSON arguments", self.check_finds_calls)
        yield Check("its own samples parse as they declare", self.check_own_samples)
        yield Check("one instance serves interleaved requests", self.check_interleaved)

    def check_builds(self) -> None:
        try:
            parser = self.subject.build()
        except Exception as error:
            raise AssertionError(
                f"{self.subject.spec.impl} could not be built as factory(tokenizer): {type(error).__name__}: {error}"
            ) from error
        assert callable(getattr(parser, "parse", None)), f"{type(parser).__name__} has no parse method"
        keep = getattr(parser, "keep_special_tokens", None)
        assert isinstance(keep, bool), (
            f"{type(parser).__name__}.keep_special_tokens is {keep!r}: expected True or False (whether the server "
            "must detokenize with special tokens for parse to see the markers)"
        )
        self.own_samples()
        if self.reasoning:
            self._check_reasoning_extras(parser)

    def _check_reasoning_extras(self, parser: Any) -> None:
        tokenizer = suite_tokenizer()
        ids = getattr(parser, "end_token_ids", None)
        assert isinstance(ids, Sequence) and not isinstance(ids, str), (
            f"end_token_ids is {ids!r}: expected a sequence of token ids (the end marker's tokens)"
        )
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < len(tokenizer)]
        assert not bad, f"end_token_ids {list(ids)} holds {bad}: not token ids of the tokenizer it was given"
        prompts = [""] + [f"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n{m}\n" for m in KNOWN_MARKERS]
        for prompt in prompts:
            prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
            try:
                state = parser.prompt_state(prompt_ids)
            except Exception as error:
                raise AssertionError(
                    f"prompt_state(the ids of {prompt!r}) raised {type(error).__name__}: {error}"
                ) from error
            assert state in (True, False, None), (
                f"prompt_state(the ids of {prompt!r}) returned {state!r}: expected True, False or None"
            )

    def _assert_streams_agree(self, case: _Case, *, random_count: int, seed_base: int) -> None:
        whole = self.subject.whole(case)
        text = case.sample.text
        for how, ends in _chunkings(text, random_count=random_count, seed_base=seed_base):
            difference = _first_difference(self.subject.stream(case, ends), whole, "streamed", "whole")
            assert difference is None, f"{case.label(self.reasoning)}, streamed {how}: {difference}"

    def check_recorded_streams(self) -> None:
        for case in self.recorded_cases():
            whole = self.subject.whole(case)
            self._assert_keeps_text(case, whole)
            if not _finds_something(whole, case):
                continue  # another format's output is plain text here: "results only grow" covers its streams
            self._assert_streams_agree(case, random_count=RANDOM_CHUNKINGS, seed_base=0)
            if self.reasoning:  # the same text after a prompt that opened the reasoning, and one that said nothing
                other = _Case(case.sample, in_reasoning=None if case.in_reasoning else True)
                self._assert_streams_agree(other, random_count=0, seed_base=0)

    def check_results_grow(self) -> None:
        cases = self.recorded_cases() + self.malformed_cases()
        if self.reasoning:  # also after a prompt that opened the reasoning (or said nothing)
            cases += [_Case(c.sample, in_reasoning=None if c.in_reasoning else True) for c in self.recorded_cases()]
        for case in cases:
            text = case.sample.text
            previous = self.subject.parse(case, "", final=False)
            for end in range(1, len(text) + 1):
                now = self.subject.parse(case, text[:end], final=False)
                why = _not_extending(now, previous)
                assert why is None, (
                    f"{case.label(self.reasoning)}: the result for its first {end} characters takes back what the "
                    f"result for {end - 1} reported: {why}"
                )
                cut = self.subject.parse(case, text[:end], final=True)
                why = _not_extending(cut, now)
                assert why is None, (
                    f"{case.label(self.reasoning)}: the final parse of its first {end} characters (a completion cut "
                    f"off there) takes back what their streaming parse reported: {why}"
                )
                previous = now

    def check_malformed(self) -> None:
        for seed, case in enumerate(self.malformed_cases()):
            self._assert_streams_agree(case, random_count=1, seed_base=100 + seed)
            self._assert_keeps_text(case, self.subject.whole(case))

    def _assert_keeps_text(self, case: _Case, whole: Message) -> None:
        """A parse drops markers and whitespace at most: no text is added, none is lost (but to tool calls)."""
        reasoning, content, calls = whole
        text, label = case.sample.text, case.label(self.reasoning)
        for part, value in (("content", content), ("reasoning", reasoning or "")):
            assert _is_subsequence(value, text), (
                f"{label}: the whole parse's {part} {_excerpt(value)} is not made of the text's characters in order: "
                "a parser may drop markers, never add text"
            )
        if calls:
            return
        missing = Counter(_bare(text)) - Counter("".join(((reasoning or "") + content).split()))
        assert not missing, (
            f"{label}: no tool call was found, yet the whole parse lost text outside markup and whitespace: "
            f"{''.join(missing.elements())!r} is in the text but not in "
            f"{'the reasoning or ' if self.reasoning else ''}the content {_excerpt(content)}"
        )

    def check_finds_calls(self) -> None:
        found = 0
        for case in self.recorded_cases():
            _, _, calls = self.subject.whole(case)
            found += len(calls)
            for index, (name, arguments) in enumerate(calls):
                try:
                    value = json.loads(arguments)
                except ValueError:
                    value = None
                assert isinstance(value, dict), (
                    f"{case.label(False)}: tool call {index} ({name!r}) of this complete output has arguments "
                    f"{_excerpt(arguments)}: expected the text of a JSON object"
                )
        assert found, _none_found("tool call", len(RECORDED))

    def check_finds_reasoning(self) -> None:
        found = any(self.subject.whole(case)[0] for case in self.recorded_cases())
        assert found, _none_found("reasoning", len(RECORDED))

    def check_closed_reasoning(self) -> None:
        for case in self.recorded_cases():
            closed = _Case(case.sample, in_reasoning=False)
            for final in (False, True):
                got = self.subject.parse(closed, case.sample.text, final=final)
                assert got[:2] == (None, case.sample.text), (
                    f"{closed.label(True)}: parse(final={final}) gave reasoning {got[0]!r} and content "
                    f"{_excerpt(got[1])}: after a prompt that closed the reasoning (prompt_state False) the completion "
                    "is all answer (reasoning None, content the whole text)"
                )

    def check_own_samples(self) -> None:
        own = self.cases(self.own_samples(), own=True)
        if not own:
            raise SkipCheck("the parser offers no conformance_samples (a ParserSample list) of its own")
        for case in own:
            self._assert_as_declared(case, self.subject.whole(case))

    def _assert_as_declared(self, case: _Case, whole: Message) -> None:
        sample, label = case.sample, case.label(self.reasoning)
        reasoning, content, calls = whole
        if sample.reasoning is not ...:
            assert reasoning == sample.reasoning, (
                f"{label}: reasoning {reasoning!r}, the sample expects {sample.reasoning!r}"
            )
        if sample.content is not ...:
            assert content == sample.content, f"{label}: content " + _text_difference(
                content, sample.content, "parsed", "expected"
            )
        if sample.calls is not ...:
            expected = list(sample.calls)
            assert [name for name, _ in calls] == [name for name, _ in expected], (
                f"{label}: tool calls {[n for n, _ in calls]}, the sample expects {[n for n, _ in expected]}"
            )
            for index, ((_, arguments), (_, want)) in enumerate(zip(calls, expected)):
                if isinstance(want, str):
                    ok = arguments == want
                else:
                    try:
                        ok = json.loads(arguments) == want
                    except ValueError:
                        ok = False
                assert ok, f"{label}: tool call {index} arguments {_excerpt(arguments)}, the sample expects {want!r}"

    def check_interleaved(self) -> None:
        # the two outputs in which the parser finds most (calls, reasoning), with different results
        found = [(case, self.subject.whole(case)) for case in self.recorded_cases()]
        found.sort(key=lambda item: (len(item[1][2]) + bool(item[1][0]), len(item[0].sample.text)), reverse=True)
        pair = [found[0], next((item for item in found[1:] if item[1] != found[0][1]), found[1])]
        parser = self.subject.parser
        streams = [self.subject.new_stream(case, parser) for case, _ in pair]
        for end in range(1, max(len(case.sample.text) for case, _ in pair) + 1):
            for (case, _), stream in zip(pair, streams):
                if end <= len(case.sample.text):
                    stream.feed(case.sample.text[:end], final=end == len(case.sample.text))
        for index, ((case, whole), stream) in enumerate(zip(pair, streams)):
            sent = stream.sent
            got = (sent.reasoning, sent.content, [(c.name, c.arguments) for c in sent.tool_calls])
            difference = _first_difference(got, whole, "interleaved", "alone")
            assert difference is None, (
                f"{case.label(self.reasoning)}, streamed one character at a time interleaved with "
                f"{pair[1 - index][0].sample.label!r} on the same parser: {difference} (one instance serves every "
                "request: parse must keep no per-request state)"
            )


def _renamed(sample: ParserSample, name: str) -> ParserSample:
    from dataclasses import replace

    return replace(sample, name=name)


def _none_found(what: str, count: int) -> str:
    formats = sorted({sample.name.split("/")[0] for sample in RECORDED} - {"plain"})
    return (
        f"the parser found no {what} in any of the kit's {count} recorded outputs (formats: {', '.join(formats)}) "
        f"nor in samples of its own: give the parser class conformance_samples, outputs of its format as "
        f"llmp.conformance.ParserSample (see docs/plugins.md), so the kit can check its {what}s"
    )


def _suite(spec: ComponentSpec, reasoning: bool) -> Iterator[Check]:
    yield from _ParserSuite(spec, reasoning).checks()


def tool_parser_suite(spec: ComponentSpec, context: Context) -> Iterator[Check]:
    """The checks of a tool-call parser (see the module docstring). No options."""
    return _suite(spec, reasoning=False)


def reasoning_parser_suite(spec: ComponentSpec, context: Context) -> Iterator[Check]:
    """The checks of a reasoning parser (see the module docstring). No options."""
    return _suite(spec, reasoning=True)
