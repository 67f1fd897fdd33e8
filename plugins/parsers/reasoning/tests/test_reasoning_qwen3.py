"""qwen3: reasoning when the completion opens with <think> or the prompt opened it."""

from __future__ import annotations

import pytest
from llmp_parsers_reasoning.qwen3 import Qwen3ReasoningParser
from reasoning_parsers_support import check, stream_chunks

from llmp.api import ReasoningParse

# (text, in_reasoning, reasoning, content): Qwen3 writes <think> itself (in_reasoning None: the prompt
# says nothing); Qwen3-2507 thinking templates open it in the prompt (True).
CASES = {
    "reasoning-then-answer": (
        (
            "<think>\nThe user greets me. I should greet back and offer help.\n</think>\n\n"
            "Hello! How can I help you today?"
        ),
        None,
        "\nThe user greets me. I should greet back and offer help.\n",
        "\n\nHello! How can I help you today?",
    ),
    "cut-off-by-max-tokens": ("<think>\nLet me count: 1, 2, 3", None, "\nLet me count: 1, 2, 3", ""),
    "prompt-opened-2507": (
        "Okay, 6 * 7 is 42.\n</think>\n\nThe answer is 42.",
        True,
        "Okay, 6 * 7 is 42.\n",
        "\n\nThe answer is 42.",
    ),
    "prompt-opened-cut-off": ("Okay, 6 * 7 is", True, "Okay, 6 * 7 is", ""),
    "prompt-opened-model-repeats-start": ("<think>\nOkay.\n</think>\n\nDone.", True, "\nOkay.\n", "\n\nDone."),
    "no-reasoning": ("Hello! How can I help?", None, None, "Hello! How can I help?"),
    "no-reasoning-enable-thinking-false": ("Hello! How can I help?", False, None, "Hello! How can I help?"),
    "no-reasoning-mentions-markers": ("Use <think> and </think>.", None, None, "Use <think> and </think>."),
    "no-reasoning-end-marker-first": ("</think>x", None, None, "</think>x"),
    "no-reasoning-start-marker-cut-off": ("  <th", None, None, "  <th"),
    "whitespace-only": ("\n\n", None, None, "\n\n"),
    "empty-completion": ("", None, None, ""),
    "empty-reasoning": ("<think>\n\n</think>\n\nAnswer", None, "\n\n", "\n\nAnswer"),
    "whitespace-before-start-marker": ("\n<think>r</think>\nrest", None, "r", "\nrest"),
    "unicode": (
        "<think>\n用户在问首都。東京 🙂\n</think>\n\n答え：東京 🚀 Zürich",
        None,
        "\n用户在问首都。東京 🙂\n",
        "\n\n答え：東京 🚀 Zürich",
    ),
    "answer-mentions-markers": (
        "<think>\nshort\n</think>\n\nWrap it in <think>...</think> tags.",
        None,
        "\nshort\n",
        "\n\nWrap it in <think>...</think> tags.",
    ),
}


@pytest.fixture(scope="module")
def parser(marker_tokenizer) -> Qwen3ReasoningParser:
    return Qwen3ReasoningParser(marker_tokenizer)


@pytest.mark.parametrize("name", CASES)
def test_recorded_output(parser: Qwen3ReasoningParser, name: str) -> None:
    check(parser, *CASES[name])


@pytest.mark.parametrize("name", CASES)
def test_without_tokenizer(name: str) -> None:
    check(Qwen3ReasoningParser(None), *CASES[name])


def test_markers_split_across_chunks(parser: Qwen3ReasoningParser) -> None:
    deltas = stream_chunks(parser, ["<th", "ink>\nHmm", "</thi", "nk>\n\nOK"])
    assert deltas == [("", ""), ("\nHmm", ""), ("", ""), ("", "\n\nOK")]
    deltas = stream_chunks(parser, ["\n", "<thi", "s is plain", " text"])
    assert deltas == [("", ""), ("", ""), ("", "\n<this is plain"), ("", " text")]


def test_prefix_too_short_to_tell_is_held_back(parser: Qwen3ReasoningParser) -> None:
    for prefix in ("", " ", "\n\n", "<", "<think", " \n<thi"):
        assert parser.parse(prefix, final=False) == ReasoningParse(None, "")
    assert parser.parse("<think>", final=False) == ReasoningParse("", "")
    assert parser.parse("<tx", final=False) == ReasoningParse(None, "<tx")
    # prompt-opened: reasoning from the first character, held back only while it may be "<think>"
    assert parser.parse("<th", final=False, in_reasoning=True) == ReasoningParse("", "")
    assert parser.parse("ok </th", final=False, in_reasoning=True) == ReasoningParse("ok ", "")
