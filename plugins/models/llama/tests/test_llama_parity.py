"""Greedy output of the native Llama equals transformers', token for token, on checkpoints the
conformance kit's tiny Llama is not: tied embeddings in shards, 4:1 grouped-query attention with
Llama 3 rope scaling. (Batching, block sizes, chunked prefill, the prefix cache and preemption:
tests/test_conformance.py.)"""

from __future__ import annotations

from llmp.testing import assert_greedy_parity, engine_greedy, mixed_prompts, save_tiny_llama


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
