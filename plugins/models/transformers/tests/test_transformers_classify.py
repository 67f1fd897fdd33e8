"""The transformers fallback serves sequence classifiers no native plugin claims (ModernBERT,
ELECTRA ...): scores of text pairs equal transformers' own. (Class probabilities:
tests/test_conformance.py.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from llmp import LLM, PoolingParams
from llmp.testing import tiny_pair_tokenizer

QUERY = "what is paged attention?"
DOCUMENTS = [
    "paged attention keeps the kv cache in fixed-size blocks.",
    "the quick brown fox jumps over the lazy dog.",
    "continuous batching serves many requests at once, step by step.",
]
# the pair tokenizer's ids: [PAD] 0, [CLS] 2, [SEP] 3
TOKENS = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3)


def modernbert(vocab_size: int, num_labels: int) -> torch.nn.Module:  # rotary, local and global attention layers
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    config = ModernBertConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=256,
        global_attn_every_n_layers=2,
        local_attention=16,
        cls_token_id=2,
        sep_token_id=3,
        initializer_range=0.2,
        num_labels=num_labels,
        **TOKENS,
    )
    return ModernBertForSequenceClassification(config)


def electra(vocab_size: int, num_labels: int) -> torch.nn.Module:  # segment (token type) embeddings
    from transformers import ElectraConfig, ElectraForSequenceClassification

    config = ElectraConfig(
        vocab_size=vocab_size,
        embedding_size=32,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        initializer_range=0.2,
        num_labels=num_labels,
        **TOKENS,
    )
    return ElectraForSequenceClassification(config)


def save_classifier(path: Path, build: Callable[[int, int], torch.nn.Module], num_labels: int) -> tuple:
    tokenizer = tiny_pair_tokenizer()
    torch.manual_seed(num_labels)
    model = build(len(tokenizer), num_labels).float().eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer


@pytest.mark.parametrize("build", [modernbert, electra], ids=lambda b: b.__name__)
def test_cross_encoder_scores_match_transformers(tmp_path, build):
    model, tokenizer = save_classifier(tmp_path, build, num_labels=1)
    llm = LLM(str(tmp_path), dtype="float32")
    assert type(llm.engine.executor.runner.model).__name__ == "TransformersForSequenceClassification"
    raw = llm.score(QUERY, DOCUMENTS, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    scores = llm.score(QUERY, DOCUMENTS, use_tqdm=False)
    for document, got_raw, got in zip(DOCUMENTS, raw, scores, strict=True):
        pair = tokenizer(QUERY, document, return_tensors="pt")
        assert got.prompt_token_ids == pair["input_ids"][0].tolist()
        with torch.no_grad():
            logit = model(**pair).logits[0, 0]
        assert got_raw.outputs.score == pytest.approx(logit.item(), abs=1e-5)
        assert got.outputs.score == pytest.approx(logit.sigmoid().item(), abs=1e-5)
    # transformers' classifier scores the sequence: no per-token rewards are made up from it
    assert "token_classify" not in llm.engine.info.options["supported_tasks"]
    with pytest.raises(ValueError, match="Classification API is not supported"):
        llm.reward(QUERY, use_tqdm=False)
