"""Model outputs the parser suites stream through every parser: recorded outputs of the formats
the kit knows, the malformed outputs made from them, and :class:`ParserSample`, how a parser
offers outputs of its own (its ``conformance_samples`` class attribute).

Every parser is checked on every recorded output, whatever its format: a text in another
format is just text to it, and must stream as it parses whole all the same.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import EllipsisType
from typing import Any

__all__ = ["KNOWN_MARKERS", "RECORDED", "TOOLS", "ParserSample", "malformed_samples", "markup_spans"]


@dataclass(frozen=True)
class ParserSample:
    """A model output for the parser suites, and optionally what the parser must make of it.

    A parser class offers its own as ``conformance_samples = [ParserSample(...), ...]`` (plain
    strings are taken too): ``llmp plugins verify`` streams them like the kit's recorded outputs
    and compares the whole parse with every expectation given. Leave an expectation out (``...``)
    to leave it unchecked.

    - ``content``: the text outside tool calls (tool parsers) or the answer (reasoning parsers);
    - ``calls``: ``(name, arguments)`` pairs in order; arguments as a dict are compared with the
      parsed JSON, as a string with the text exactly;
    - ``reasoning``: the reasoning (``None``: the output has none);
    - ``tools``: the request's OpenAI tool definitions, given to a tool parser;
    - ``in_reasoning``: what the prompt said, given to a reasoning parser (``True``: the chat
      template opened the reasoning).
    """

    text: str
    name: str = ""
    content: str | EllipsisType = ...
    calls: Sequence[tuple[str, Mapping[str, Any] | str]] | EllipsisType = ...
    reasoning: str | None | EllipsisType = ...
    tools: Sequence[Mapping[str, Any]] = field(default=(), compare=False)
    in_reasoning: bool | None = None

    @property
    def label(self) -> str:
        return self.name or _excerpt(self.text, 40)


def _excerpt(text: str, size: int = 60) -> str:
    return repr(text if len(text) <= size else text[: size - 1] + "…")


def _tool(name: str, **properties: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": properties, "required": list(properties)[:1]},
        },
    }


# The request's tools for every recorded output (parsers that convert argument types read their schemas).
TOOLS: list[dict[str, Any]] = [
    _tool("get_weather", city={"type": "string"}, unit={"type": "string", "enum": ["celsius", "fahrenheit"]}),
    _tool("get_time", tz={"type": "string"}),
    _tool("search", query={"type": "string"}, limit={"type": "integer"}, filters={"type": "object"}),
    _tool("write_file", path={"type": "string"}, content={"type": "string"}),
]

# Markers of the formats the kit knows: the tokenizer the suites give parsers holds each as one
# token (as real models' tokenizers do), and random chunkings are drawn to split inside them.
KNOWN_MARKERS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<think>",
    "</think>",
    "[THINK]",
    "[/THINK]",
)

# Markup of any format (tags, bracketed control words, fences): where marker splits are drawn.
_MARKUP = re.compile(r"<[^<>\s]{1,40}>|<\|[a-z_]+\|>|\[[A-Z_/]{2,16}\]|```(?:json)?")


def markup_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every piece of markup in ``text``."""
    return [match.span() for match in _MARKUP.finditer(text)]


