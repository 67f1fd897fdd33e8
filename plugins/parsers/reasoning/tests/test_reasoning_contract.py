"""The streaming contract on many texts built from marker pieces, and registration."""

from __future__ import annotations

import itertools

import pytest
from llmp_parsers_reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from llmp_parsers_reasoning.mistral import MistralReasoningParser
from llmp_parsers_reasoning.qwen3 import Qwen3ReasoningParser

from llmp import registry
from llmp.api import ReasoningParse

PARSERS = [DeepSeekR1ReasoningParser, Qwen3ReasoningParser, MistralReasoningParser]
PIECES = ["<think>", "</think>", "[THINK]", "[/THINK]", "<th", "[/", "\n", "a", " é"]


def _extends(later: ReasoningParse, earlier: ReasoningParse) -> bool:
    if earlier.reasoning is not None and (later.reasoning is None or not later.reasoning.startswith(earlier.reasoning)):
        return False
    return later.content.startswith(earlier.content)


@pytest.mark.parametrize("in_reasoning", [None, True])
@pytest.mark.parametrize("parser_class", PARSERS)
def test_results_only_grow(parser_class, in_reasoning) -> None:
    """Every prefix's result is extended by the next one's and, at the end, by the whole parse."""
    parser = parser_class(None)
    for pieces in itertools.product(PIECES, repeat=3):
        text = "".join(pieces)
        before = ReasoningParse(None, "")
        for end in range(len(text) + 1):
            now = parser.parse(text[:end], final=False, in_reasoning=in_reasoning)
            assert _extends(now, before), (text[:end], before, now)
            before = now
        whole = parser.parse(text, final=True, in_reasoning=in_reasoning)
        assert _extends(whole, before), (text, before, whole)


@pytest.mark.parametrize(
    "name, parser_class",
    [
        ("deepseek_r1", DeepSeekR1ReasoningParser),
        ("qwen3", Qwen3ReasoningParser),
        ("mistral", MistralReasoningParser),
    ],
)
def test_registered(name, parser_class) -> None:
    assert registry.load_component("reasoning_parser", name) is parser_class
    spec = registry.get_component("reasoning_parser", name)
    assert spec.distribution == "llmp-parsers-reasoning" and spec.description


def test_find_marker_is_str_find() -> None:
    import random

    from llmp_parsers_reasoning.base import find_marker

    rnd = random.Random(0)
    for _ in range(5000):
        text = "".join(rnd.choice(["<", "</think>", "a", "[", "[/THINK]"]) for _ in range(rnd.randint(0, 40)))
        for marker in ("</think>", "<think>", "[/THINK]"):
            start = rnd.randint(0, 6)
            assert find_marker(text, marker, start) == text.find(marker, start), (text, marker, start)
