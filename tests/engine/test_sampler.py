"""Sampler: every sampling parameter, model-free, on hand-written logits.

Statistical tests draw many samples in one batch from a 5-token vocabulary with
torch seeded globally, so they are deterministic; their tolerance (a chi-square
bound with p ~ 1e-4 under the right distribution) still catches a wrong one.
"""

from __future__ import annotations

import math

import pytest
import torch

from llmp.engine.request import Request
from llmp.engine.sampler import (
    Sampler,
    SamplerOutput,
    SamplingBatch,
    SamplingRow,
    _apply_masks_and_bias,
    _apply_penalties,
    _draw_top_k,
    _draw_vocabulary,
    argmax_rows,
    draw_from,
    keep_top_p,
    keep_typical,
)
from llmp.sampling_params import SamplingParams

EOS = 2
INF = float("inf")


def make(prompt: list[int] | None = None, output: list[int] | None = None, rid: str = "r0", **params) -> Request:
    request = Request(
        rid, prompt_token_ids=list(prompt or [0]), params=SamplingParams(**params), eos_token_ids=frozenset({EOS})
    )
    for token in output or []:
        request.append_token(token)
    return request


def sample(logits: torch.Tensor, requests: list[Request]) -> SamplerOutput:
    return Sampler(seed=0)(logits, SamplingBatch.of(requests, logits.shape[-1]))


def draw_counts(logits: list[float], n: int = 10000, **params) -> torch.Tensor:
    """Counts of ``n`` draws (one batch of ``n`` rows) from one request's parameters."""
    torch.manual_seed(1234)
    request = make(**params)
    out = sample(torch.tensor([logits]).repeat(n, 1), [request] * n)
    return torch.bincount(torch.tensor(out.token_ids), minlength=len(logits))


