"""Sampling parameters of one request, with vLLM's names, defaults and ranges.

Every invalid value raises :class:`SamplingParamsError` (a ``ValueError``) with
the field's name in ``field`` and its allowed range in the message, before any
work is queued.
"""

from __future__ import annotations

import copy
import enum
import math
from dataclasses import dataclass, field
from typing import Any

from llmp.api import RequestValidationError

CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class RequestOutputKind(enum.IntEnum):
    """vLLM's: what :meth:`llmp.AsyncLLM.generate` yields for a request. ``CUMULATIVE`` (the
    default): every output holds everything so far; ``DELTA``: only what is new since the last
    (as ``delta=True``); ``FINAL_ONLY``: only the finished output."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class SamplingParamsError(RequestValidationError):
    """An invalid sampling parameter; ``field`` names it (``top_p``, ``logit_bias``,
    ``max_tokens``), and ``message_for(name)`` is the message naming it ``name``."""


def resolve_max_tokens(max_tokens: int | None, prompt_len: int, max_model_len: int) -> int:
    """The number of tokens a request may generate: ``max_tokens``, or (unset) the rest of the context.

    The one rule for ``max_tokens=None``; raises :class:`SamplingParamsError` when the prompt
    and ``max_tokens`` do not fit in ``max_model_len``.
    """
    if max_tokens is not None and max_tokens > max_model_len:
        raise SamplingParamsError(
            "max_tokens", lambda name: f"{name}={max_tokens} cannot be greater than max_model_len={max_model_len}"
        )
    wanted = max_tokens if max_tokens is not None else 1
    if prompt_len + wanted > max_model_len:
        raise SamplingParamsError(
            "input_tokens",
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + wanted} tokens ({prompt_len} in the input, {wanted} for the completion). "
            "Please reduce the length of the input or of max_tokens.",
        )
    return max_tokens if max_tokens is not None else max_model_len - prompt_len


@dataclass(slots=True)
class StructuredOutputsParams:
    """Constrain a request's output (vLLM's ``structured_outputs``): exactly one of

    ``json`` (a JSON schema, as a dict or its text), ``regex``, ``choice`` (a
    list of strings), ``grammar`` (EBNF in xgrammar/GBNF form), ``json_object``
    (any JSON object) or ``structural_tag`` (xgrammar's structural tag, as JSON
    text). ``disable_any_whitespace`` makes JSON compact.

    ``after_token_ids``: the constraint starts once the output holds these tokens
    (a reasoning model's end-of-thinking marker): the reasoning stays free and the
    answer after it is constrained.
    """

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    after_token_ids: list[int] | None = None

    def __post_init__(self) -> None:
        given = [name for name in CONSTRAINTS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise SamplingParamsError(
                "structured_outputs",
                "structured_outputs takes exactly one constraint of json, regex, choice, grammar, "
                f"json_object and structural_tag; got {', '.join(given) or 'none'}",
            )
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) for c in self.choice)):
            raise SamplingParamsError(
                "structured_outputs", "structured_outputs.choice must be a non-empty list of strings"
            )
        for name in ("regex", "grammar", "structural_tag"):
            value = getattr(self, name)
            blank = not value if name == "regex" else not (value or "").strip()  # a regex of blanks is a regex
            if value is not None and (not isinstance(value, str) or blank):
                raise SamplingParamsError("structured_outputs", f"structured_outputs.{name} must be a non-empty string")
        if self.json is not None and not isinstance(self.json, str | dict):
            raise SamplingParamsError(
                "structured_outputs", "structured_outputs.json must be a JSON schema (an object or its text)"
            )

    @property
    def kind(self) -> str:
        return next(name for name in CONSTRAINTS if getattr(self, name) not in (None, False))


@dataclass(slots=True)
class ReasoningMarkers:
    """The tokens that open and close a reasoning model's thinking, which ``thinking_token_budget`` reads.

    ``end_token_ids``: the marker that ends the reasoning (``</think>``'s tokens); the engine emits it
    when the budget is spent. ``start_token_ids``: the marker that opens it; ``starts_inside``: the prompt
    already opened it (a thinking chat template ends the prompt with ``<think>``), so the output starts
    in the reasoning. A server fills this from its ``--reasoning-parser``; Python callers give it.
    """

    end_token_ids: list[int]
    start_token_ids: list[int] = field(default_factory=list)
    starts_inside: bool = False

    def __post_init__(self) -> None:
        for name in ("end_token_ids", "start_token_ids"):
            ids = getattr(self, name)
            if not isinstance(ids, list | tuple):
                raise SamplingParamsError("reasoning_markers", f"reasoning_markers.{name} must be a list of token ids")
            for token in ids:
                _at_least("reasoning_markers", token, 0, label=f"reasoning_markers.{name}[]")
        if not self.end_token_ids:
            raise SamplingParamsError("reasoning_markers", "reasoning_markers.end_token_ids must not be empty")
        if not self.start_token_ids and not self.starts_inside:
            raise SamplingParamsError(
                "reasoning_markers",
                "reasoning_markers needs start_token_ids, or starts_inside=True (the prompt opened the reasoning)",
            )


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = no top-k
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16  # None = the rest of the context
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # top tokens to return beside the chosen one; -1: the whole vocabulary
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None  # banned words; the engine bans their token sequences
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    detokenize: bool = True  # False: outputs carry token ids only (no text; logprobs without decoded tokens)
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's: at most this many tokens of reasoning (after the start marker, or from the first token when the
    # prompt opened it); then the engine emits the end marker and the answer follows. Needs reasoning_markers.
    thinking_token_budget: int | None = None
    reasoning_markers: ReasoningMarkers | None = None
    typical_p: float = 1.0  # llama.cpp's (Ollama's option) locally typical sampling; 1 = off
    # llama.cpp's repeat_last_n (Ollama's option): the three penalties read only the last N tokens of
    # prompt and output together; None = vLLM's (repetition over both, frequency and presence over the output)
    penalty_window: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE  # what AsyncLLM.generate yields (vLLM's)
    stop_strings: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Normalise and check every field (``SamplingParamsError``). Construction does it, and the
        engine again when it takes the request, so a field changed after construction counts too."""
        if isinstance(self.stop, str):  # one stop string is a list of one, as in vLLM
            self.stop = [self.stop]
        if self.stop is not None and not isinstance(self.stop, list | tuple):
            raise SamplingParamsError(
                "stop", lambda name: f"{name} must be a non-empty string or a list of them, got {self.stop!r}"
            )
        self.stop_strings = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        if self.seed == -1:  # vLLM's (and Ollama's) "no seed"
            self.seed = None
        self._validate()

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def clone(self) -> SamplingParams:
        """A deep copy, to change without touching this one (vLLM's ``clone``)."""
        return copy.deepcopy(self)

    def _validate(self) -> None:
        try:
            self.output_kind = RequestOutputKind(self.output_kind)
        except ValueError:
            raise SamplingParamsError(
                "output_kind", f"output_kind must be a RequestOutputKind (0, 1 or 2), got {self.output_kind!r}"
            ) from None
        _at_least("n", self.n, 1)
        _at_least("temperature", self.temperature, 0.0)
        _between("temperature", self.temperature, 0.0, 2.0)  # OpenAI's range, and vLLM's
        if self.n > 1 and self.is_greedy:
            raise SamplingParamsError(
                "n", lambda name: f"{name} must be 1 with greedy sampling (temperature 0): the choices would be alike"
            )
        _between("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _at_least("top_k", self.top_k, 0, note=" (0 or -1 disables it)")
        _between("min_p", self.min_p, 0.0, 1.0)
        _between("typical_p", self.typical_p, 0.0, 1.0)
        _between("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _between("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _greater("repetition_penalty", self.repetition_penalty, 0.0)
        if self.penalty_window is not None:
            _at_least("penalty_window", self.penalty_window, 1, note=" (None: the whole context)")
        if self.seed is not None:
            _integer("seed", self.seed)
        if self.max_tokens is not None:
            _at_least("max_tokens", self.max_tokens, 1)
        _at_least("min_tokens", self.min_tokens, 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise SamplingParamsError(
                "min_tokens", lambda name: f"{name} must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}"
            )
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise SamplingParamsError(
                "stop", lambda name: f"{name} must be a non-empty string or a list of them, got {self.stop!r}"
            )
        for token in self.stop_token_ids:
            _at_least("stop_token_ids", token, 0, label="stop_token_ids[]")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if isinstance(value, bool):  # vLLM's: True is 1 (the top token beside the chosen one)
                setattr(self, name, value := 1 if value else None)
            if value is not None:
                _at_least(name, value, -1, note=" (-1: every token of the vocabulary)")
        for token, bias in (self.logit_bias or {}).items():
            _at_least("logit_bias", token, 0, label="logit_bias key")
            _between("logit_bias", bias, -100.0, 100.0, label=f"logit_bias[{token}]")
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                raise SamplingParamsError("allowed_token_ids", lambda name: f"{name} must not be empty when given")
            for token in self.allowed_token_ids:
                _at_least("allowed_token_ids", token, 0, label="allowed_token_ids[]")
        for flag in (
            "ignore_eos",
            "include_stop_str_in_output",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "detokenize",
        ):
            value = getattr(self, flag)
            if not isinstance(value, bool):  # the engine's message would not carry it: refused here, not lost
                raise SamplingParamsError(
                    flag, lambda name, value=value: f"{name} must be true or false, got {value!r}"
                )
        if self.stop_strings and not self.detokenize:  # stop strings are found in the text
            raise SamplingParamsError("stop", lambda name: f"{name} strings need detokenize=True")
        if self.thinking_token_budget is not None:
            _at_least("thinking_token_budget", self.thinking_token_budget, 0)
            if self.reasoning_markers is None:
                raise SamplingParamsError(
                    "thinking_token_budget",
                    lambda name: (
                        f"{name} needs reasoning_markers (the tokens that open and close the reasoning): "
                        "a server sets them from its --reasoning-parser"
                    ),
                )
        elif self.reasoning_markers is not None:  # nothing else reads them: refused, not ignored
            raise SamplingParamsError(
                "reasoning_markers",
                lambda name: f"{name} are read only with thinking_token_budget, which is not set",
            )
        if self.bad_words is not None and (
            not isinstance(self.bad_words, list) or not all(isinstance(w, str) and w for w in self.bad_words)
        ):
            raise SamplingParamsError(
                "bad_words", lambda name: f"{name} must be a list of non-empty strings, got {self.bad_words!r}"
            )


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # what the engine's messages and tensors hold

# The checks below raise SamplingParamsError for ``field``; ``label`` is how the message names the
# value when it is part of the field (``logit_bias[42]``), else the message names the field itself.


def _number(field: str, value: object, label: str | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SamplingParamsError(field, lambda name: f"{label or name} must be a finite number, got {value!r}")
    return float(value)


def _integer(field: str, value: object, label: str | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SamplingParamsError(field, lambda name: f"{label or name} must be an integer, got {value!r}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise SamplingParamsError(
            field, lambda name: f"{label or name} must fit in 64 bits ({INT64_MIN} to {INT64_MAX}), got {value!r}"
        )
    return value


def _at_least(field: str, value: object, low: float, note: str = "", label: str | None = None) -> None:
    number = _integer(field, value, label) if isinstance(low, int) else _number(field, value, label)
    if number < low:
        raise SamplingParamsError(field, lambda name: f"{label or name} must be >= {low}{note}, got {value!r}")


def _greater(field: str, value: object, low: float) -> None:
    if _number(field, value) <= low:
        raise SamplingParamsError(field, lambda name: f"{name} must be > {low}, got {value!r}")


def _between(
    field: str, value: object, low: float, high: float, low_open: bool = False, label: str | None = None
) -> None:
    number = _number(field, value, label)
    if number > high or number < low or (low_open and number == low):
        bracket = "(" if low_open else "["
        raise SamplingParamsError(
            field, lambda name: f"{label or name} must be in {bracket}{low}, {high}], got {value!r}"
        )
