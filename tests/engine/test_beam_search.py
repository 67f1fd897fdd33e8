"""LLM.beam_search (vLLM's) against transformers' beam search and a direct reference on the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmp import LLM, BeamSearchParams, SamplingParams
from llmp.beam_search import beam_score
from llmp.testing import hf_beam_search, save_tiny_llama

PROMPTS = ["The quick brown fox", "Paged attention keeps"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("tiny-llama-beams")
    return path, save_tiny_llama(path, vocab_size=400, logit_scale=4.0)


@pytest.fixture(scope="module")
def llm(tiny) -> LLM:
    return LLM(str(tiny[0]), dtype="float32", block_size=4, max_model_len=64)


def text_after(tokenizer, prompt_ids: list[int], generated: list[int]) -> str:
    """What a generation's text is: the decode of prompt and output, past the prompt's own."""
    prompt_text = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    return tokenizer.decode(prompt_ids + generated, skip_special_tokens=True)[len(prompt_text) :]


def sequence_logprob(model: torch.nn.Module, prompt_ids: list[int], generated: list[int]) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + generated])).logits[0].float()
    logprobs = logits.log_softmax(-1)
    return sum(logprobs[len(prompt_ids) - 1 + i, token].item() for i, token in enumerate(generated))


@pytest.mark.parametrize("width", [1, 3])
def test_beams_equal_transformers_beam_search(llm, tiny, width):
    model = tiny[1]
    tokenizer = llm.get_tokenizer()
    params = BeamSearchParams(beam_width=width, max_tokens=6, ignore_eos=True)
    outputs = llm.beam_search(PROMPTS, params)
    assert len(outputs) == len(PROMPTS)
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        prompt_ids = tokenizer.encode(prompt)
        generated = [beam.tokens[len(prompt_ids) :] for beam in output.sequences]
        assert all(beam.tokens[: len(prompt_ids)] == prompt_ids for beam in output.sequences)
        assert generated == hf_beam_search(model, prompt_ids, width, 6)
        for beam, ids in zip(output.sequences, generated, strict=True):
            assert beam.cum_logprob == pytest.approx(sequence_logprob(model, prompt_ids, ids), abs=1e-3)
            assert beam.text == text_after(tokenizer, prompt_ids, ids)
            assert beam.finish_reason == "length" and len(beam.logprobs) == 6
    # vLLM's concurrency_limit: the prompts searched a few at a time give the same beams
    limited = llm.beam_search(PROMPTS, params, concurrency_limit=1)
    assert [[b.tokens for b in o.sequences] for o in limited] == [[b.tokens for b in o.sequences] for o in outputs]
    # a width of one is greedy decoding
    if width == 1:
        greedy = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        assert [o.sequences[0].text for o in outputs] == [g.outputs[0].text for g in greedy]


def test_a_beam_ending_in_eos_is_a_finished_hypothesis(llm, tiny):
    """With EOS allowed, a candidate ending in it leaves the search; the results are ranked by the
    length-penalised score, EOS not counted in the length. The end token is made one the model
    often proposes (the greedy third token), so some beams finish."""
    tokenizer = llm.get_tokenizer()
    prompt_ids = tokenizer.encode(PROMPTS[0])
    greedy = llm.generate({"prompt_token_ids": prompt_ids}, SamplingParams(temperature=0, max_tokens=3))
    eos = greedy[0].outputs[0].token_ids[2]
    ended = LLM(str(tiny[0]), dtype="float32", block_size=4, max_model_len=64, hf_overrides={"eos_token_id": eos})
    eos_ids = ended.engine.eos_token_ids
    assert eos in eos_ids
    finished = 0
    for length_penalty in (0.0, 1.0, 2.0):
        params = BeamSearchParams(beam_width=4, max_tokens=8, length_penalty=length_penalty)
        [output] = ended.beam_search([{"prompt_token_ids": prompt_ids}], params)
        scores = [beam_score(b.tokens, b.cum_logprob, eos_ids, length_penalty) for b in output.sequences]
        assert scores == sorted(scores, reverse=True) and len(output.sequences) == 4
        for beam in output.sequences:
            generated = beam.tokens[len(prompt_ids) :]
            assert beam.cum_logprob == pytest.approx(sequence_logprob(tiny[1], prompt_ids, generated), abs=1e-3)
            if beam.finish_reason == "stop":
                finished += 1
                assert generated[-1] in eos_ids and not eos_ids.intersection(generated[:-1])
                assert beam.stop_reason == generated[-1]
                assert beam.text == text_after(tokenizer, prompt_ids, generated[:-1])
            else:
                assert len(generated) == 8 and not eos_ids.intersection(generated)
    assert finished > 0
    params = BeamSearchParams(beam_width=4, max_tokens=8, include_stop_str_in_output=True)
    [output] = ended.beam_search([{"prompt_token_ids": prompt_ids}], params)
    stopped = [beam for beam in output.sequences if beam.finish_reason == "stop"]
    texts = [text_after(tokenizer, prompt_ids, b.tokens[len(prompt_ids) :]) for b in stopped]
    assert stopped and [b.text for b in stopped] == texts


def test_context_length_ends_the_beams(tiny):
    llm = LLM(str(tiny[0]), dtype="float32", block_size=4, max_model_len=12)
    prompt_ids = llm.get_tokenizer().encode(PROMPTS[0])
    [output] = llm.beam_search([{"prompt_token_ids": prompt_ids}], BeamSearchParams(2, 50, ignore_eos=True))
    assert [len(beam.tokens) for beam in output.sequences] == [12, 12]
    assert {beam.finish_reason for beam in output.sequences} == {"length"}


def test_bad_parameters_are_errors(llm):
    with pytest.raises(ValueError, match="beam_width"):
        BeamSearchParams(beam_width=0, max_tokens=4)
    with pytest.raises(ValueError, match="max_tokens"):
        BeamSearchParams(beam_width=2, max_tokens=0)
    with pytest.raises(TypeError, match="BeamSearchParams"):
        llm.beam_search(PROMPTS, SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="concurrency_limit must be a positive integer"):
        llm.beam_search(PROMPTS, BeamSearchParams(beam_width=2, max_tokens=2), concurrency_limit=0)
    assert llm.generate(PROMPTS[0], SamplingParams(max_tokens=2))[0].outputs[0].token_ids  # still serving


def test_a_salted_prompt_keeps_its_salt_in_every_step(llm):
    """cache_salt (vLLM's) reaches each step's request: the beams' blocks are shared with that salt only."""
    from llmp import Prompt

    ids = llm.get_tokenizer().encode("Continuous batching serves many requests at once, step by step")
    llm.beam_search([Prompt(token_ids=ids, cache_salt="tenant-a")], BeamSearchParams(beam_width=2, max_tokens=2))
    greedy = SamplingParams(temperature=0, max_tokens=1)
    same, other = llm.generate(
        [Prompt(token_ids=ids, cache_salt="tenant-a"), Prompt(token_ids=ids, cache_salt="tenant-b")], greedy
    )
    assert same.num_cached_tokens >= len(ids) - 4 and other.num_cached_tokens == 0
