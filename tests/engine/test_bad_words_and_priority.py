"""Request fields the engine honours as vLLM does, on a tiny random Llama: bad_words and priority."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmp import LLM, AsyncLLM, SamplingParams
from llmp.api import RequestValidationError
from llmp.engine.sampler import bad_words_token_ids
from llmp.testing import save_tiny_llama

OPTIONS = dict(dtype="float32", block_size=4, max_model_len=256)
PROMPT = "The quick brown fox"
VOCAB = 400


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama-fields")
    save_tiny_llama(path, vocab_size=VOCAB, logit_scale=4.0)
    return path


@pytest.fixture(scope="module")
def llm(model_dir) -> LLM:
    return LLM(str(model_dir), **OPTIONS)


def tokens(llm: LLM, **params) -> list[int]:
    params = SamplingParams(max_tokens=20, ignore_eos=True, **{"temperature": 0.0, **params})
    return list(llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0].token_ids)


def sequences_of(llm: LLM, token_ids: list[int]) -> list[list[int]]:
    """What the engine bans for the word these tokens spell ([] when it spells only whitespace)."""
    try:
        return bad_words_token_ids([llm.get_tokenizer().decode(token_ids)], llm.get_tokenizer(), VOCAB)
    except RequestValidationError:
        return []


def pairs(ids: list[int]) -> list[list[int]]:
    return [ids[i : i + 2] for i in range(len(ids) - 1)]


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "top_k": 1}], ids=["greedy", "random"])
def test_a_banned_word_s_token_never_appears(llm, sampling):
    greedy = tokens(llm)
    banned = next(t for t in greedy if sequences_of(llm, [t]) and [t] in sequences_of(llm, [t]))
    word = llm.get_tokenizer().decode([banned])
    assert tokens(llm, **sampling) == greedy  # top_k=1 draws the greedy tokens
    got = tokens(llm, bad_words=[word], **sampling)
    assert banned not in got
    assert got[: greedy.index(banned)] == greedy[: greedy.index(banned)]  # nothing changes before it


def test_a_multi_token_word_is_cut_after_its_prefix(llm):
    greedy = tokens(llm)
    # a two-token word the model writes, whose sequences first appear where it writes them
    k, sequences = next(
        (k, seqs)
        for k, pair in enumerate(pairs(greedy))
        if pair[0] != pair[1]
        and pair in (seqs := sequences_of(llm, pair))
        and all(len(s) == 2 for s in seqs)
        and min(pairs(greedy).index(s) for s in seqs if s in pairs(greedy)) == k
    )
    word = llm.get_tokenizer().decode(greedy[k : k + 2])
    got = tokens(llm, bad_words=[word])
    assert got[: k + 1] == greedy[: k + 1]  # its first token is still allowed
    assert got[k + 1] != greedy[k + 1]
    assert not any(s in pairs(got) for s in sequences)


def test_bad_words_are_checked_against_the_vocabulary(llm):
    with pytest.raises(RequestValidationError) as info:
        tokens(llm, bad_words=["   "])
    assert info.value.field == "bad_words"
    assert not llm.engine.has_unfinished_requests()


def test_priority_under_fcfs_is_refused_as_vllm_does(llm):
    params = SamplingParams(max_tokens=2)
    with pytest.raises(RequestValidationError, match="Got priority 1 but Priority scheduling is not enabled") as info:
        llm.generate(["a", "b"], params, priority=[0, 1], use_tqdm=False)
    assert info.value.field == "priority"
    assert not llm.engine.has_unfinished_requests()
    assert len(llm.generate(["a", "b"], params, priority=[0, 0], use_tqdm=False)) == 2


def test_priority_policy_runs_lower_values_first(model_dir):
    llm = LLM(str(model_dir), scheduling_policy="priority", max_num_seqs=1, **OPTIONS)
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    for request_id, priority in (("low", 9), ("high", -1), ("mid", 5)):
        llm.engine.add_request(request_id, "Paged attention", params, priority=priority)
    finished = []
    while llm.engine.has_unfinished_requests():  # one sequence at a time: in queue order
        finished += [o.request_id for o in llm.engine.step() if o.finished]
    assert finished == ["high", "mid", "low"]
    outputs = llm.generate(["a", "b"], params, priority=[3, -3], use_tqdm=False)
    assert [o.prompt for o in outputs] == ["a", "b"]  # outputs keep the input order


def test_async_llm_refuses_priority_under_fcfs_before_queuing(model_dir):
    async def run(engine: AsyncLLM, priority: int) -> list:
        return [o async for o in engine.generate("a", SamplingParams(max_tokens=2), priority=priority)]

    fcfs = AsyncLLM(str(model_dir), engine_mode="thread", **OPTIONS)
    try:
        with pytest.raises(RequestValidationError, match="Priority scheduling is not enabled") as info:
            asyncio.run(run(fcfs, 3))
        assert info.value.field == "priority" and not fcfs._streams
        assert asyncio.run(run(fcfs, 0))[-1].finished
    finally:
        fcfs.shutdown()
    priority = AsyncLLM(str(model_dir), engine_mode="thread", scheduling_policy="priority", **OPTIONS)
    try:
        assert asyncio.run(run(priority, 3))[-1].finished
    finally:
        priority.shutdown()


def test_a_priority_that_is_not_an_integer_is_refused_offline_as_on_the_server():
    from llmp.api import RequestValidationError
    from llmp.engine.scheduler import check_priority

    for bad in (1.5, "1", True):
        with pytest.raises(RequestValidationError) as caught:
            check_priority(bad, "priority")
        assert caught.value.field == "priority"
    check_priority(-3, "priority")
