"""Turns engine updates into ``RequestOutput`` objects.

Holds each request's detokenizer, text and logprobs, finds stop strings (the
scheduler only sees token ids) and gathers the ``n`` sequences of a request
into one output.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from llmp.engine.detokenizer import IncrementalDetokenizer, find_stop_string
from llmp.engine.request import Request
from llmp.engine.sampler import TokenLogprobs
from llmp.outputs import CompletionOutput, Logprob, RequestOutput
from llmp.sampling_params import SamplingParams


@dataclass(eq=False)
class SequenceState:
    """One of the ``n`` sequences of a request, as the caller will see it."""

    index: int
    parent: RequestState
    request: Request
    detokenizer: IncrementalDetokenizer
    stop_buffer: int  # characters held back from a delta, as they may start a stop string
    logprobs: list[dict[int, Logprob]] | None
    cumulative_logprob: float = 0.0
    text: str = ""
    sent_text: int = 0  # characters and tokens already returned in delta mode
    sent_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass(eq=False)
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    delta: bool = False  # outputs carry only what is new
    sequences: list[SequenceState] = field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.sequences)


class OutputProcessor:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}
        self.sequences: dict[str, SequenceState] = {}  # engine request id -> sequence
        self._token_text: dict[int, str] = {}

    def add_request(self, state: RequestState, requests: list[Request]) -> None:
        params = state.params
        if params.prompt_logprobs is not None:
            state.prompt_logprobs = [None]
        stop_buffer = (
            0 if params.include_stop_str_in_output else max((len(s) for s in params.stop_strings), default=1) - 1
        )
        for index, request in enumerate(requests):
            detok = IncrementalDetokenizer(
                self.tokenizer,
                request.prompt_token_ids,
                params.skip_special_tokens,
                params.spaces_between_special_tokens,
            )
            logprobs = [] if params.logprobs is not None else None
            seq = SequenceState(index, state, request, detok, stop_buffer, logprobs)
            state.sequences.append(seq)
            self.sequences[request.request_id] = seq
        self.states[state.request_id] = state

    def sequence_of(self, engine_request_id: str) -> SequenceState | None:
        return self.sequences.get(engine_request_id)

    def state_of(self, request_id: str) -> RequestState | None:
        return self.states.get(request_id)

    def append(
        self, seq: SequenceState, token_id: int, logprobs: TokenLogprobs | None, detokenize: bool = True
    ) -> tuple[str, int] | None:
        """Record a new token of ``seq``; return ``(stop_string, cut)`` when it completes a stop string.
        ``detokenize=False``: the token adds no text (an EOS or stop token that ended the sequence)."""
        params = seq.request.params
        if logprobs is not None:
            seq.cumulative_logprob += logprobs.logprobs[0]
            seq.logprobs.append(self._logprob_dict(logprobs, params.detokenize))
        if not (detokenize and params.detokenize):
            return None
        delta = seq.detokenizer.add_token(token_id)
        if not delta:
            return None
        seq.text += delta
        if params.stop_strings and seq.request.num_output_tokens >= params.min_tokens:
            found = find_stop_string(seq.text, len(delta), params.stop_strings, params.include_stop_str_in_output)
            if found is not None:
                seq.text = seq.text[: found[1]]
                return found
        return None

    def add_prompt_logprobs(self, request_id: str, entries: list[TokenLogprobs]) -> None:
        seq = self.sequences.get(request_id)
        if seq is None or seq.index != 0:  # every sequence of a request has the same prompt
            return
        state = seq.parent
        done = len(state.prompt_logprobs)
        wanted = len(state.prompt_token_ids)
        # a preempted request recomputes its prompt: keep the first copy of each position
        for entry in entries:
            if done >= wanted:
                break
            state.prompt_logprobs.append(self._logprob_dict(entry, state.params.detokenize))
            done += 1

    def finish(self, seq: SequenceState, reason: str, stop_reason: int | str | None = None) -> None:
        if seq.finish_reason is None:
            seq.finish_reason, seq.stop_reason = reason, stop_reason
            seq.request.times.setdefault("finished_time", time.time())
            if not isinstance(stop_reason, str) and seq.request.params.detokenize:  # a stop string cut the text
                seq.text += seq.detokenizer.flush()

    def make_output(self, state: RequestState, delta: bool = False) -> RequestOutput:
        outputs = [self._completion(seq, delta) for seq in state.sequences]
        finished = state.finished
        if finished:
            self.states.pop(state.request_id, None)
            for seq in state.sequences:
                self.sequences.pop(seq.request.request_id, None)
        return RequestOutput(
            request_id=state.request_id,
            prompt=state.prompt,
            prompt_token_ids=state.prompt_token_ids,
            outputs=outputs,
            finished=finished,
            prompt_logprobs=state.prompt_logprobs,
            num_cached_tokens=max(state.sequences[0].request.num_cached_tokens, 0),
            metrics=_timings(state.sequences, finished),
        )

    def _completion(self, seq: SequenceState, delta: bool) -> CompletionOutput:
        tokens = seq.request.output_token_ids
        finished = seq.finish_reason is not None
        if delta:
            end = len(seq.text) if finished else max(len(seq.text) - seq.stop_buffer, seq.sent_text)
            text, token_ids = seq.text[seq.sent_text : end], tokens[seq.sent_tokens :]
            logprobs = seq.logprobs[seq.sent_tokens :] if seq.logprobs is not None else None
            seq.sent_text, seq.sent_tokens = end, len(tokens)
        else:
            end = len(seq.text) if finished else max(len(seq.text) - seq.stop_buffer, 0)
            text, token_ids, logprobs = seq.text[:end], list(tokens), seq.logprobs
        return CompletionOutput(
            index=seq.index,
            text=text,
            token_ids=list(token_ids),
            cumulative_logprob=seq.cumulative_logprob if seq.logprobs is not None else None,
            logprobs=list(logprobs) if logprobs is not None else None,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
        )

    def _logprob_dict(self, entry: TokenLogprobs, decode: bool = True) -> dict[int, Logprob]:
        out: dict[int, Logprob] = {}
        for token, value, rank in zip(entry.token_ids, entry.logprobs, entry.ranks, strict=True):
            if token not in out:
                out[token] = Logprob(value, rank, self._decode_one(token) if decode else None)
        return out

    def _decode_one(self, token: int) -> str:
        text = self._token_text.get(token)
        if text is None:
            text = self._token_text[token] = self.tokenizer.decode([token])
        return text


_EARLIEST = frozenset({"arrival_time", "scheduled_time", "first_token_time"})


def _timings(sequences: list[SequenceState], finished: bool) -> dict[str, float]:
    """The request's timings (``RequestOutput.metrics``) from its sequences': the earliest arrival,
    schedule and first token, the latest last token; ``finished_time`` once every sequence has ended."""
    if len(sequences) == 1:
        return dict(sequences[0].request.times)
    times: dict[str, float] = {}
    for seq in sequences:
        for key, value in seq.request.times.items():
            known = times.get(key)
            if known is None or (value < known if key in _EARLIEST else value > known):
                times[key] = value
    if not finished:
        times.pop("finished_time", None)
    return times
