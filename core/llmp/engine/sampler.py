"""Turns logits into tokens, applying every sampling parameter in one batched pass.

Order, as in vLLM: the structured-output grammar mask, allowed tokens, bad words, logit bias and the
``min_tokens`` ban, then a token the thinking budget forces (its row's only choice);
then repetition, frequency and presence penalties (greedy rows included);
then temperature, locally typical sampling (``typical_p``), top-k, min-p and top-p; then a draw. Logprobs are those of
the raw model distribution. Only rows that use a feature pay for it.

The engine describes each row (:class:`SamplingBatch`, plain data); the worker of rank 0 samples on
the model's device, so a step sends back token ids and requested logprobs, never logits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from llmp.api import RequestValidationError
from llmp.engine.request import Request
from llmp.sampling_params import SamplingParams


@dataclass(slots=True)
class TokenLogprobs:
    """The sampled (or prompt) token first, then the top-k: ids, logprobs and ranks (1 = most likely)."""

    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


_ARGMAX_CHUNK = 64


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` of a [R, V] tensor: the first index of each row's largest value.

    float32 rows go as the largest of each 64-wide chunk (``amax``, vectorised on CPU, where a max
    that also tracks indices is not), then the winner inside the first chunk that holds it: 4.5x
    faster than ``argmax`` for 48 rows of a 152k vocabulary, and the same index, ties included.
    (bfloat16's short-row ``amax`` is slow: there it gained 15%, so it keeps ``max``.)
    """
    rows, vocab = logits.shape
    if logits.dtype != torch.float32 or vocab % _ARGMAX_CHUNK or not logits.is_contiguous():
        return logits.max(-1).indices
    chunks = logits.view(rows, vocab // _ARGMAX_CHUNK, _ARGMAX_CHUNK)
    best = chunks.amax(-1).max(-1).indices  # first chunk holding the row's largest value
    inside = chunks[torch.arange(rows, device=logits.device), best].max(-1).indices
    return best * _ARGMAX_CHUNK + inside


@dataclass(slots=True)
class SamplingRow:
    """What sampling needs of one request: plain, picklable data, built where the requests live (the
    engine) and sent with the step to the worker that samples, on the model's device. The token
    lists come along only for the rows whose penalties or bad words read them."""

    params: SamplingParams
    num_output_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    has_grammar: bool = False
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    output_token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    forced_token_id: int | None = None  # the thinking budget's end marker, emitted whatever the logits say
    penalty_token_ids: list[int] | None = None  # with penalty_window: the last tokens the penalties read

    @classmethod
    def of(cls, request: Request) -> SamplingRow:
        params = request.params
        penalties = params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty
        return cls(
            params,
            request.num_output_tokens,
            request.eos_token_ids,
            request.grammar is not None,
            request.bad_words_token_ids,
            request.output_token_ids if penalties or request.bad_words_token_ids else None,
            request.prompt_token_ids if params.repetition_penalty != 1.0 and not params.penalty_window else None,
            _forced_token(request),
            _penalty_window(request) if penalties and params.penalty_window else None,
        )


def _penalty_window(request: Request) -> list[int]:
    """The last ``penalty_window`` tokens of prompt and output together (llama.cpp's repeat_last_n)."""
    size, output = request.params.penalty_window, request.output_token_ids
    if len(output) >= size:
        return list(output[len(output) - size :])
    prompt = request.prompt_token_ids
    return [*prompt[max(len(prompt) - (size - len(output)), 0) :], *output]


def _forced_token(request: Request) -> int | None:
    """The thinking budget's next end-marker token; none while a grammar is active: a grammar starts after
    the reasoning (``after_token_ids``), so one active from the first token (a completion's constraint)
    leaves no reasoning to cut, and its output is never broken by a forced marker."""
    if request.thinking is None or (request.grammar is not None and request.grammar.active):
        return None
    return request.thinking.forced_token()


@dataclass(slots=True)
class SamplingBatch:
    """The rows of one step's sampler call, in logit-row order, and the grammar masks of its
    constrained rows (``structured_output.grammar_bitmask``, filled by the engine)."""

    rows: list[SamplingRow]
    grammar_bitmask: torch.Tensor | None = None
    grammar_rows: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, requests: list[Request], vocab_size: int) -> SamplingBatch:
        batch = cls([SamplingRow.of(r) for r in requests])
        if any(r.grammar is not None for r in requests):
            from llmp.engine.structured_output import grammar_bitmask

            masks = grammar_bitmask([r.grammar for r in requests], vocab_size)
            if masks is not None:
                batch.grammar_bitmask, batch.grammar_rows = masks
        return batch


