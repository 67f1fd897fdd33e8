"""``thinking_token_budget`` on a tiny random Llama: the reasoning is cut at the budget by the end marker,
counted from the start marker (or from the first token when the prompt opened the reasoning), a marker
the model began is finished, a later section is closed at once, sampled rows and greedy rows alike, and
the same through AsyncLLM's engine process. Markers are plain token ids of the model's vocabulary.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmp import LLM, AsyncLLM, ReasoningMarkers, SamplingParams, StructuredOutputsParams
from llmp.sampling_params import SamplingParamsError
from llmp.testing import save_tiny_llama

OPTIONS = {"dtype": "float32", "block_size": 4, "max_model_len": 256}
PROMPT = "The quick brown fox"
START, END = [5], [7, 8]
# a model biased to say the start token, with a budget of 3: what it must generate
STARTING_OVER = SamplingParams(
    temperature=0.0,
    max_tokens=12,
    ignore_eos=True,
    logit_bias={START[0]: 100.0},
    thinking_token_budget=3,
    reasoning_markers=ReasoningMarkers(end_token_ids=END, start_token_ids=START),
)
STARTING_OVER_IDS = [5, 5, 5, 5, 7, 8, 5, 7, 8, 5, 7, 8]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama-thinking")
    save_tiny_llama(path, vocab_size=400, logit_scale=4.0)
    return path


@pytest.fixture(scope="module")
def llm(model_dir) -> LLM:
    return LLM(str(model_dir), **OPTIONS)


def ids(llm: LLM, params: SamplingParams | list[SamplingParams], prompts: int = 1) -> list[list[int]]:
    many = isinstance(params, list)
    outputs = llm.generate([PROMPT] * (len(params) if many else prompts), params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def marker_at(tokens: list[int], marker: list[int]) -> int:
    return next((i for i in range(len(tokens)) if tokens[i : i + len(marker)] == marker), -1)


def test_a_prompt_that_opened_the_reasoning_is_cut_at_the_budget(llm):
    markers = ReasoningMarkers(end_token_ids=END, start_token_ids=START, starts_inside=True)
    for budget in (0, 1, 5, 12):
        greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, bad_words=None)
        free = ids(llm, greedy)[0]
        capped = ids(
            llm,
            SamplingParams(
                temperature=0.0, max_tokens=24, ignore_eos=True, thinking_token_budget=budget, reasoning_markers=markers
            ),
        )[0]
        natural = marker_at(free, END)
        if 0 <= natural <= budget:  # the model closed it itself within the budget: nothing changes
            assert capped == free
        else:  # the first `budget` tokens are the model's, then the marker
            assert capped[:budget] == free[:budget]
            assert capped[budget : budget + len(END)] == END, (budget, capped)


def test_counting_starts_at_the_start_marker_and_a_later_section_is_closed_at_once(llm):
    # the bias makes the model say the start token over and over: the first one opens the reasoning,
    # three more are its budget, then the marker; each later start token opens a section closed at once
    assert ids(llm, STARTING_OVER)[0] == STARTING_OVER_IDS


def test_an_end_marker_the_model_began_is_finished_not_repeated(llm):
    params = SamplingParams(
        temperature=0.0,
        max_tokens=6,
        ignore_eos=True,
        logit_bias={END[0]: 100.0},  # it keeps saying the marker's first token
        thinking_token_budget=2,
        reasoning_markers=ReasoningMarkers(end_token_ids=END, start_token_ids=START, starts_inside=True),
    )
    assert ids(llm, params)[0] == [7, 7, 8, 7, 7, 7]


def test_sampled_rows_beside_free_rows(llm):
    markers = ReasoningMarkers(end_token_ids=END, start_token_ids=START, starts_inside=True)
    capped = [
        SamplingParams(
            temperature=1.0,
            seed=seed,
            max_tokens=20,
            ignore_eos=True,
            thinking_token_budget=4,
            reasoning_markers=markers,
            logprobs=2,
            n=2,
        )
        for seed in range(4)
    ]
    free = [SamplingParams(temperature=1.0, seed=100 + s, max_tokens=20, ignore_eos=True) for s in range(4)]
    outputs = llm.generate([PROMPT] * 8, [p for pair in zip(capped, free, strict=True) for p in pair], use_tqdm=False)
    for output in outputs[::2]:
        for seq in output.outputs:
            tokens = list(seq.token_ids)
            assert 0 <= marker_at(tokens, END) <= 4, tokens
            assert len(seq.logprobs) == len(tokens)
    for output, params in zip(outputs[1::2], free, strict=True):  # the free rows are untouched
        alone = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0].token_ids
        assert list(output.outputs[0].token_ids) == list(alone)


def test_a_grammar_active_from_the_first_token_is_never_broken_by_the_marker(llm):
    """A constraint without ``after_token_ids`` (a completion's) holds from the first token: there is no
    reasoning to cut, and the marker is not forced into the constrained text; one after the reasoning starts
    when the forced marker ends it."""
    markers = ReasoningMarkers(end_token_ids=END, start_token_ids=START, starts_inside=True)
    choices = ["yes", "no", "maybe so"]
    for seed in range(6):
        whole = StructuredOutputsParams(choice=choices)
        params = SamplingParams(
            temperature=1.0,
            seed=seed,
            max_tokens=30,
            structured_outputs=whole,
            thinking_token_budget=1,
            reasoning_markers=markers,
        )
        completion = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
        assert completion.text in choices and completion.finish_reason == "stop", completion
        after = StructuredOutputsParams(choice=choices, after_token_ids=END)
        params = SamplingParams(
            temperature=1.0,
            seed=seed,
            max_tokens=30,
            structured_outputs=after,
            thinking_token_budget=2,
            reasoning_markers=markers,
        )
        completion = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
        assert list(completion.token_ids[2:4]) == END and completion.finish_reason == "stop", completion


def test_bad_budgets_and_markers_are_refused(llm):
    markers = ReasoningMarkers(end_token_ids=END, start_token_ids=START)
    with pytest.raises(SamplingParamsError, match="thinking_token_budget needs reasoning_markers"):
        SamplingParams(thinking_token_budget=4)
    with pytest.raises(SamplingParamsError, match="reasoning_markers are read only with thinking_token_budget"):
        SamplingParams(reasoning_markers=markers)
    with pytest.raises(SamplingParamsError, match="thinking_token_budget must be >= 0"):
        SamplingParams(thinking_token_budget=-1, reasoning_markers=markers)
    with pytest.raises(SamplingParamsError, match="end_token_ids must not be empty"):
        ReasoningMarkers(end_token_ids=[])
    with pytest.raises(SamplingParamsError, match="needs start_token_ids, or starts_inside"):
        ReasoningMarkers(end_token_ids=END)
    far = ReasoningMarkers(end_token_ids=[4000], starts_inside=True)
    with pytest.raises(ValueError, match=r"reasoning_markers token id 4000 is out of range \[0, 400\)"):
        llm.generate(PROMPT, SamplingParams(thinking_token_budget=1, reasoning_markers=far), use_tqdm=False)


def test_through_the_engine_process(model_dir):
    engine = AsyncLLM(str(model_dir), **OPTIONS)

    async def run() -> list[int]:
        final = None
        async for final in engine.generate(PROMPT, STARTING_OVER):
            pass
        return list(final.outputs[0].token_ids)

    try:
        assert asyncio.run(run()) == STARTING_OVER_IDS
    finally:
        engine.shutdown()


def test_reasoning_token_count_leaves_out_multi_token_markers():
    """``</think>`` as three tokens (SmolLM2's ``</``, ``think``, ``>``): the reasoning is what lies
    between the markers, none of the marker's tokens."""
    from llmp.engine.thinking_budget import count_reasoning_tokens

    end, start = [7, 8, 9], [5, 6]
    reasoning = [11, 12, 13, 14]
    assert count_reasoning_tokens(reasoning + end + [20, 21], start, end, starts_inside=True) == 4
    assert count_reasoning_tokens(start + reasoning + end + [20], start, end, starts_inside=False) == 4
    assert count_reasoning_tokens([20] + start + reasoning, start, end, starts_inside=False) == 4  # cut inside
    assert count_reasoning_tokens(reasoning + [7, 8], start, end, starts_inside=True) == 6  # a marker begun, not ended
    two_sections = start + [1, 2] + end + [3] + start + [4] + end
    assert count_reasoning_tokens(two_sections, start, end, starts_inside=False) == 3
    assert count_reasoning_tokens(reasoning, [], end, starts_inside=False) == 0  # no start marker to count from
    assert count_reasoning_tokens(end + reasoning, start, end, starts_inside=True) == 0
