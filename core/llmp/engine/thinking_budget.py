"""``thinking_token_budget``: a sequence's reasoning is cut at that many tokens by emitting its end marker.

The engine keeps one :class:`ThinkingBudget` per sequence that asks for it, feeds it every sampled
token, and asks it before each step whether the next token is forced (the marker's next token, which
the sampler then gives that row whatever the logits say). The budget is the reasoning's whole length:
a second reasoning section the model opens after the budget is spent is closed at once.
"""

from __future__ import annotations

from llmp.sampling_params import ReasoningMarkers


class ThinkingBudget:
    def __init__(self, budget: int, markers: ReasoningMarkers) -> None:
        self.budget = budget
        self.start = tuple(markers.start_token_ids)
        self.end = tuple(markers.end_token_ids)
        self.inside = markers.starts_inside
        self.spent = 0  # reasoning tokens so far
        self.closing: int | None = None  # index in ``end`` of the next forced token, while the marker is emitted
        self._close_if_spent([])

    def forced_token(self) -> int | None:
        """The token the next step must produce (None: the model chooses)."""
        return self.end[self.closing] if self.closing is not None else None

    def accept(self, output_token_ids: list[int]) -> None:
        """After a token was appended to ``output_token_ids``."""
        if self.closing is not None:
            self.closing += 1
            if self.closing == len(self.end):
                self.closing, self.inside = None, False
            return
        if not self.inside:
            self.inside = bool(self.start) and _ends_with(output_token_ids, self.start)
            self._close_if_spent(output_token_ids)
            return
        if _ends_with(output_token_ids, self.end):  # the model closed it itself
            self.inside = False
            return
        self.spent += 1
        self._close_if_spent(output_token_ids)

    def _close_if_spent(self, output_token_ids: list[int]) -> None:
        if self.inside and self.spent >= self.budget:
            # the model may have begun the end marker itself: the forced tokens finish it
            begun = (k for k in range(len(self.end) - 1, -1, -1) if _ends_with(output_token_ids, self.end[:k]))
            self.closing = next(begun)


def _ends_with(tokens: list[int], marker: tuple[int, ...]) -> bool:
    """Whether ``tokens`` end with ``marker`` (an empty marker: always)."""
    return len(tokens) >= len(marker) and tuple(tokens[len(tokens) - len(marker) :]) == marker


def count_reasoning_tokens(
    output_token_ids: list[int], start_token_ids: list[int], end_token_ids: list[int], starts_inside: bool
) -> int:
    """The tokens of an output inside its reasoning sections, the markers not counted (vLLM's
    ``reasoning_tokens`` of the usage): from each start marker (or the first token when the output
    starts inside) to the next end marker, or to the end. Without a start marker, only an output
    that starts inside the reasoning has any."""
    if not end_token_ids:
        return 0
    count, at, inside = 0, 0, starts_inside
    while at < len(output_token_ids):
        if inside:
            end = _find(output_token_ids, end_token_ids, at)
            if end < 0:
                return count + len(output_token_ids) - at
            count, at, inside = count + end - at, end + len(end_token_ids), False
        else:
            start = _find(output_token_ids, start_token_ids, at) if start_token_ids else -1
            if start < 0:
                return count
            at, inside = start + len(start_token_ids), True
    return count


def _find(tokens: list[int], marker: list[int], at: int) -> int:
    """The index of ``marker``'s first occurrence in ``tokens`` from ``at`` on, or -1."""
    size = len(marker)
    for index in range(at, len(tokens) - size + 1):
        if tokens[index : index + size] == marker:
            return index
    return -1