def reference_probs(
    logits: list[float], temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> list[float]:
    """The target distribution, written independently: temperature, top-k, min-p, then top-p
    (the smallest most-likely set whose mass reaches top_p), each step renormalised."""
    scaled = [x / temperature for x in logits]
    order = sorted(range(len(logits)), key=lambda i: -scaled[i])
    keep = set(order[:top_k] if top_k else order)

    def normalise(weights: dict[int, float]) -> dict[int, float]:
        total = sum(weights.values())
        return {i: w / total for i, w in weights.items()}

    probs = normalise({i: math.exp(scaled[i]) for i in keep})
    if min_p:
        high = max(probs.values())
        probs = normalise({i: p for i, p in probs.items() if p >= min_p * high})
    if top_p < 1:
        kept, mass = {}, 0.0
        for i in sorted(probs, key=lambda i: -probs[i]):
            kept[i] = probs[i]
            mass += probs[i]
            if mass >= top_p:
                break
        probs = normalise(kept)
    return [probs.get(i, 0.0) for i in range(len(logits))]


def assert_matches(counts: torch.Tensor, expected: list[float]) -> None:
    n = int(counts.sum())
    chi2 = 0.0
    for count, p in zip(counts.tolist(), expected, strict=True):
        if p == 0.0:
            assert count == 0, (counts.tolist(), expected)
        else:
            chi2 += (count - n * p) ** 2 / (n * p)
    # df <= 4: P(chi2 > 25) < 1e-4
    assert chi2 < 25, (chi2, counts.tolist(), [round(n * p) for p in expected])


LOGITS = [2.0, 1.0, 0.5, 0.0, -1.0]


# ---------------------------------------------------------------- greedy


def test_greedy_is_argmax():
    torch.manual_seed(0)
    logits = torch.randn(16, 50)
    out = sample(logits, [make(rid=str(i), temperature=0.0) for i in range(16)])
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 16


def test_greedy_tokens_come_from_the_kernel_set_s_argmax():
    calls = []

    def argmax(logits):  # a set's KernelSet.argmax
        calls.append(tuple(logits.shape))
        return logits.argmax(-1)

    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    rows = [make(rid=str(i), temperature=0.0) for i in range(3)]
    out = Sampler(seed=0, argmax=argmax)(logits, SamplingBatch.of(rows, 50))
    assert out.token_ids == logits.argmax(-1).tolist() and calls == [(3, 50)]


def test_the_worker_hands_the_sampler_its_kernel_set_s_argmax(tmp_path):
    from llmp import LLM
    from llmp.testing import save_tiny_llama

    save_tiny_llama(tmp_path / "m")
    llm = LLM(str(tmp_path / "m"), kernels="cpu-native")
    worker = llm.engine.executor.worker
    assert worker.sampler.argmax == worker.runner.kernels.argmax


@pytest.mark.parametrize("vocab", [4096, 4100])  # chunked (a multiple of 64), and max's fallback
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_rows_is_the_first_index_of_the_largest(vocab, dtype):
    torch.manual_seed(vocab)
    # few distinct values: rows hold their largest many times, in many chunks; row 0 at its very end only
    logits = torch.randint(-50, 8, (33, vocab)).to(dtype)
    logits[0] = -100
    logits[0, -1] = 9
    logits[1, 5], logits[1, 200] = 50, 50  # a tie in two chunks: the first wins
    assert torch.equal(argmax_rows(logits), logits.argmax(-1))
    assert argmax_rows(logits)[:2].tolist() == [vocab - 1, 5]
    strided = torch.randn(vocab, 33).to(dtype).t()  # not contiguous
    assert torch.equal(argmax_rows(strided), strided.argmax(-1))


def test_bfloat16_logits_give_the_float32_results():
    # the model runner hands over logits in the model's dtype; converting is the sampler's job
    torch.manual_seed(0)
    logits = torch.randn(8, 50).bfloat16()
    wide = logits.float()
    for params in (
        {"temperature": 0.0},
        {"temperature": 0.0, "logprobs": 3},
        {"temperature": 0.0, "logit_bias": {7: 100.0}},
    ):
        requests = [make(rid=str(i), **params) for i in range(8)]
        narrow_out, wide_out = sample(logits, requests), sample(wide, requests)
        assert narrow_out.token_ids == wide_out.token_ids
        assert narrow_out.logprobs == wide_out.logprobs
    assert sample(logits, [make(temperature=0.0, logit_bias={7: 100.0})] * 8).token_ids == [7] * 8
    assert torch.equal(logits.float(), wide)  # untouched


@pytest.mark.parametrize("params", [{"top_k": 1}, {"top_k": 1, "temperature": 2.0}, {"top_p": 1e-6}, {"min_p": 1.0}])
def test_truncation_to_one_token_equals_greedy(params):
    torch.manual_seed(0)
    logits = torch.randn(64, 50)
    out = sample(logits, [make(rid=str(i), **params) for i in range(64)])
    assert out.token_ids == logits.argmax(-1).tolist()


def test_input_logits_are_not_modified():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5, -1.0]])
    before = logits.clone()
    request = make(
        prompt=[0, 1],
        output=[4],
        temperature=0.7,
        top_k=3,
        repetition_penalty=1.5,
        frequency_penalty=0.5,
        logit_bias={0: 3.0},
        min_tokens=5,
        allowed_token_ids=[0, 1, 2, 3],
    )
    sample(logits, [request])
    assert torch.equal(logits, before)


def test_mixed_batch_greedy_rows_stay_greedy():
    torch.manual_seed(0)
    logits = torch.randn(8, 30)
    requests = [make(rid=str(i), temperature=0.0 if i % 2 else 1.0) for i in range(8)]
    out = sample(logits, requests)
    argmax = logits.argmax(-1).tolist()
    assert [out.token_ids[i] for i in range(1, 8, 2)] == [argmax[i] for i in range(1, 8, 2)]


# ---------------------------------------------------------------- seeds


def _seeded_draws(seed: int, steps: int = 12, vocab: int = 50) -> list[int]:
    logits = torch.zeros(1, vocab)  # uniform: every draw is pure generator output
    request = make(seed=seed)
    draws = []
    for _ in range(steps):  # as the engine does: each drawn token joins the output
        draws.append(sample(logits, [request]).token_ids[0])
        request.append_token(draws[-1])
    return draws


def test_seeded_requests_reproduce():
    torch.manual_seed(0)
    first = _seeded_draws(123)
    torch.manual_seed(999)  # the global generator has no say
    second = _seeded_draws(123)
    assert first == second
    assert len(set(first)) > 1  # each output position draws afresh
    assert _seeded_draws(124) != first


