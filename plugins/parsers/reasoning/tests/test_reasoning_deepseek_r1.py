"""deepseek_r1: the completion is reasoning until </think> (the template opened <think>)."""

from __future__ import annotations

import pytest
from llmp_parsers_reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from reasoning_parsers_support import check, stream_chunks

from llmp.api import ReasoningParse

# (text, in_reasoning, reasoning, content): completions as DeepSeek-R1 writes them. The server passes
# in_reasoning=True after R1's template (which ends the prompt with "<think>\n"); None reads the same.
CASES = {
    "reasoning-then-answer": (
        (
            "Okay, the user wants 17 * 23. 17 * 20 = 340 and 17 * 3 = 51, so 340 + 51 = 391.\n</think>\n\n"
            "17 × 23 = **391**."
        ),
        True,
        "Okay, the user wants 17 * 23. 17 * 20 = 340 and 17 * 3 = 51, so 340 + 51 = 391.\n",
        "\n\n17 × 23 = **391**.",
    ),
    "reasoning-then-answer-no-prompt-state": (
        "Let me check.\n</think>\n\nYes.",
        None,
        "Let me check.\n",
        "\n\nYes.",
    ),
    "cut-off-by-max-tokens": (
        "Okay, so I need to find the derivative of x^3. Using the power rule, that's 3x^2. Wait, let me",
        True,
        "Okay, so I need to find the derivative of x^3. Using the power rule, that's 3x^2. Wait, let me",
        "",
    ),
    "cut-off-in-end-marker": ("Almost done.</thi", True, "Almost done.</thi", ""),
    "model-writes-start-marker": (
        "<think>\nHmm, a greeting.\n</think>\n\nHi!",
        None,
        "\nHmm, a greeting.\n",
        "\n\nHi!",
    ),
    "whitespace-before-start-marker": (
        "\n<think>This is a reasoning section</think>\nThis is the rest",
        True,
        "This is a reasoning section",
        "\nThis is the rest",
    ),
    "start-marker-cut-off": ("<think", True, "<think", ""),
    "no-reasoning-prompt-closed-it": ("The answer is 4.", False, None, "The answer is 4."),
    "empty-completion": ("", True, "", ""),
    "empty-reasoning": ("<think>\n\n</think>\n\nAnswer", True, "\n\n", "\n\nAnswer"),
    "end-marker-first": ("</think>This is the rest", True, "", "This is the rest"),
    "reasoning-only": ("This is a reasoning section</think>", None, "This is a reasoning section", ""),
    "unicode": (
        "東京は日本の首都です 🙂。Café, naïve — ok.</think>\n\n答え：東京 🚀",
        True,
        "東京は日本の首都です 🙂。Café, naïve — ok.",
        "\n\n答え：東京 🚀",
    ),
    "answer-mentions-markers": (
        "They ask about tags.\n</think>\n\nWrap thoughts in <think> and close them with </think>.",
        True,
        "They ask about tags.\n",
        "\n\nWrap thoughts in <think> and close them with </think>.",
    ),
    "start-marker-later-is-text": ("a <think> b</think>c", True, "a <think> b", "c"),
}


@pytest.fixture(scope="module")
def parser(marker_tokenizer) -> DeepSeekR1ReasoningParser:
    return DeepSeekR1ReasoningParser(marker_tokenizer)


@pytest.mark.parametrize("name", CASES)
def test_recorded_output(parser: DeepSeekR1ReasoningParser, name: str) -> None:
    check(parser, *CASES[name])


@pytest.mark.parametrize("name", CASES)
def test_without_tokenizer(name: str) -> None:
    check(DeepSeekR1ReasoningParser(None), *CASES[name])


def test_markers_split_across_chunks(parser: DeepSeekR1ReasoningParser) -> None:
    deltas = stream_chunks(parser, ["Let me see.</th", "ink>\n\nIt is", " 4."], in_reasoning=True)
    assert deltas == [("Let me see.", ""), ("", "\n\nIt is"), ("", " 4.")]
    deltas = stream_chunks(parser, ["\n", "<th", "ink>", "Hmm.<", "/think", ">OK"], in_reasoning=True)
    assert deltas == [("", ""), ("", ""), ("", ""), ("Hmm.", ""), ("", ""), ("", "OK")]


def test_prefix_reports_only_what_cannot_change(parser: DeepSeekR1ReasoningParser) -> None:
    assert parser.parse("Thinking </thin", final=False, in_reasoning=True) == ReasoningParse("Thinking ", "")
    assert parser.parse("Thinking </thin", final=True, in_reasoning=True) == ReasoningParse("Thinking </thin", "")
    # the beginning could still be "<think>": nothing yet, but reasoning it is
    assert parser.parse(" <thi", final=False) == ReasoningParse("", "")
    assert parser.parse(" <thx", final=False) == ReasoningParse(" <thx", "")
    # after the end marker nothing is held back
    assert parser.parse("r</think>a </thi", final=False) == ReasoningParse("r", "a </thi")
