"""mistral (Magistral): [THINK]...[/THINK], written by the model; without [THINK] it is all answer."""

from __future__ import annotations

import pytest
from llmp_parsers_reasoning.mistral import MistralReasoningParser
from reasoning_parsers_support import check, stream_chunks

from llmp.api import ReasoningParse

CASES = {
    "reasoning-then-answer": (
        "[THINK]Okay, the user asks for 2 + 2. That is 4, nothing tricky.[/THINK]The answer is **4**.",
        None,
        "Okay, the user asks for 2 + 2. That is 4, nothing tricky.",
        "The answer is **4**.",
    ),
    "cut-off-by-max-tokens": ("[THINK]Okay, so the question is", None, "Okay, so the question is", ""),
    "prompt-opened": ("Reasoning here.[/THINK]Answer", True, "Reasoning here.", "Answer"),
    "prompt-opened-cut-off": ("Reasoning here.[/TH", True, "Reasoning here.[/TH", ""),
    "no-reasoning": ("The answer is 4.", None, None, "The answer is 4."),
    "no-reasoning-prompt-closed-it": ("[THINK]x", False, None, "[THINK]x"),
    "stray-end-marker-dropped": (
        "This is a reasoning section[/THINK]This is the rest",
        None,
        None,
        "This is a reasoning sectionThis is the rest",
    ),
    "stray-end-marker-then-reasoning": ("a[/THINK]b[THINK]c[/THINK]d", None, "c", "abd"),
    "empty-completion": ("", None, None, ""),
    "empty-reasoning": ("[THINK]\n\n[/THINK]\n\nAnswer", None, "\n\n", "\n\nAnswer"),
    "empty-reasoning-no-whitespace": ("[THINK][/THINK]Answer", None, "", "Answer"),
    "content-before-reasoning": (
        "Before\n[THINK]This is a reasoning section[/THINK]\nThis is the rest",
        None,
        "This is a reasoning section",
        "Before\n\nThis is the rest",
    ),
    "start-marker-cut-off": ("Text [THI", None, None, "Text [THI"),
    "unicode": ("[THINK]Zürich → 東京 🙂[/THINK]Réponse : 東京 🚀", None, "Zürich → 東京 🙂", "Réponse : 東京 🚀"),
    "answer-mentions-markers": (
        "[THINK]x[/THINK]Write [THINK] to start and [/THINK] to stop.",
        None,
        "x",
        "Write [THINK] to start and [/THINK] to stop.",
    ),
}


@pytest.fixture(scope="module")
def parser(marker_tokenizer) -> MistralReasoningParser:
    return MistralReasoningParser(marker_tokenizer)


@pytest.mark.parametrize("name", CASES)
def test_recorded_output(parser: MistralReasoningParser, name: str) -> None:
    check(parser, *CASES[name])


@pytest.mark.parametrize("name", CASES)
def test_without_tokenizer(name: str) -> None:
    check(MistralReasoningParser(None), *CASES[name])


def test_markers_split_across_chunks(parser: MistralReasoningParser) -> None:
    deltas = stream_chunks(parser, ["[TH", "INK]Hmm", ".[/TH", "INK]Yes", "."])
    assert deltas == [("", ""), ("Hmm", ""), (".", ""), ("", "Yes"), ("", ".")]
    deltas = stream_chunks(parser, ["Hi [", "/THINK] there"])
    assert deltas == [("", "Hi "), ("", " there")]


def test_content_tail_that_may_be_a_marker_is_held_back(parser: MistralReasoningParser) -> None:
    assert parser.parse("Hello [THI", final=False) == ReasoningParse(None, "Hello ")
    assert parser.parse("Hello [/TH", final=False) == ReasoningParse(None, "Hello ")
    assert parser.parse("Hello [x", final=False) == ReasoningParse(None, "Hello [x")
    assert parser.parse("[THINK]r[/THINK]a [THI", final=False) == ReasoningParse("r", "a [THI")
    assert parser.keep_special_tokens is True