def test_seeded_draws_do_not_depend_on_the_batch():
    vocab = 40
    torch.manual_seed(0)
    own_logits = torch.randn(vocab)
    alone = make(seed=7, temperature=0.9, top_k=30, top_p=0.95)
    expected = [sample(own_logits[None], [alone]).token_ids[0] for _ in range(10)]

    torch.manual_seed(1)
    target = make(rid="target", seed=7, temperature=0.9, top_k=30, top_p=0.95)
    got = []
    for step in range(10):
        others = [
            make(rid="a", temperature=1.3, top_k=3 + step),
            make(rid="b", seed=1000 + step, min_p=0.2),
            make(rid="c", temperature=0.0),
        ]
        batch = others[: step % 4] + [target] + others[step % 4 :]
        logits = torch.randn(len(batch), vocab)
        position = batch.index(target)
        logits[position] = own_logits
        got.append(sample(logits, batch).token_ids[position])
    assert got == expected


# ---------------------------------------------------------------- distributions


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"temperature": 0.5},
        {"temperature": 2.0},
        {"top_k": 3},
        {"top_k": 2, "temperature": 1.9},
        {"top_p": 0.8},
        {"top_p": 0.6, "temperature": 1.7},
        {"min_p": 0.3},
        {"min_p": 0.2, "temperature": 0.6},
        {"temperature": 0.8, "top_k": 4, "top_p": 0.9, "min_p": 0.1},
    ],
    ids=repr,
)
def test_sampled_frequencies_match_the_truncated_distribution(params):
    expected = reference_probs(LOGITS, **params)
    assert_matches(draw_counts(LOGITS, **params), expected)


def test_a_draw_never_takes_a_token_of_no_mass():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0], [0.0, 0.0, 2.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 3.0]])
    edges = torch.tensor([[0.0], [1.0 - 2**-53], [0.999999]], dtype=torch.float64)  # the first and last mass
    assert draw_from(probs, edges).tolist() == [1, 2, 4]
    # a uniform that rounds up to the row's total (u * total == total) takes its last token with mass
    assert draw_from(probs, torch.ones(3, 1, dtype=torch.float64)).tolist() == [3, 2, 4]
    middle = torch.tensor([[0.5], [0.5], [0.25]], dtype=torch.float64)
    assert draw_from(probs, middle).tolist() == [3, 2, 4]  # the cumulative mass must exceed u: 0.5 is not past 0.5


def test_reference_distributions_differ():
    """The statistical check can tell these apart (so a sampler ignoring a parameter fails)."""
    base = draw_counts(LOGITS)
    for params in ({"temperature": 0.5}, {"top_p": 0.8}, {"min_p": 0.3}, {"top_k": 3}):
        with pytest.raises(AssertionError):
            assert_matches(base, reference_probs(LOGITS, **params))


def test_top_p_keeps_the_smallest_set_reaching_p():
    # probabilities 0.5, 0.25, 0.125, 0.125 exactly
    logits = torch.tensor([0.5, 0.25, 0.125, 0.125]).log().tolist()
    assert set(draw_counts(logits, n=4000, top_p=0.6).nonzero().flatten().tolist()) == {0, 1}
    assert set(draw_counts(logits, n=4000, top_p=0.4).nonzero().flatten().tolist()) == {0}
    assert set(draw_counts(logits, n=4000, top_p=0.9).nonzero().flatten().tolist()) == {0, 1, 2, 3}


def test_top_p_at_the_exact_boundary():
    # the top token alone has mass 0.5: top_p=0.5 must keep only it; 0.5+0.25 reaches 0.75 exactly
    logits = torch.tensor([0.5, 0.25, 0.125, 0.125]).log().tolist()
    assert set(draw_counts(logits, n=4000, top_p=0.5).nonzero().flatten().tolist()) == {0}
    assert set(draw_counts(logits, n=4000, top_p=0.75).nonzero().flatten().tolist()) == {0, 1}