class Sampler:
    """Runs where the logits are (the model's device, in the worker of rank 0): only the token ids
    and the requested logprobs come back to the host, in one copy.

    Draws for rows without their own seed come from one generator seeded with the engine seed
    (vLLM seeds its workers' random state with it): a fresh engine given the same requests in the
    same order gives the same text. A request's own ``seed`` draws its n-th token from a generator
    seeded with (seed, n): the same text whatever else shares its steps, and nothing to keep
    between steps."""

    def __init__(
        self,
        seed: int,
        device: torch.device | str = "cpu",
        argmax: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(self.device).manual_seed(seed)
        self.argmax = argmax or argmax_rows  # the kernel set's (KernelSet.argmax), where it has one

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        # logits: [R, V] in the model's dtype (bfloat16 logits become float32 here only when needed)
        rows = batch.rows
        wants_logprobs = [r.params.logprobs is not None for r in rows]
        plain_greedy = all(_plain_greedy(r) for r in rows)
        if plain_greedy and not any(wants_logprobs):
            # the common fast path: nothing to mask, copy or draw. A float32 copy of 64 rows of a
            # 152k vocabulary costs more than the argmax, and converting cannot change which is largest.
            return SamplerOutput(to_host(self.argmax(logits)).tolist(), [None] * len(rows))
        given, logits = logits, logits.float()
        raw_logprobs = logits.log_softmax(-1) if any(wants_logprobs) else None
        if plain_greedy:
            return self._finish(self.argmax(logits), rows, wants_logprobs, raw_logprobs)
        if logits is given:  # the masks below write in place
            logits = logits.clone()
        if batch.grammar_bitmask is not None:
            from llmp.engine.structured_output import apply_token_bitmask

            apply_token_bitmask(logits, batch.grammar_bitmask, batch.grammar_rows)
        logits = _apply_masks_and_bias(logits, rows)
        logits = _apply_penalties(logits, rows)
        random_rows = [i for i, r in enumerate(rows) if not r.params.is_greedy]
        if len(random_rows) == len(rows):  # every row is drawn: no argmax to take, no copy of the rows
            tokens = _sample(logits, rows, self.generator)
        else:
            tokens = self.argmax(logits)
            if random_rows:
                index = torch.tensor(random_rows, device=logits.device)
                tokens[index] = _sample(logits[index], [rows[i] for i in random_rows], self.generator)
        return self._finish(tokens, rows, wants_logprobs, raw_logprobs)

    @staticmethod
    def _finish(
        tokens: torch.Tensor, rows: list[SamplingRow], wants_logprobs: list[bool], raw_logprobs: torch.Tensor | None
    ) -> SamplerOutput:
        logprobs: list[TokenLogprobs | None] = [None] * len(rows)
        if raw_logprobs is None:
            return SamplerOutput(to_host(tokens).tolist(), logprobs)
        chosen = [i for i, wants in enumerate(wants_logprobs) if wants]
        index = torch.tensor(chosen, device=tokens.device)
        gathered, token_list = batch_logprobs(
            raw_logprobs[index], tokens[index], [rows[i].params.logprobs for i in chosen], also=tokens
        )
        for i, entry in zip(chosen, gathered, strict=True):
            logprobs[i] = entry
        return SamplerOutput(token_list, logprobs)


def to_host(*values: torch.Tensor) -> Any:
    """``values`` on the CPU (one tensor: it; several: a tuple). From a GPU: into pinned memory with
    non-blocking copies, then one wait for the stream (the only synchronisation of a step's sampling)."""
    if all(v.device.type == "cpu" for v in values):
        return values[0] if len(values) == 1 else values
    hosts = []
    for v in values:
        host = torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
        host.copy_(v, non_blocking=True)
        hosts.append(host)
    torch.cuda.current_stream(values[0].device).synchronize()
    return hosts[0] if len(hosts) == 1 else tuple(hosts)


def batch_logprobs(
    table: torch.Tensor, token_ids: torch.Tensor, ks: list[int], also: torch.Tensor | None = None
) -> tuple[list[TokenLogprobs], list[int]]:
    """Per row of ``table`` (log-softmax rows, [R, V]): the logprob and rank of ``token_ids[r]``,
    then its top ``ks[r]``; computed on the table's device and brought back in two copies and one wait.
    ``also`` (int64) travels with them; its values are returned as a list (else [])."""
    rows, vocab = table.shape
    chosen = table.gather(1, token_ids.view(-1, 1))
    ranks = (table > chosen).sum(-1) + 1
    k = min(max(ks, default=0), vocab)
    top = table.topk(k, dim=-1) if k > 0 else None
    ints = [ranks, token_ids.view(-1)] + ([top.indices.reshape(-1)] if top is not None else [])
    extra = 0 if also is None else also.numel()
    if also is not None:
        ints.append(also.view(-1))
    floats = [chosen.view(-1)] + ([top.values.reshape(-1)] if top is not None else [])
    int_host, float_host = (t.tolist() for t in to_host(torch.cat(ints), torch.cat(floats).float()))
    out = []
    for r in range(rows):
        kr = min(ks[r], vocab)
        ids = [int_host[rows + r]] + (int_host[2 * rows + r * k : 2 * rows + r * k + kr] if kr else [])
        values = [float_host[r]] + (float_host[rows + r * k : rows + r * k + kr] if kr else [])
        out.append(TokenLogprobs(ids, values, [int_host[r]] + list(range(1, kr + 1))))
    return out, (int_host[len(int_host) - extra :] if extra else [])


def _plain_greedy(row: SamplingRow) -> bool:
    """A greedy row that no mask, bias, ban or penalty changes: its token is the argmax of the raw logits."""
    params = row.params
    return (
        params.is_greedy
        and not row.has_grammar
        and row.forced_token_id is None
        and params.allowed_token_ids is None
        and not params.logit_bias
        and not _bans_tokens(row)
        and not row.bad_words_token_ids
        and params.repetition_penalty == 1.0
        and not params.frequency_penalty
        and not params.presence_penalty
    )


def _bans_tokens(row: SamplingRow) -> bool:
    """Whether ``min_tokens`` bans a stop or end token for this row now."""
    params = row.params
    if row.num_output_tokens >= params.min_tokens:
        return False
    return bool(params.stop_token_ids) or not params.ignore_eos


def bad_words_token_ids(bad_words: list[str], tokenizer: Any, vocab_size: int) -> list[list[int]]:
    """The token sequences ``bad_words`` bans, as vLLM builds them: each word (leading whitespace
    stripped) as the start of a text, and also after a space when that gives a different first
    token and the same number of tokens (so the word is banned mid-text too)."""
    sequences: list[list[int]] = []
    for word in bad_words:
        as_start = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        if not as_start:
            raise RequestValidationError("bad_words", f"bad word {word!r} has no tokens")
        sequences.append(as_start)
        after_space = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if after_space[0] != as_start[0] and len(after_space) == len(as_start):
            sequences.append(after_space)
    bad = sorted({t for ids in sequences for t in ids if not 0 <= t < vocab_size})
    if bad:
        raise RequestValidationError(
            "bad_words",
            f"The model vocabulary size is {vocab_size}, but the following tokens were specified as bad: {bad}. "
            f"All token id values should be integers satisfying: 0 <= token_id < {vocab_size}.",
        )
    return sequences


def _ban_bad_words(logits_row: torch.Tensor, row: SamplingRow) -> None:
    # a sequence's last token is banned when the output ends with the rest of it (vLLM: output tokens only)
    output = row.output_token_ids or []
    for ids in row.bad_words_token_ids:
        prefix = len(ids) - 1
        if prefix <= len(output) and (prefix == 0 or output[-prefix:] == ids[:-1]):
            logits_row[ids[-1]] = float("-inf")


def _apply_masks_and_bias(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    vocab, device = logits.shape[-1], logits.device
    for i, row in enumerate(rows):
        params = row.params
        if params.allowed_token_ids is not None:
            allowed = torch.tensor([t for t in params.allowed_token_ids if t < vocab], dtype=torch.long, device=device)
            keep = logits[i, allowed]
            logits[i] = float("-inf")
            logits[i, allowed] = keep
        if row.bad_words_token_ids:
            _ban_bad_words(logits[i], row)
        if params.logit_bias:
            ids = [t for t in params.logit_bias if t < vocab]
            bias = torch.tensor([params.logit_bias[t] for t in ids], dtype=logits.dtype, device=device)
            logits[i, torch.tensor(ids, dtype=torch.long, device=device)] += bias
        if row.num_output_tokens < params.min_tokens:
            banned = list(params.stop_token_ids)
            if not params.ignore_eos or row.has_grammar:  # a grammar ends a sequence with EOS
                banned.extend(row.eos_token_ids)
            banned = [t for t in banned if t < vocab]
            if banned:
                kept = logits[i, banned].clone() if row.has_grammar else None
                logits[i, banned] = float("-inf")
                if kept is not None and bool(torch.isneginf(logits[i]).all()):
                    logits[i, banned] = kept  # the grammar is complete: it may only end, min_tokens or not
        if row.forced_token_id is not None and row.forced_token_id < vocab:
            logits[i] = float("-inf")
            logits[i, row.forced_token_id] = 0.0
    return logits


def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    chosen_rows = [
        i
        for i, r in enumerate(rows)
        if r.params.repetition_penalty != 1.0 or r.params.frequency_penalty or r.params.presence_penalty
    ]
    if not chosen_rows:
        return logits
    vocab, device = logits.shape[-1], logits.device
    chosen = [rows[i] for i in chosen_rows]
    # Penalties change only the tokens a row has seen: they are computed on those (row, token) pairs, keyed
    # row * vocab + token, not over [rows, vocabulary] (32 rows of 152k entries are 4.9M values a step, where
    # their prompts and outputs hold thousands of tokens).
    # a windowed row counts every penalty over its window alone (llama.cpp's); the others as vLLM
    windows = [r.penalty_token_ids for r in chosen]
    output_keys = _pair_keys(
        [w if w is not None else r.output_token_ids or [] for r, w in zip(chosen, windows)], vocab, device
    )
    prompt_keys = _pair_keys(
        [r.prompt_token_ids or [] if w is None else [] for r, w in zip(chosen, windows)], vocab, device
    )
    output_keys, output_counts = output_keys.unique(return_counts=True)  # sorted
    seen = torch.cat([output_keys, prompt_keys]).unique()
    if seen.numel() == 0:
        return logits
    # each seen pair's count among the outputs (0: seen in the prompt only)
    at = torch.searchsorted(output_keys, seen).clamp(max=max(output_keys.numel() - 1, 0))
    if output_keys.numel():
        counts = torch.where(output_keys[at] == seen, output_counts[at], 0).float()
    else:
        counts = torch.zeros_like(seen, dtype=torch.float32)
    row, token = seen // vocab, seen % vocab

    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, device=device)[row]

    target = (torch.tensor(chosen_rows, device=device)[row], token)
    values = logits[target]
    repetition = column([r.params.repetition_penalty for r in chosen])
    values = torch.where(values > 0, values / repetition, values * repetition)
    frequency = column([r.params.frequency_penalty for r in chosen])
    presence = column([r.params.presence_penalty for r in chosen])
    logits[target] = values - frequency * counts - presence * (counts > 0).float()
    return logits


def _pair_keys(sequences: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """``row * vocab + token`` of each token of each sequence (ids past the vocabulary dropped)."""
    tokens = torch.cat([torch.tensor(s, dtype=torch.long) for s in sequences])
    rows = torch.repeat_interleave(torch.arange(len(sequences)), torch.tensor([len(s) for s in sequences]))
    keys = rows * vocab + tokens
    return keys[(tokens >= 0) & (tokens < vocab)].to(device, non_blocking=True)


def _sample(logits: torch.Tensor, rows: list[SamplingRow], generator: torch.Generator) -> torch.Tensor:
    params = [r.params for r in rows]
    device = logits.device
    logits = logits / torch.tensor([p.temperature for p in params], device=device).unsqueeze(1)
    typical = [i for i, p in enumerate(params) if p.typical_p < 1]
    if typical:
        index = torch.tensor(typical, device=device)
        logits[index] = keep_typical(logits[index], torch.tensor([params[i].typical_p for i in typical], device=device))
    # One uniform draw a row, through the row's cumulative distribution; seeded rows use their own generator.
    # (An exponential race, argmax(p / E) with E ~ Exp(1), draws a number per token: 67 ms in torch for 32 rows of
    # a 152k vocabulary on a CPU; vLLM's CPU build fuses it in C++: 7 ms for 32 rows of 49k, where this whole
    # sampler takes 2.4 ms, benchmarks/sampler.py.)
    uniforms = torch.rand(len(rows), 1, generator=generator, device=device, dtype=torch.float64)
    for i, row in enumerate(rows):
        if row.params.seed is not None:
            own = seeded_generator(row.params.seed, row.num_output_tokens, device)
            uniforms[i] = torch.rand(1, generator=own, device=device, dtype=torch.float64)
    # rows with a top-k draw from their k most likely tokens, the others from the whole vocabulary: which way a
    # row goes is its own, so a seeded row's draw does not depend on what shares the step
    with_k = [i for i, p in enumerate(params) if p.top_k > 0]
    if not with_k:
        return _draw_vocabulary(logits, params, uniforms)
    if len(with_k) == len(rows):
        return _draw_top_k(logits, params, uniforms)
    tokens = torch.empty(len(rows), dtype=torch.long, device=device)
    for chosen, draw in ((with_k, _draw_top_k), ([i for i, p in enumerate(params) if p.top_k <= 0], _draw_vocabulary)):
        index = torch.tensor(chosen, device=device)
        tokens[index] = draw(logits[index], [params[i] for i in chosen], uniforms[index])
    return tokens


def _draw_vocabulary(logits: torch.Tensor, params: list[SamplingParams], uniforms: torch.Tensor) -> torch.Tensor:
    """Rows without a top-k: min-p and top-p over the whole vocabulary, then the draw. A row whose top-p set
    lies within its most likely ``_TOP_P_CANDIDATES`` tokens draws among those: the same token as drawing over
    the vocabulary (the tokens left out hold no mass, and adding 0 leaves a running sum as it is)."""
    device, vocab = logits.device, logits.shape[-1]
    probs = logits.softmax(-1)
    if any(p.min_p > 0 for p in params):
        min_p = torch.tensor([p.min_p for p in params], device=device)
        threshold = min_p.unsqueeze(1) * probs.max(-1, keepdim=True).values
        probs = probs.masked_fill(probs < threshold, 0.0)
    if not any(p.top_p < 1 for p in params):
        return draw_from(probs, uniforms)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    reach = (top_p * probs.sum(-1)).unsqueeze(1)  # as keep_top_p's, so the same tokens kept
    tokens = torch.empty(len(params), dtype=torch.long, device=device)
    left = (top_p < 1).nonzero().squeeze(1)
    if len(left) < len(params):  # rows of top-p 1: the whole vocabulary
        whole = (top_p >= 1).nonzero().squeeze(1)
        tokens[whole] = draw_from(probs[whole], uniforms[whole])
    at_least = torch.zeros(len(params), device=device)  # a bound under each row's set size, from its last look
    for candidates in _TOP_P_CANDIDATES:
        if len(left) == 0 or candidates >= vocab:
            break
        past = at_least[left] > candidates  # known to be larger: not this look
        looked = left[~past]
        if len(looked) == 0:
            continue
        values, ids = (probs if len(looked) == len(params) else probs[looked]).topk(candidates, dim=-1)
        cumulative = values.cumsum(-1)
        within = cumulative[:, -1] >= reach[looked, 0]
        if bool(within.any()):
            chosen, kept_ids, kept = looked[within], ids[within], values[within]
            kept = kept.masked_fill(cumulative[within] - kept >= reach[chosen], 0.0)
            tokens[chosen] = _draw_candidates(kept, kept_ids, uniforms[chosen])
        # each token past the candidates holds at most the last one's mass
        short = ~within
        at_least[looked[short]] = candidates + (reach[looked[short], 0] - cumulative[short, -1]) / values[short, -1]
        left = torch.cat([left[past], looked[short]]).sort().values
    if len(left):  # sets past every look: each row sorted whole
        tokens[left] = draw_from(keep_top_p(probs[left], top_p[left], candidates=()), uniforms[left])
    return tokens


def _draw_candidates(weights: torch.Tensor, ids: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The draw among each row's candidate tokens ``ids`` [R, C] of ``weights`` [R, C], in vocabulary order, as
    over the whole vocabulary (the tokens between hold no mass)."""
    order = ids.argsort(-1)
    ids, weights = ids.gather(1, order), weights.gather(1, order)
    return ids.gather(1, draw_from(weights, uniforms).unsqueeze(1)).squeeze(1)


def _draw_top_k(logits: torch.Tensor, params: list[SamplingParams], uniforms: torch.Tensor) -> torch.Tensor:
    """Rows with a top-k: min-p, top-p and the draw over each row's k most likely tokens (and any tied with its
    k-th), not over the vocabulary: no pass over 49k entries a row after the top-k itself (Ollama's defaults
    are top-k 40 and top-p 0.9, Qwen2.5's 20 and 0.8). Every step is elementwise, or a running sum in an order
    fixed by values and ids, so a row's draw does not depend on how many candidates the other rows asked for
    (on a CPU: a GPU's sums are parallel scans)."""
    device, vocab = logits.device, logits.shape[-1]
    k = torch.tensor([min(p.top_k, vocab) for p in params], device=device).unsqueeze(1)
    # one past the largest k: does a tie with a k-th value spill past?
    width = min(max(p.top_k for p in params) + 1, vocab)
    while True:
        values, ids = logits.topk(width, dim=-1)  # most likely first
        kth = values.gather(1, k - 1)
        if width == vocab or not bool(((values[:, -1:] == kth) & (kth > float("-inf"))).any()):
            break
        grown = min(int(((logits >= kth) | logits.isnan()).sum(-1).max()) + 1, vocab)  # (topk puts NaN first)
        if grown <= width:
            break
        width = grown
    # one order, by value then id: topk orders tied values by how many it was asked for, and where top-p cuts
    # through tied values must not depend on the other rows' k
    by_id = ids.argsort(-1)
    ids, values = ids.gather(1, by_id), values.gather(1, by_id)
    values, by_value = values.sort(dim=-1, descending=True, stable=True)
    ids = ids.gather(1, by_value)
    # unnormalised probabilities: exp(0) = 1 for each row's most likely token
    weights = (values - values[:, :1]).exp().masked_fill(values < kth, 0.0)
    if any(p.min_p > 0 for p in params):
        min_p = torch.tensor([p.min_p for p in params], device=device).unsqueeze(1)
        weights = weights.masked_fill(weights < min_p, 0.0)
    if any(p.top_p < 1 for p in params):
        # the candidates are sorted: a token is kept while the mass strictly above it is short of the reach
        top_p = torch.tensor([p.top_p for p in params], device=device).unsqueeze(1)
        cumulative = weights.cumsum(-1)
        weights = weights.masked_fill((cumulative - weights >= top_p * cumulative[:, -1:]) & (top_p < 1), 0.0)
    return _draw_candidates(weights, ids, uniforms)


# A row's top-p set is looked for among its most likely tokens first: sorting a whole vocabulary of 49k
# entries takes about 2 ms on a CPU core, its top 64 50 us, its top 1024 0.3 ms and its top 8192 0.9 ms. A chat
# model's top-p set (SmolLM2, 4096 draws) was within 64 tokens for 94% of its rows at temperature 0.8 and top-p
# 0.9; at 1.0 and 0.95 within 1024 for 87%, and at most 6682. (A look is skipped where the one before shows the
# set is larger.)
_TOP_P_CANDIDATES = (64, 1024, 8192)


def keep_typical(logits: torch.Tensor, typical_p: torch.Tensor) -> torch.Tensor:
    """``logits`` [R, V] with all but each row's locally typical set masked (-inf): the tokens whose surprisal
    (-log p) is nearest the distribution's entropy, nearest first, until their mass reaches ``typical_p`` [R]
    (Meister et al., 2022; llama.cpp's ``typical_p``). Ties with the last token taken are kept, as
    transformers' ``TypicalLogitsWarper`` (the reference it is tested against) keeps them; a row keeps its
    most typical token at least."""
    logprobs = logits.log_softmax(-1)
    probs = logprobs.exp()
    entropy = -(logprobs * probs).nansum(-1, keepdim=True)  # masked tokens: 0 * -inf is nan, and left out
    distance = (-logprobs - entropy).abs()
    ordered, order = distance.sort(-1)
    mass = logits.gather(1, order).softmax(-1).cumsum(-1)  # as the reference sums it, to the last bit
    last = (mass < typical_p.unsqueeze(1)).sum(-1, keepdim=True).clamp(max=logits.shape[-1] - 1)
    return logits.masked_fill(distance > ordered.gather(1, last), float("-inf"))


def keep_top_p(
    probs: torch.Tensor, top_p: torch.Tensor, candidates: tuple[int, ...] = _TOP_P_CANDIDATES
) -> torch.Tensor:
    """``probs`` [R, V] (non-negative, unnormalised) with all but each row's top-p set zeroed: the smallest
    set of most likely tokens whose mass reaches ``top_p`` [R] of the row's total (a row of 1 keeps all).
    A row is sorted whole only when its set is not within its most likely ``candidates``."""
    vocab = probs.shape[-1]
    reach = (top_p * probs.sum(-1)).unsqueeze(1)
    keep = (top_p >= 1).unsqueeze(1).expand_as(probs).clone()
    rows = (top_p < 1).nonzero().squeeze(1)
    for look in (*(k for k in candidates if k < vocab), vocab):
        if len(rows) == 0:
            break
        row_probs = probs if len(rows) == len(probs) else probs[rows]
        if look < vocab:
            values, order = row_probs.topk(look, dim=-1)  # sorted, most likely first
        else:
            values, order = row_probs.sort(-1, descending=True)
        cumulative = values.cumsum(-1)
        # a token is kept while the mass strictly above it is short of the reach
        kept = cumulative - values < reach[rows]
        keep[rows] = torch.zeros_like(row_probs, dtype=torch.bool).scatter_(1, order, kept)
        # rows whose candidates fall short of the reach: tokens past them may be in the set
        rows = rows[cumulative[:, -1] < reach[rows, 0]]
    return probs.masked_fill(~keep, 0.0)


def draw_from(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The token of each row [R, V] of (unnormalised, non-negative) probabilities whose cumulative mass first
    exceeds the row's uniform [R, 1] in [0, 1) times the row's total: a draw from the row's distribution. A
    token of no mass is never taken (the cumulative sum steps over it)."""
    # a CPU sums float32 in float64 already (asking for float64 sums costs 10x: a copy); CUDA sums in the dtype
    cdf = probs.cumsum(-1, dtype=None if probs.device.type == "cpu" else torch.float64)
    tokens = torch.searchsorted(cdf, (uniforms * cdf[:, -1:]).to(cdf.dtype), right=True).squeeze(1)
    over = tokens >= probs.shape[-1]  # u * total rounded up to the total: the row's last token with mass
    if bool(over.any()):
        last = probs.shape[-1] - 1 - (probs[over].flip(-1) > 0).to(torch.uint8).argmax(-1)
        tokens[over] = last
    return tokens


def seeded_generator(seed: int, position: int, device: torch.device) -> torch.Generator:
    """The generator of a seeded request's ``position``-th output token: one (seed, position) pair,
    one stream, so its text does not depend on the batch, the step or the process that samples."""
    mixed = (seed * 0x9E3779B97F4A7C15 + position) % (1 << 63)
    return torch.Generator(device).manual_seed(mixed)
