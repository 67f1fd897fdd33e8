"""Beam search, as vLLM's ``LLM.beam_search`` and ``use_beam_search`` run it: outside the engine,
which only ever samples.

Each step asks the engine for one token of every live beam, with ``2 * beam_width`` logprobs (the
raw model distribution's; the prefix cache keeps what the beams share). Every candidate's score is
its cumulative logprob over its length to the power ``length_penalty`` (transformers' and vLLM's
formula; the length counts the prompt, as vLLM's does, and not a final EOS); a prompt's best
``beam_width`` candidates go on. A candidate ending in EOS is a finished hypothesis, unless
``ignore_eos``; so is a beam that reaches the context length. At the end the finished and the live
beams are ranked together and the best ``beam_width`` returned.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmp.lora import LoRARequest
from llmp.outputs import Logprob
from llmp.sampling_params import SamplingParams

StepLogprobs = dict[int, Logprob] | None  # one beam's next-token logprobs (None: it could not step)


@dataclass(frozen=True)
class BeamSearchParams:
    """vLLM's beam search parameters. ``temperature`` only draws the one sampled token each step adds
    to the candidates (0: the top ``2 * beam_width`` tokens are the candidates)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False  # keep a finished beam's EOS in its text

    def __post_init__(self) -> None:
        if not isinstance(self.beam_width, int) or self.beam_width < 1:
            raise ValueError(f"beam_width must be an integer >= 1, got {self.beam_width!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")


@dataclass
class BeamSearchSequence:
    """One beam: ``tokens`` holds the prompt and the generated tokens; ``text`` (the generated
    text) is filled when the beam is returned."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    lora_request: LoRARequest | None = None
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    cache_salt: str | None = None  # the prompt's (Prompt.cache_salt): every step's request keeps it


@dataclass
class BeamSearchOutput:
    """The best ``beam_width`` beams of one prompt, best first."""

    sequences: list[BeamSearchSequence]


def beam_score(
    tokens: Sequence[int], cum_logprob: float, eos_token_ids: Collection[int], length_penalty: float
) -> float:
    """A beam's rank: its cumulative logprob over its length (prompt included, a final EOS not) to
    the power ``length_penalty``."""
    length = len(tokens) - (1 if tokens and tokens[-1] in eos_token_ids else 0)
    return cum_logprob / (length**length_penalty)


class BeamSearch:
    """The beams of several prompts, advanced one token at a time by a caller that runs the engine."""

    def __init__(
        self,
        prompts: Sequence[Sequence[int]],
        params: BeamSearchParams,
        *,
        eos_token_ids: Collection[int],
        max_model_len: int,
        loras: Sequence[LoRARequest | None] | None = None,
        cache_salts: Sequence[str | None] | None = None,
    ) -> None:
        self.params, self.eos, self.max_model_len = params, frozenset(eos_token_ids), max_model_len
        loras = loras or [None] * len(prompts)
        salts = cache_salts or [None] * len(prompts)
        self.prompt_lens = [len(p) for p in prompts]
        self.beams = [
            [BeamSearchSequence(list(p), lora_request=lora, cache_salt=salt)]
            for p, lora, salt in zip(prompts, loras, salts, strict=True)
        ]
        self.finished: list[list[BeamSearchSequence]] = [[] for _ in prompts]
        self.steps = 0

    @property
    def step_params(self) -> SamplingParams:
        width = self.params.beam_width
        return SamplingParams(max_tokens=1, logprobs=2 * width, temperature=self.params.temperature, ignore_eos=True)

    def live(self) -> list[BeamSearchSequence]:
        """The beams the next step extends, every prompt's in order (empty: the search is over)."""
        if self.steps >= self.params.max_tokens:
            return []
        for index, beams in enumerate(self.beams):
            full = [b for b in beams if len(b.tokens) >= self.max_model_len]  # no room for another token
            for beam in full:
                beam.finish_reason = "length"
            self.finished[index] += full
            self.beams[index] = [b for b in beams if len(b.tokens) < self.max_model_len]
        return [beam for beams in self.beams for beam in beams]

    def advance(self, step: Sequence[StepLogprobs]) -> None:
        """Extend the beams :meth:`live` gave with their next-token logprobs, in the same order."""
        self.steps += 1
        offset = 0
        for index, beams in enumerate(self.beams):
            candidates: list[BeamSearchSequence] = []
            for beam, logprobs in zip(beams, step[offset : offset + len(beams)], strict=True):
                for token, logprob in (logprobs or {}).items():
                    candidate = BeamSearchSequence(
                        beam.tokens + [token],
                        beam.logprobs + [logprobs],
                        beam.lora_request,
                        beam.cum_logprob + logprob.logprob,
                        cache_salt=beam.cache_salt,
                    )
                    if token in self.eos and not self.params.ignore_eos:
                        candidate.finish_reason, candidate.stop_reason = "stop", token
                        self.finished[index].append(candidate)
                    else:
                        candidates.append(candidate)
            offset += len(beams)
            self.beams[index] = sorted(candidates, key=self._score, reverse=True)[: self.params.beam_width]
        if offset != len(step):
            raise ValueError(f"{len(step)} step results for {offset} live beams")

    def outputs(self, tokenizer: Any, skip_special_tokens: bool = True) -> list[BeamSearchOutput]:
        """Each prompt's best beams, best first, with their generated text (as the engine's
        detokenizer gives it after the prompt; a finished beam's EOS only with
        ``include_stop_str_in_output``)."""
        results = []
        for index, beams in enumerate(self.beams):
            for beam in beams:
                beam.finish_reason = beam.finish_reason or "length"
            best = sorted(self.finished[index] + beams, key=self._score, reverse=True)[: self.params.beam_width]
            for beam in best:
                generated = beam.tokens[self.prompt_lens[index] :]
                if beam.finish_reason == "stop" and not self.params.include_stop_str_in_output:
                    generated = generated[:-1]
                beam.text = generated_text(
                    tokenizer, beam.tokens[: self.prompt_lens[index]], generated, skip_special_tokens
                )
            results.append(BeamSearchOutput(best))
        return results

    def _score(self, beam: BeamSearchSequence) -> float:
        return beam_score(beam.tokens, beam.cum_logprob, self.eos, self.params.length_penalty)


def generated_text(tokenizer: Any, prompt_ids: list[int], generated: list[int], skip_special_tokens: bool) -> str:
    """The text ``generated`` adds after the prompt, as a generation's text is (not a decode of the
    generated tokens alone, which can lose a leading space or split a character)."""
    from llmp.engine.detokenizer import IncrementalDetokenizer

    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=skip_special_tokens)
    return "".join(detokenizer.add_token(token) for token in generated) + detokenizer.flush()


def step_logprobs(output: object) -> StepLogprobs:
    """A one-token request output's logprobs of its token (None when it produced none)."""
    sequences = getattr(output, "outputs", None) or []
    logprobs = sequences[0].logprobs if sequences else None
    return logprobs[0] if logprobs else None


async def run_beam_search(
    search: BeamSearch, step: Callable[[list[BeamSearchSequence], SamplingParams], Awaitable[list[StepLogprobs]]]
) -> None:
    """Advance ``search`` to its end, ``step`` running the engine on the live beams (an async engine client)."""
    while beams := search.live():
        search.advance(await step(beams, search.step_params))