def _hermes(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def _deepseek(*calls: tuple[str, str]) -> str:
    body = "\n".join(
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{arguments}\n```<｜tool▁call▁end｜>"
        for name, arguments in calls
    )
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def _qwen3_xml(name: str, *parameters: tuple[str, str]) -> str:
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in parameters)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


_PARIS = '{"city": "Paris", "unit": "celsius"}'
_TRICKY = '{"query": "x}</tool_call>[TOOL_CALLS]```\\"{", "filters": {"tags": ["a", "é🙂"], "n": null}, "limit": 3}'


def _recorded() -> list[ParserSample]:
    s = ParserSample
    return [
        # plain answers: no format's markup
        s("Hello! How can I help you today?", "plain/greeting"),
        s("答え：東京 🚀 — Zürich, naïve café; emoji 👩‍👩‍👧 and עברית.", "plain/unicode"),
        s('Use `json.loads("{}")`; brackets [1, 2] and {"answer": 42} are text here.\n', "plain/brackets"),
        s('{"answer": 42, "unit": "m"}', "plain/json-answer"),
        s("def add(a, b):\n    return [a, {'b': b}]\n", "plain/code"),
        # hermes: Hermes 2 Pro, Qwen2.5, Qwen3
        s("Let me look that up.\n" + _hermes("get_weather", _PARIS), "hermes/content-then-call"),
        s(_hermes("get_weather", _PARIS) + "\n" + _hermes("get_time", '{"tz": "Asia/Tokyo"}'), "hermes/two-calls"),
        s(_hermes("search", _TRICKY), "hermes/markers-inside-strings"),
        s('<tool_call>\n{"arguments": {}, "name": "get_time"}\n</tool_call>', "hermes/arguments-first"),
        s(_hermes("get_time", '"{\\"tz\\": \\"UTC\\"}"'), "hermes/arguments-as-a-json-string"),
        # llama3_json: Llama 3.1, 3.2
        s('<|python_tag|>{"name": "get_weather", "parameters": ' + _PARIS + "}", "llama3_json/python-tag"),
        s(
            '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}',
            "llama3_json/two-calls",
        ),
        s('{"name": "get_time", "parameters": null}', "llama3_json/null-parameters"),
        # mistral: before tokenizer v11, and v11 and later
        s('[TOOL_CALLS] [{"name": "get_weather", "arguments": ' + _PARIS + "}]", "mistral/array"),
        s(
            '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}',
            "mistral/v11-two-calls",
        ),
        s("[TOOL_CALLS]search[ARGS]" + _TRICKY, "mistral/v11-markers-inside-strings"),
        # deepseek_v3: DeepSeek-V3, R1-0528
        s("Let me check." + _deepseek(("get_weather", _PARIS), ("get_time", "{}")), "deepseek_v3/two-calls"),
        s(_deepseek(("search", _TRICKY)), "deepseek_v3/markers-inside-strings"),
        # pythonic: Llama 3.2, Llama 4, ToolACE
        s("[get_weather(city='San Francisco', unit='celsius')]", "pythonic/one-call"),
        s(
            "[\n  search(query=\"f(x), g(y)]\", limit=3, filters={'tags': ['a', \"b's\"], 'n': None}),\n"
            '  get_time(tz="Europe/Paris")\n]',
            "pythonic/two-calls",
        ),
        # qwen3_xml: Qwen3-Coder
        s(
            "Sure." + _qwen3_xml("get_weather", ("city", "Dallas"), ("unit", "fahrenheit")),
            "qwen3_xml/content-then-call",
        ),
        s(
            _qwen3_xml("write_file", ("path", "a.py"), ("content", 'if a < b and "<x>" != c:\n    print(a)'))
            + "\n"
            + _qwen3_xml("search", ("query", "llmp"), ("limit", "5")),
            "qwen3_xml/two-calls",
        ),
        # reasoning: <think> written by the model (Qwen3), opened by the prompt (DeepSeek-R1,
        # Qwen3-2507), [THINK] (Magistral)
        s(
            "<think>\nThe user greets me. I should greet back.\n</think>\n\nHello! How can I help?",
            "think/reasoning-then-answer",
        ),
        s(
            "Okay, 17 * 23 = 391.\n</think>\n\n17 × 23 = **391**.",
            "think/prompt-opened",
            in_reasoning=True,
        ),
        s("<think>\nLet me count: 1, 2, 3", "think/cut-off-by-max-tokens"),
        s("<think>\n東京 🙂 Zürich\n</think>\n\n答え：東京 🚀", "think/unicode"),
        s("<think>\n\n</think>\n\nWrap it in <think>...</think> tags.", "think/empty-then-markers-in-answer"),
        s("[THINK]2 + 2 is 4, nothing tricky.[/THINK]The answer is **4**.", "THINK/reasoning-then-answer"),
        s("Before\n[THINK]a section[/THINK]\nThe rest", "THINK/content-before"),
        # reasoning, then a tool call
        s(
            "<think>\nThe user wants the weather; I will call the tool.\n</think>\n\n" + _hermes("get_weather", _PARIS),
            "think+hermes",
        ),
    ]


RECORDED: list[ParserSample] = _recorded()
"""The recorded outputs every parser is streamed on (all complete, well-formed in their format)."""

# what the mangler inserts: marker pieces, JSON pieces, text that is hard to get right
_FRAGMENTS = [
    *KNOWN_MARKERS,
    "<tool",
    "</th",
    "[TOOL",
    "[/",
    "<｜tool",
    "```",
    "```json",
    "<function=",
    "<parameter=",
    "{",
    "}",
    "[",
    "]",
    '"',
    ":",
    ",",
    ";",
    "\\",
    '"name": "f"',
    "null",
    " ",
    "\n",
    "é",
    "🙂",
    "\ufffd",
    "\u200d",
]

# malformed outputs that do not come from mangling: empty, truncated markers, bad JSON, unusual characters
_FIXED_MALFORMED = [
    "",
    " ",
    "\n\n",
    "<",
    "[",
    "{",
    "<tool_call>",
    "<tool_call>\n{bad json}\n</tool_call>",
    '<tool_call>{"name": "get_time", "arguments": {"tz": }}</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Par',
    '<tool_call>{"name": 7, "arguments": {}}</tool_call>',
    "[TOOL_CALLS]",
    "[TOOL_CALLS] not json",
    '[TOOL_CALLS][{"name": "f", "arguments": {"a": [1, }]',
    "<|python_tag|>",
    '{"name": "get_time", "parameters": ',
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function",
    "[get_weather(city=",
    "[get_weather(city='Paris', 1 +)]",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
    "<think>",
    "</think>",
    "<think></think></think><think>",
    "[THINK][THINK][/THINK][/THINK]",
    "\ufffd\ufffd \x00 \u202eabc\u202c e\u0301 👩‍👩‍👧",
]


def malformed_samples(count: int = 24, relevant: Sequence[ParserSample] = ()) -> list[ParserSample]:
    """Malformed outputs: the fixed ones, then ``count`` made from the recorded outputs (and half as
    many from the ``relevant`` samples: those of the parser's format) by seeded mangling: cut short,
    often inside a marker; spans deleted; JSON objects broken; marker and JSON fragments inserted.
    A mangled sample's name gives its seed and the sample it came from."""
    samples = [ParserSample(text, f"malformed/{k}") for k, text in enumerate(_FIXED_MALFORMED)]
    samples += _mangled(RECORDED, count, seed_base=0)
    if relevant:
        samples += _mangled(relevant, count // 2, seed_base=1000)
    return samples


def _break_json(text: str, rng: random.Random) -> str:
    """A JSON object of ``text`` (if any) with a quote, colon or comma gone, or a stray comma: still
    bracketed as an object, no longer JSON."""
    opening = [at for at, char in enumerate(text) if char == "{"]
    if not opening:
        return text
    start = rng.choice(opening)
    inside = [at for at in range(start + 1, min(len(text), start + 40)) if text[at] in '":,']
    if inside and rng.random() < 0.7:
        at = rng.choice(inside)
        return text[:at] + text[at + 1 :]
    return text[: start + 1] + "," + text[start + 1 :]


def _mangled(sources: Sequence[ParserSample], count: int, seed_base: int) -> list[ParserSample]:
    samples = []
    for seed in range(seed_base, seed_base + count):
        rng = random.Random(seed)
        source = rng.choice(sources)
        text = source.text
        for _ in range(rng.randint(1, 3)):
            action = rng.random()
            if action < 0.35:  # cut short, inside a marker when there is one
                spans = markup_spans(text)
                if spans:
                    start, end = rng.choice(spans)
                    text = text[: rng.randint(start + 1, max(start + 1, end - 1))]
                else:
                    text = text[: rng.randint(0, len(text))]
            elif action < 0.5:
                at = rng.randint(0, len(text))
                text = text[:at] + text[at + rng.randint(1, 8) :]
            elif action < 0.7:
                text = _break_json(text, rng)
            else:
                at = rng.randint(0, len(text))
                text = text[:at] + rng.choice(_FRAGMENTS) + text[at:]
        name = f"mangled/{seed} (seed {seed}, from {source.label})"
        samples.append(ParserSample(text, name, tools=source.tools, in_reasoning=source.in_reasoning))
    return samples
