"""Mangled and truncated outputs (seeded, deterministic): whatever the text, streamed results only grow.

Well-formed outputs of each format are cut, have spans deleted and marker fragments inserted; at every
prefix the streaming parse must extend the previous one, and the final parse of that prefix (a completion
cut off there) must extend it too. A sample is also checked through ``assert_streams_agree``.
"""

from __future__ import annotations

import random

import pytest
from llmp_parsers_tools.deepseek import DeepSeekV3ToolParser
from llmp_parsers_tools.hermes import HermesToolParser
from llmp_parsers_tools.llama import Llama3JsonToolParser
from llmp_parsers_tools.mistral import MistralToolParser
from parsers_tools_support import assert_grows

from llmp.testing import assert_streams_agree

ARGUMENTS = [
    "{}",
    '{"a": 1}',
    '{"q": "x}</tool_call>;[TOOL_CALLS]```<｜tool▁call▁end｜>\\"{"}',
    '{"l": [1, {"b": null}], "u": "é🙂"}',
    '"{\\"a\\": 2}"',
    "null",
]
JSON_BITS = ["{", "}", "[", "]", ":", ",", '"', '"name"', '"f"', "1", "null", " ", "\n", "hi"]


def _hermes(rng: random.Random, k: int) -> str:
    return "".join(
        f'<tool_call>\n{{"name": "f{i}", "arguments": {rng.choice(ARGUMENTS)}}}\n</tool_call>\n'
        if rng.random() < 0.7
        else f'<tool_call>{{"arguments": {rng.choice(ARGUMENTS)}, "name": "g"}}</tool_call>'
        for i in range(k)
    )


def _llama(rng: random.Random, k: int) -> str:
    calls = "; ".join(f'{{"name": "f{i}", "parameters": {rng.choice(ARGUMENTS)}}}' for i in range(k))
    return rng.choice(["", "<|python_tag|>", " "]) + calls


def _mistral(rng: random.Random, k: int) -> str:
    if rng.random() < 0.5:
        return (
            "[TOOL_CALLS] ["
            + ", ".join(f'{{"name": "f{i}", "arguments": {rng.choice(ARGUMENTS)}}}' for i in range(k))
            + "]"
        )
    return "".join(
        f"[TOOL_CALLS]f{i}" + rng.choice(["[ARGS]", "", "[CALL_ID]abc123XYZ[ARGS]"]) + rng.choice(ARGUMENTS)
        for i in range(k)
    )


def _deepseek(rng: random.Random, k: int) -> str:
    return (
        "<｜tool▁calls▁begin｜>"
        + "\n".join(
            f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>f{i}\n```json\n{rng.choice(ARGUMENTS)}\n```<｜tool▁call▁end｜>"
            for i in range(k)
        )
        + "<｜tool▁calls▁end｜>"
    )


FORMATS = {
    "hermes": (HermesToolParser, _hermes, ["<tool_call>", "</tool_call>", "<tool"]),
    "llama3_json": (Llama3JsonToolParser, _llama, ["<|python_tag|>", ";", "<|py"]),
    "mistral": (MistralToolParser, _mistral, ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[TOOL", "get_x"]),
    "deepseek_v3": (
        DeepSeekV3ToolParser,
        _deepseek,
        [
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>",
            "```json",
            "```",
            "<｜tool",
        ],
    ),
}


def _samples(name: str, count: int) -> list[str]:
    _, build, markers = FORMATS[name]
    rng = random.Random(f"{name}-{count}")
    fragments = markers + JSON_BITS
    texts = []
    for _ in range(count):
        text = rng.choice(["", "Sure.\n", "\n\n", "hi <b>"]) + build(rng, rng.randint(0, 3))
        text += rng.choice(["", "\n", " done"])
        for _ in range(rng.randint(0, 3)):
            i = rng.randint(0, len(text))
            if rng.random() < 0.5:
                text = text[:i] + text[i + rng.randint(1, 6) :]
            else:
                text = text[:i] + rng.choice(fragments) + text[i:]
        texts.append(text)
    return texts


@pytest.mark.parametrize("name", FORMATS)
def test_mangled_outputs_never_take_back_what_was_streamed(name: str) -> None:
    parser = FORMATS[name][0](None)
    for text in _samples(name, 60):
        assert_grows(parser, text)


@pytest.mark.parametrize("name", FORMATS)
def test_mangled_outputs_stream_as_they_parse_whole(name: str) -> None:
    parser = FORMATS[name][0](None)
    for text in _samples(name, 6):
        assert_streams_agree(text, tool_parser=parser)
