"""The marker logic the parsers here share: reasoning between a start and an end marker.

A completion is read as ``[content-before] [start] reasoning [end] content-after``;
which parts can be there depends on how the reasoning opens (:attr:`ThinkingReasoningParser.opening`):

* ``"assumed"``: the completion starts inside the reasoning (the template put the start
  marker in the prompt). A start marker of its own at the very beginning (after optional
  whitespace, which is dropped with it) is skipped; no end marker means all of it is reasoning.
* ``"leading"``: reasoning only if the completion begins (after optional whitespace) with the
  start marker; otherwise all of it is content, taken verbatim.
* ``"anywhere"``: content until the first start marker, reasoning until the next end marker,
  then content again; the two content parts are joined.

``parse(..., in_reasoning=True)`` always reads the completion as ``"assumed"``;
``in_reasoning=None`` uses the parser's own :attr:`opening`; ``in_reasoning=False`` (the
prompt closed the reasoning) makes all of it content.

Once the reasoning has ended everything after the end marker is content, verbatim: nothing
is stripped (the newlines models put after the end marker included, as vLLM does) and later
markers are text. The reasoning between the markers is verbatim as well.

While streaming (``final=False``) a result holds back what later text could still change: a
reasoning tail that could be the start of the end marker, a content tail that could be the
start of a marker the parser looks for in content (``"anywhere"`` only), and the beginning of
a completion that could still become a leading start marker. Later results extend earlier
ones, so ``llmp.parsing.MessageStream``'s deltas add up to the whole parse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from llmp.api import ReasoningParse
from llmp.parsing import held_back, skip_whitespace

Opening = Literal["assumed", "leading", "anywhere"]


def find_marker(text: str, marker: str, start: int = 0) -> int:
    """``text.find(marker, start)``, faster on long texts where the marker's first character is rare.

    ``parse`` runs on every longer prefix of a completion, so this search runs once per token
    over the whole reasoning. A one-character search is a ``memchr``, many times faster than
    CPython's substring search; a few candidates are checked that way before falling back to it.
    """
    first = marker[0]
    for _ in range(16):
        start = text.find(first, start)
        if start < 0 or text.startswith(marker, start):
            return start
        start += 1
    return text.find(marker, start)


class ThinkingReasoningParser:
    """A reasoning parser for a pair of text markers (see the module docstring).

    Subclasses set the class attributes; an instance holds only what it derives from the
    tokenizer, so one instance serves every request.
    """

    start_marker: ClassVar[str] = "<think>"
    end_marker: ClassVar[str] = "</think>"
    #: how the reasoning opens when the prompt says nothing (``in_reasoning=None``)
    opening: ClassVar[Opening] = "assumed"
    #: ``"anywhere"`` only: an end marker in the content before any start marker is dropped
    drop_stray_end: ClassVar[bool] = False
    #: the markers are special tokens of the models' tokenizers: the server must detokenize
    #: with special tokens for ``parse`` to see them
    keep_special_tokens: ClassVar[bool] = False

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.start_token_ids: tuple[int, ...] = ()
        self.end_token_ids: tuple[int, ...] = ()
        self._turn_ids: frozenset[int] = frozenset()
        self._turn_texts: tuple[str, ...] = ()
        if tokenizer is None:
            return
        self.start_token_ids = tuple(tokenizer.encode(self.start_marker, add_special_tokens=False))
        self.end_token_ids = tuple(tokenizer.encode(self.end_marker, add_special_tokens=False))
        # Special tokens other than the markers delimit turns (<|im_start|>, <｜Assistant｜>, [INST], eos ...).
        special = dict.fromkeys(getattr(tokenizer, "all_special_ids", ()) or ())
        for token_id, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
            if getattr(token, "special", False):
                special[token_id] = None
        markers = {*self.start_token_ids, *self.end_token_ids}
        self._turn_ids = frozenset(i for i in special if i not in markers)
        texts = tokenizer.convert_ids_to_tokens(sorted(self._turn_ids)) if self._turn_ids else []
        self._turn_texts = tuple(t for t in texts if t and t not in (self.start_marker, self.end_marker))

    # -- the completion ------------------------------------------------------

    def parse(self, text: str, *, final: bool, in_reasoning: bool | None = None) -> ReasoningParse:
        if in_reasoning is False:
            return ReasoningParse(None, text)
        opening = "assumed" if in_reasoning else self.opening
        if opening == "anywhere":
            return self._parse_anywhere(text, final)
        begin = self._after_leading_start(text, final)
        if begin is None:  # too short to tell whether it opens with the start marker
            return ReasoningParse("" if opening == "assumed" else None, "")
        if begin < 0:
            if opening == "leading":
                return ReasoningParse(None, text)
            begin = 0
        return self._reasoning_from(text, begin, final, before="")

    def _after_leading_start(self, text: str, final: bool) -> int | None:
        """Index just past a leading start marker (after optional whitespace); -1 when there is
        none; None when a prefix (``final=False``) is still a start of one."""
        pos = skip_whitespace(text, 0)
        rest = text[pos:]
        if rest.startswith(self.start_marker):
            return pos + len(self.start_marker)
        if not final and self.start_marker.startswith(rest):
            return None
        return -1

    def _reasoning_from(self, text: str, begin: int, final: bool, before: str) -> ReasoningParse:
        """Reasoning from ``text[begin]`` to the end marker, then content (after ``before``)."""
        # Indices into text rather than a copy of its tail: parse runs on every longer prefix.
        end = find_marker(text, self.end_marker, begin)
        if end < 0:
            stop = len(text)
            if not final:
                stop -= min(held_back(text, (self.end_marker,)), len(text) - begin)
            return ReasoningParse(text[begin:stop], before)
        return ReasoningParse(text[begin:end], before + text[end + len(self.end_marker) :])

    def _parse_anywhere(self, text: str, final: bool) -> ReasoningParse:
        content: list[str] = []
        pos = 0
        while True:
            start = find_marker(text, self.start_marker, pos)
            stray = find_marker(text, self.end_marker, pos) if self.drop_stray_end else -1
            if stray >= 0 and (start < 0 or stray < start):
                content.append(text[pos:stray])
                pos = stray + len(self.end_marker)
                continue
            if start >= 0:
                content.append(text[pos:start])
                return self._reasoning_from(text, start + len(self.start_marker), final, before="".join(content))
            tail = text[pos:]
            if not final:
                markers = (self.start_marker, self.end_marker) if self.drop_stray_end else (self.start_marker,)
                tail = tail[: len(tail) - held_back(tail, markers)]
            content.append(tail)
            return ReasoningParse(None, "".join(content))

    # -- the prompt ----------------------------------------------------------

    def prompt_state(self, prompt_token_ids: Sequence[int]) -> bool | None:
        """What the last marker of the prompt says about the completion.

        * the last marker is a start marker: ``True`` (the template opened the reasoning);
        * the last marker is an end marker and no special token follows it: ``False`` (the
          template closed the reasoning of the turn being generated, as Qwen3's
          ``enable_thinking=False`` does with ``<think>\\n\\n</think>\\n\\n``, or the prompt
          continues an answer written after the reasoning);
        * the last marker is an end marker followed by a special token (a turn delimiter such
          as ``<|im_end|>``, ``<|im_start|>``, ``[INST]`` or eos): ``None``, the closed block
          belongs to an earlier turn and says nothing about this one;
        * no marker: ``None``.

        Markers that are one token each are found by id; longer ones in the decoded prompt.
        Without a tokenizer: ``None``.
        """
        if not self.start_token_ids or not self.end_token_ids:
            return None
        if len(self.start_token_ids) == 1 and len(self.end_token_ids) == 1:
            return self._state_by_ids(list(prompt_token_ids))
        return self._state_by_text(self.tokenizer.decode(list(prompt_token_ids), skip_special_tokens=False))

    def _state_by_ids(self, ids: list[int]) -> bool | None:
        start_id, end_id = self.start_token_ids[0], self.end_token_ids[0]
        for pos in range(len(ids) - 1, -1, -1):
            token = ids[pos]
            if token == start_id:
                return True
            if token == end_id:
                return None if any(t in self._turn_ids for t in ids[pos + 1 :]) else False
        return None

    def _state_by_text(self, text: str) -> bool | None:
        start, end = text.rfind(self.start_marker), text.rfind(self.end_marker)
        if start < 0 and end < 0:
            return None
        if start > end:
            return True
        tail = text[end + len(self.end_marker) :]
        return None if any(t in tail for t in self._turn_texts) else False
