"""Greedy output of the native Llama equals transformers', token for token,
through every path of the engine: batching, prefix caching, preemption, chunked prefill."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmp import LLM, SamplingParams
from llmp.testing import assert_greedy_parity, engine_greedy, mixed_prompts, save_tiny_llama

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("tiny-llama")
    return path, save_tiny_llama(path, qk_scale=4.0)  # sharp attention: a wrong key or position shows


def test_batch_of_mixed_lengths_matches_transformers(tiny):
    path, model = tiny
    prompts = mixed_prompts()
    got, llm = engine_greedy(path, prompts, enable_prefix_caching=False)
    assert_greedy_parity(model, prompts, got)
    assert llm.engine.kv_manager.prefix_cache_hits == 0
    assert llm.engine.scheduler.num_preemptions == 0


def test_prefix_caching_hits_and_matches_transformers(tiny):
    path, model = tiny
    prompts = mixed_prompts(shared_prefix=24, seed=2)
    llm = LLM(str(path), dtype="float32", block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    # The first request fills the cache; the others then reuse its prefix blocks.
    first = llm.generate({"prompt_token_ids": prompts[0]}, params, use_tqdm=False)
    rest = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], params, use_tqdm=False)
    got = [o.outputs[0].token_ids for o in first + rest]
    assert llm.engine.kv_manager.prefix_cache_hits >= 7 * 24
    assert all(o.num_cached_tokens >= 24 for o in rest)
    assert_greedy_parity(model, prompts, got)


def test_preemption_recomputes_and_matches_transformers(tiny):
    path, model = tiny
    prompts = mixed_prompts(seed=3)
    # 40 blocks of 4 tokens hold 160 tokens: far less than 8 prompts plus their outputs.
    got, llm = engine_greedy(path, prompts, num_kv_blocks=40, max_model_len=128)
    assert llm.engine.scheduler.num_preemptions > 0
    assert_greedy_parity(model, prompts, got)


def test_chunked_prefill_matches_transformers(tiny):
    path, model = tiny
    prompts = mixed_prompts(seed=4)
    got, llm = engine_greedy(path, prompts, max_num_batched_tokens=16, enable_prefix_caching=False)
    assert llm.engine.scheduler.num_prefill_chunks > 0
    assert_greedy_parity(model, prompts, got)


def test_tied_embeddings_and_sharded_checkpoint(tmp_path):
    model = save_tiny_llama(tmp_path, seed=5, tie_word_embeddings=True, max_shard_size="100KB", logit_scale=1.0)
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    assert (tmp_path / "model.safetensors.index.json").is_file()
    prompts = mixed_prompts(count=3, seed=5)
    got, _ = engine_greedy(tmp_path, prompts)
    assert_greedy_parity(model, prompts, got)


def test_grouped_query_attention_and_llama3_rope(tmp_path):
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    model = save_tiny_llama(tmp_path, seed=6, num_attention_heads=8, num_key_value_heads=2, rope_scaling=scaling)
    prompts = mixed_prompts(count=4, seed=6)
    got, _ = engine_greedy(tmp_path, prompts)
    assert_greedy_parity(model, prompts, got)
