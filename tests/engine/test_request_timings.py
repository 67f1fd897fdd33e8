"""The engine's own timings of each request (``RequestOutput.metrics``) and its histogram of tokens
per step, which the server's queue/prefill/decode and iteration-token metrics are made of."""

from __future__ import annotations

import time

import pytest

from llmp import LLM, SamplingParams
from llmp.engine.step_stats import ITERATION_TOKEN_BUCKETS
from llmp.testing import save_tiny_llama

ORDER = ("arrival_time", "scheduled_time", "first_token_time", "last_token_time", "finished_time")


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    path = tmp_path_factory.mktemp("tiny-llama-timings")
    save_tiny_llama(path, vocab_size=400)
    # chunks of 8 tokens: a prompt takes several steps, each counted once in the step histogram
    return LLM(str(path), dtype="float32", block_size=4, max_model_len=128, max_num_batched_tokens=8)


def test_every_output_carries_ordered_timings(llm):
    before = time.time()
    prompts = [list(range(3, 3 + length)) for length in (5, 13, 20)]
    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in (1, 6, 4)]
    params.append(SamplingParams(max_tokens=3, n=2, temperature=1, seed=7, ignore_eos=True))
    outputs = llm.generate([{"prompt_token_ids": p} for p in [*prompts, [9, 8, 7]]], params, use_tqdm=False)
    after = time.time()
    for output in outputs:
        times = output.metrics
        assert set(times) == set(ORDER), times
        values = [times[key] for key in ORDER]
        assert before <= values[0] and values[-1] <= after, times
        assert values == sorted(values), times
    single = outputs[0].metrics  # one token: its first is its last
    assert single["first_token_time"] == single["last_token_time"]


def test_streamed_outputs_carry_timings_and_only_the_last_is_finished(llm):
    engine = llm.engine
    engine.add_request("timed", {"prompt_token_ids": [5, 6, 7, 8]}, SamplingParams(max_tokens=3, ignore_eos=True))
    seen = []
    while engine.has_unfinished_requests():
        seen += [o for o in engine.step() if o.request_id == "timed"]
    assert [o.finished for o in seen] == [False, False, True]
    assert all("finished_time" not in o.metrics for o in seen[:-1])
    assert seen[0].metrics["first_token_time"] == seen[0].metrics["last_token_time"]
    assert seen[1].metrics["last_token_time"] > seen[0].metrics["last_token_time"]
    assert seen[-1].metrics["finished_time"] >= seen[-1].metrics["last_token_time"]


def test_a_request_aborted_while_waiting_has_arrival_and_finish_only(llm):
    engine = llm.engine
    engine.add_request("never-run", {"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=3))
    (final,) = engine.abort_request("never-run")
    assert final.finished and set(final.metrics) == {"arrival_time", "finished_time"}
    assert final.metrics["finished_time"] >= final.metrics["arrival_time"]


def test_tokens_per_step_add_up_to_prompts_plus_outputs(llm):
    engine = llm.engine
    before = engine.iteration_tokens.snapshot()
    steps = engine.num_steps
    # distinct first tokens: nothing comes from the prefix cache, every prompt token is computed
    prompts = [[100 + i, *range(20, 20 + length)] for i, length in enumerate((6, 17, 30))]
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    after = engine.iteration_tokens.snapshot()
    assert after["buckets"] == list(ITERATION_TOKEN_BUCKETS)
    assert after["sum"] - before["sum"] == sum(map(len, prompts)) + 5 * len(prompts)
    assert sum(after["counts"]) - sum(before["counts"]) == engine.num_steps - steps
    # max_num_batched_tokens=8: no step computes more than 8 prompt tokens plus a sample per request
    grew = [a - b for a, b in zip(after["counts"], before["counts"], strict=True)]
    assert sum(grew[ITERATION_TOKEN_BUCKETS.index(16) + 1 :]) == 0 and sum(grew[1:]) > 0