def full_sort_top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The definition, on every row whole: sort, keep while the mass strictly above is short of p."""
    sorted_probs, order = probs.sort(-1, descending=True)
    kept = sorted_probs.cumsum(-1) - sorted_probs < top_p.unsqueeze(1) * probs.sum(-1, keepdim=True)
    return probs.masked_fill(~kept.scatter(1, order, kept), 0.0)


@pytest.mark.parametrize("vocab", [5, 3000, 49152])
def test_top_p_of_few_candidates_equals_sorting_the_whole_vocabulary(vocab):
    """Peaked rows (a set within 64 tokens), middling ones (within 1024) and flat ones (sorted whole), with
    zeroed tokens, in one batch: the same kept tokens as sorting every row."""
    torch.manual_seed(0)
    rows = 48
    sharpness = torch.tensor([12.0, 6.0, 3.0, 1.5, 0.5, 0.1]).repeat(rows // 6).unsqueeze(1)
    probs = (torch.randn(rows, vocab) * sharpness).softmax(-1)
    probs[::5, ::3] = 0.0  # tokens already dropped (top-k, min-p)
    top_p = torch.linspace(0.05, 0.99, rows)[torch.randperm(rows)]
    got = keep_top_p(probs, top_p)
    assert torch.equal(got, full_sort_top_p(probs, top_p))
    kept = (got > 0).sum(-1)
    if vocab == 49152:  # every path taken (so a wrong one fails here)
        assert (kept <= 64).any() and ((kept > 64) & (kept <= 1024)).any() and (kept > 1024).any(), kept


@pytest.mark.parametrize("peaked_only", [False, True])
def test_top_p_rows_draw_the_token_the_whole_vocabulary_gives(peaked_only):
    """Rows whose top-p set is within their 64 most likely tokens draw among those: for the same uniforms,
    the same tokens as the draw over the whole vocabulary (rows beside them sorted whole, or top-p 1)."""
    torch.manual_seed(0)
    rows, vocab = 48, 49152
    sharpness = torch.tensor([12.0, 6.0, 3.0, 1.5, 0.5, 0.1]).repeat(rows // 6).unsqueeze(1)
    logits = torch.randn(rows, vocab) * (12.0 if peaked_only else sharpness)
    top_ps = [0.5, 0.9, 0.95] if peaked_only else [0.5, 0.9, 0.95, 1.0]
    params = [SamplingParams(top_p=top_ps[i % len(top_ps)], min_p=[0.0, 0.01][i % 2]) for i in range(rows)]
    uniforms = torch.rand(rows, 1, dtype=torch.float64)
    probs = logits.softmax(-1)
    min_p = torch.tensor([p.min_p for p in params]).unsqueeze(1)
    probs = probs.masked_fill(probs < min_p * probs.max(-1, keepdim=True).values, 0.0)
    expected = draw_from(keep_top_p(probs, torch.tensor([p.top_p for p in params])), uniforms)
    assert torch.equal(_draw_vocabulary(logits, params, uniforms), expected)


def test_top_p_of_one_keeps_every_token_beside_rows_that_truncate():
    # a long tail of tiny probabilities: float32's running sum reaches the total before the last tokens
    probs = torch.cat([torch.tensor([0.999]), torch.full((5000,), 1e-3 / 5000)]).repeat(3, 1)
    got = keep_top_p(probs, torch.tensor([1.0, 0.5, 0.9999]))
    assert torch.equal(got[0], probs[0])
    assert (got[1] > 0).sum() == 1
    assert torch.equal(got[2], full_sort_top_p(probs[2:], torch.tensor([0.9999]))[0])


def test_top_k_keeps_every_token_tied_with_the_k_th():
    assert set(draw_counts([3.0, 2.0, 2.0, 2.0, 1.0], n=4000, top_k=2).nonzero().flatten().tolist()) == {0, 1, 2, 3}


def test_seeded_top_k_draws_through_ties_do_not_depend_on_the_batch():
    """Top-p cutting through 100 tied candidates keeps the same ones whatever k the other rows ask for."""
    tied = torch.full((1, 1000), -10.0)
    tied[0, :100] = 1.0
    for step in range(8):
        row = dict(output=[5] * step, seed=7, top_k=100, top_p=0.1)
        alone = sample(tied, [make(rid="a", **row)]).token_ids[0]
        beside = sample(torch.cat([tied, torch.zeros(1, 1000)]), [make(rid="a", **row), make(rid="b", top_k=1)])
        assert beside.token_ids[0] == alone


def test_a_nan_logit_beside_a_tie_at_the_k_th_ends():
    out = sample(torch.tensor([[float("nan"), 1.0, 1.0, 0.0]]), [make(top_k=2)])  # (topk puts NaN first)
    assert len(out.token_ids) == 1


def test_top_k_rows_draw_as_the_vocabulary_masked_to_their_top_k():
    """Rows with a top-k draw among their candidates only: the same tokens, for the same uniforms, as the
    whole vocabulary's path on logits masked to each row's top-k (ties with the k-th kept: half the rows
    are rounded to tenths, so ties reach far past k), with min-p and top-p after it."""
    torch.manual_seed(0)
    rows, vocab = 64, 49152
    logits = torch.randn(rows, vocab) * torch.linspace(0.5, 8.0, rows).unsqueeze(1)
    logits[::2] = (logits[::2] * 10).round() / 10
    logits[3, : vocab - 5] = float("-inf")  # fewer tokens left than its k
    params = [
        SamplingParams(
            temperature=1.0,
            top_k=[1, 5, 40, 1000][i // 2 % 4],
            top_p=1.0 if i % 2 == 0 else [0.9, 0.5, 1.0][i % 3],  # (which of tokens tied at p's edge: either)
            min_p=[0.0, 0.05][i // 8 % 2],
        )
        for i in range(rows)
    ]
    uniforms = torch.rand(rows, 1, dtype=torch.float64)
    kth = torch.stack([logits[i].sort(descending=True).values[params[i].top_k - 1] for i in range(rows)]).unsqueeze(1)
    expected = _draw_vocabulary(logits.masked_fill(logits < kth, float("-inf")), params, uniforms)
    assert torch.equal(_draw_top_k(logits, params, uniforms), expected)


def test_min_p_removes_tokens_below_min_p_times_max():
    # probabilities 0.4, 0.3, 0.2, 0.1: max 0.4, min_p 0.6 -> threshold 0.24
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log().tolist()
    counts = draw_counts(logits, n=6000, min_p=0.6)
    assert set(counts.nonzero().flatten().tolist()) == {0, 1}
    assert_matches(counts, [4 / 7, 3 / 7, 0.0, 0.0])


@pytest.mark.parametrize("mass", [0.0, 0.05, 0.3, 0.9, 0.999])
def test_typical_keeps_what_transformers_typical_warper_keeps(mass):
    from transformers.generation.logits_process import TypicalLogitsWarper

    generator = torch.Generator().manual_seed(7)
    for trial in range(40):
        logits = torch.randn(4, 2000, generator=generator) * (1 + trial % 5)
        if trial % 3 == 0:  # tokens an earlier mask took out
            logits[:, torch.randperm(2000, generator=generator)[:300]] = -INF
        if trial % 7 == 0:  # ties
            logits = logits.round()
        kept = keep_typical(logits.clone(), torch.full((4,), mass))
        # transformers takes a mass in (0, 1): 0 is its smallest, the one most typical token and its ties
        warper = TypicalLogitsWarper(mass=max(mass, 1e-9))
        reference = torch.cat([warper(None, logits[i : i + 1].clone()) for i in range(4)])
        assert torch.equal(kept.isinf(), reference.isinf()), (trial, mass)
        assert torch.equal(kept[~kept.isinf()], logits[~kept.isinf()])  # the kept logits are untouched


def test_typical_draws_come_from_the_typical_set_in_proportion():
    # probabilities 0.5, 0.25, 0.125, 0.0625 x2: entropy 1.875 bits, surprisals 1, 2, 3, 4, 4 bits; nearest
    # first: token 1 (0.125 away, mass 0.25), token 0 (0.875, mass 0.75 >= 0.6): the set {0, 1}, as 2/3, 1/3
    logits = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625]).log().tolist()
    counts = draw_counts(logits, n=6000, typical_p=0.6)
    assert_matches(counts, [2 / 3, 1 / 3, 0.0, 0.0, 0.0])
    assert_matches(draw_counts(logits, n=6000, typical_p=1.0), [0.5, 0.25, 0.125, 0.0625, 0.0625])


# ---------------------------------------------------------------- masks, bias, min_tokens


def test_apply_masks_and_bias_exact():
    logits = torch.tensor(
        [
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        ]
    )
    requests = [
        make(allowed_token_ids=[1, 3, 99]),  # ids past the vocabulary are ignored
        make(logit_bias={0: 10.0, 5: -2.5, 99: 1.0}),
        make(allowed_token_ids=[0, 3], logit_bias={3: 1.5, 4: 10.0}),
        make(),
    ]
    result = _apply_masks_and_bias(logits.clone(), [SamplingRow.of(r) for r in requests])
    expected = torch.tensor(
        [
            [-INF, 2.0, -INF, 4.0, -INF, -INF],
            [11.0, 2.0, 3.0, 4.0, 5.0, 3.5],
            [1.0, -INF, -INF, 5.5, -INF, -INF],
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        ]
    )
    assert torch.equal(result, expected)


def test_min_tokens_bans_eos_and_stop_token_ids_until_reached():
    row = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    requests = [
        make(min_tokens=3, output=[0, 1], stop_token_ids=[4]),  # 2 < 3: EOS and 4 banned
        make(min_tokens=3, output=[0, 1, 1], stop_token_ids=[4]),  # reached: nothing banned
        make(min_tokens=3, output=[0], stop_token_ids=[4], ignore_eos=True),  # EOS stays allowed
        make(min_tokens=0, stop_token_ids=[4]),
    ]
    result = _apply_masks_and_bias(torch.tensor([row] * 4), [SamplingRow.of(r) for r in requests])
    expected = torch.tensor(
        [
            [0.0, 0.0, -INF, 0.0, -INF, 0.0],
            row,
            [0.0, 0.0, 0.0, 0.0, -INF, 0.0],
            row,
        ]
    )
    assert torch.equal(result, expected)


def test_min_tokens_end_to_end_greedy():
    logits = torch.tensor([[0.0, 1.0, 9.0, 2.0, 8.0]])  # EOS (2) best, then stop id 4
    request = make(temperature=0.0, min_tokens=2, stop_token_ids=[4])
    tokens = []
    for _ in range(3):
        token = sample(logits, [request]).token_ids[0]
        tokens.append(token)
        request.append_token(token)
    assert tokens == [3, 3, 2]


def test_logit_bias_and_allowed_tokens_steer_sampling():
    logits = torch.tensor([[5.0, 0.0, 0.0, 0.0, 0.0]])
    assert sample(logits, [make(temperature=0.0, logit_bias={3: 6.0})]).token_ids == [3]
    assert sample(logits, [make(temperature=0.0, logit_bias={0: -100.0})]).token_ids[0] != 0
    counts = draw_counts([5.0, 0.0, 0.3, 0.0, 1.0], n=3000, allowed_token_ids=[1, 2])
    assert set(counts.nonzero().flatten().tolist()) == {1, 2}
    assert_matches(counts, [0.0, 1 / (1 + math.exp(0.3)), math.exp(0.3) / (1 + math.exp(0.3)), 0.0, 0.0])
    # bias shifts the sampled distribution like a logit change
    assert_matches(draw_counts(LOGITS, logit_bias={4: 3.0}), reference_probs([2.0, 1.0, 0.5, 0.0, 2.0]))


# ---------------------------------------------------------------- penalties


def test_apply_penalties_exact():
    row = [2.0, -1.0, 0.5, -0.5, 3.0, 0.0]
    logits = torch.tensor([row] * 4)
    requests = [
        # repetition on prompt + output tokens (0 in both: penalised once); frequency/presence on output only
        make(prompt=[0, 1], output=[2, 2, 3, 0], repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
        make(prompt=[0, 1], output=[2, 2, 3, 0]),  # no penalties: untouched
        make(prompt=[4, 4, 4], output=[1], repetition_penalty=0.5),  # < 1 favours repeats
        make(prompt=[4], output=[3, 3, 3], frequency_penalty=-1.0, presence_penalty=-0.5),
    ]
    result = _apply_penalties(logits.clone(), [SamplingRow.of(r) for r in requests])
    expected = torch.tensor(
        [
            [2.0 / 2 - 0.5 - 0.25, -1.0 * 2, 0.5 / 2 - 2 * 0.5 - 0.25, -0.5 * 2 - 0.5 - 0.25, 3.0, 0.0],
            row,
            [2.0, -1.0 * 0.5, 0.5, -0.5, 3.0 / 0.5, 0.0],
            [2.0, -1.0, 0.5, -0.5 + 3.0 + 0.5, 3.0, 0.0],
        ]
    )
    torch.testing.assert_close(result, expected)


def test_a_penalty_window_reads_the_last_tokens_of_prompt_and_output_alone():
    # llama.cpp's repeat_last_n (Ollama's option): all three penalties over the window, prompt tokens counted
    row = [2.0, -1.0, 0.5, -0.5, 3.0, 0.0]
    penalties = {"repetition_penalty": 2.0, "frequency_penalty": 0.5, "presence_penalty": 0.25}
    requests = [
        make(prompt=[4, 0, 1, 1], output=[2, 3], penalty_window=4, **penalties),  # window [1, 1, 2, 3]
        make(prompt=[4, 0, 1, 1], output=[2, 3, 3, 0, 2], penalty_window=3, **penalties),  # window [3, 0, 2]
        make(prompt=[4, 0, 1, 1], output=[2, 3], penalty_window=100, **penalties),  # all: [4, 0, 1, 1, 2, 3]
    ]
    result = _apply_penalties(torch.tensor([row] * 3), [SamplingRow.of(r) for r in requests])

    def penalised(tokens: list[int]) -> list[float]:
        out = list(row)
        for token in set(tokens):
            value = row[token] / 2.0 if row[token] > 0 else row[token] * 2.0
            out[token] = value - 0.5 * tokens.count(token) - 0.25
        return out

    expected = [penalised([1, 1, 2, 3]), penalised([3, 0, 2]), penalised([4, 0, 1, 1, 2, 3])]
    torch.testing.assert_close(result, torch.tensor(expected))
    with pytest.raises(ValueError, match="penalty_window"):
        SamplingParams(penalty_window=0)


def dense_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """The penalties written over the whole [rows, vocabulary]: counts by one-hot sums."""
    out = logits.clone()
    vocab = logits.shape[-1]
    for i, row in enumerate(rows):
        p = row.params
        counts = torch.zeros(vocab)
        for token in row.output_token_ids or []:
            counts[token] += 1
        seen = counts > 0
        for token in row.prompt_token_ids or []:
            seen[token] = True
        x = out[i]
        x = torch.where(seen, torch.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty), x)
        out[i] = x - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).float()
    return out


def test_penalties_change_only_seen_tokens_as_over_the_whole_vocabulary():
    """The penalties, worked out on each row's seen tokens alone, give the dense computation's bits."""
    generator = torch.Generator().manual_seed(0)
    vocab = 4096

    def tokens(n: int, high: int = vocab) -> list[int]:
        return torch.randint(0, high, (n,), generator=generator).tolist()

    rows = [
        SamplingRow(
            SamplingParams(repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres),
            0,
            output_token_ids=tokens(n_out, 64) + [vocab - 1],
            prompt_token_ids=tokens(n_prompt) if rep != 1.0 else None,
        )
        for rep, freq, pres, n_prompt, n_out in [
            (1.05, 0.0, 0.0, 300, 40),
            (1.0, 0.5, 0.0, 0, 100),
            (0.8, -0.3, 0.7, 20, 0),
            (1.3, 0.2, -1.0, 0, 7),
        ]
    ]
    rows.insert(2, SamplingRow(SamplingParams(), 0))  # no penalties: untouched
    logits = torch.randn(len(rows), vocab, generator=generator) * 3
    logits[:, :8] = 0.0  # neither side of the repetition's sign
    assert torch.equal(_apply_penalties(logits.clone(), rows), dense_penalties(logits, rows))


def test_penalties_flip_greedy_choice():
    logits = torch.tensor([[3.0, 2.5, 0.0, 2.0, 1.0]])
    # repetition from the prompt alone
    assert sample(logits, [make(prompt=[0], temperature=0.0)]).token_ids == [0]
    assert sample(logits, [make(prompt=[0], temperature=0.0, repetition_penalty=1.5)]).token_ids == [1]
    # frequency and presence ignore the prompt ...
    assert sample(logits, [make(prompt=[0, 0, 0], temperature=0.0, frequency_penalty=2.0)]).token_ids == [0]
    assert sample(logits, [make(prompt=[0], temperature=0.0, presence_penalty=2.0)]).token_ids == [0]
    # ... but count output tokens
    assert sample(logits, [make(output=[0], temperature=0.0, presence_penalty=1.0)]).token_ids == [1]
    assert sample(logits, [make(output=[0], temperature=0.0, frequency_penalty=0.4)]).token_ids == [0]
    assert sample(logits, [make(output=[0, 0], temperature=0.0, frequency_penalty=0.4)]).token_ids == [1]


def test_penalties_keep_banned_tokens_banned():
    logits = torch.tensor([[1.0, 0.0, 5.0, 0.5, 0.0]])
    request = make(
        prompt=[2],
        output=[2],
        temperature=0.0,
        min_tokens=3,
        presence_penalty=-2.0,
        frequency_penalty=-2.0,
        repetition_penalty=0.1,
    )
    assert sample(logits, [request]).token_ids == [0]


# ---------------------------------------------------------------- logprobs


def test_logprobs_are_raw_with_ranks_and_sampled_token_first():
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.2, 0.8, 2.5]])
    raw = logits.log_softmax(-1)[0]
    # the sampled token is forced to token 4 (rank 4) by allowed_token_ids, and temperature
    # and bias must not change the reported logprobs
    request = make(
        temperature=0.5, allowed_token_ids=[4], logit_bias={4: 5.0}, repetition_penalty=1.3, prompt=[5], logprobs=3
    )
    out = sample(logits, [request])
    assert out.token_ids == [4]
    entry = out.logprobs[0]
    assert entry.token_ids == [4, 5, 1, 3]
    assert entry.ranks == [4, 1, 2, 3]
    torch.testing.assert_close(torch.tensor(entry.logprobs), raw[[4, 5, 1, 3]])


def test_logprobs_zero_gives_only_the_sampled_token_and_none_when_not_asked():
    logits = torch.tensor([[0.3, 2.0, -1.0], [1.0, 0.0, 0.0]])
    out = sample(logits, [make(temperature=0.0, logprobs=0), make(temperature=0.0)])
    assert out.token_ids == [1, 0]
    entry = out.logprobs[0]
    assert entry.token_ids == [1] and entry.ranks == [1]
    assert entry.logprobs[0] == pytest.approx(float(logits[0].log_softmax(-1)[1]))
    assert out.logprobs[1] is None


def test_logprobs_of_sampled_tokens_in_a_batch():
    torch.manual_seed(5)
    logits = torch.randn(6, 20) * 3
    requests = [make(rid=str(i), logprobs=2, temperature=1.0 if i % 2 else 0.0) for i in range(6)]
    out = sample(logits, requests)
    raw = logits.log_softmax(-1)
    for i, (token, entry) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        top = raw[i].topk(2)
        assert entry.token_ids == [token] + top.indices.tolist()
        torch.testing.assert_close(torch.tensor(entry.logprobs), raw[i, [token] + top.indices.tolist()])
        assert entry.ranks[0] == int((raw[i] > raw[i, token]).sum()) + 1
        assert entry.ranks[1:] == [1, 2]


def banning(output: list[int], sequences: list[list[int]], **params) -> Request:
    request = make(output=output, **params)
    request.bad_words_token_ids = sequences
    return request


def test_bad_words_ban_single_tokens_always_and_a_sequence_s_last_token_after_its_prefix():
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0]] * 4)
    requests = [
        banning([], [[0]], temperature=0.0),  # a one-token word: banned from the first token on
        banning([3], [[3, 0]], temperature=0.0),  # the output ends with the prefix: 0 is banned
        banning([3, 4], [[3, 0]], temperature=0.0),  # the prefix is not at the end: nothing is banned
        banning([1], [[2, 1, 0]], temperature=0.0),  # longer than the output allows: nothing is banned
    ]
    assert sample(logits, requests).token_ids == [1, 1, 0, 0]


def test_bad_words_hold_for_random_sampling():
    torch.manual_seed(0)
    requests = [banning([], [[0], [1]], temperature=1.0) for _ in range(2000)]
    tokens = sample(torch.tensor([[3.0, 3.0, 0.0, 0.0, 0.0]]).repeat(2000, 1), requests).token_ids
    assert 0 not in tokens and 1 not in tokens and set(tokens) == {2, 3, 4}


def test_bad_words_token_ids_follow_vllm():
    from llmp.api import RequestValidationError
    from llmp.engine.sampler import bad_words_token_ids
    from llmp.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    # "cache" starts a text as one sequence and follows a space as another of the same length
    assert encode("cache")[0] != encode(" cache")[0] and len(encode("cache")) == len(encode(" cache")) == 2
    assert bad_words_token_ids(["cache", "  cache"], tokenizer, 400) == [encode("cache"), encode(" cache")] * 2
    # "fox" after a space is one token, not two: it is banned only as written (vLLM's rule)
    assert len(encode("fox")) == 2 and len(encode(" fox")) == 1
    assert bad_words_token_ids([" fox"], tokenizer, 400) == [encode("fox")]
    with pytest.raises(RequestValidationError, match="vocabulary size is 10") as info:
        bad_words_token_ids(["fox"], tokenizer, 10)
    assert info.value.field == "bad_words"
    with pytest.raises(RequestValidationError) as info:
        bad_words_token_ids([" "], tokenizer, 400)
    assert info.value.field == "bad_words"
