"""The native BERT encoder's pooling options (a sentence-transformers config's mean pooling and
normalisation, Matryoshka dimensions) and refusals. (Its token states and CLS embeddings against
transformers' BertModel: tests/test_conformance.py.)"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from llmp import LLM, PoolingParams, SamplingParams
from llmp.testing import tiny_tokenizer


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    from transformers import BertConfig, BertModel

    path = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=400,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    model = BertModel(config).eval()
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path, model


def reference(model: torch.nn.Module, ids: list[int], pooling: str) -> torch.Tensor:
    with torch.no_grad():
        hidden = model(torch.tensor([ids])).last_hidden_state[0]
    return hidden.mean(0) if pooling == "mean" else hidden[0]


def prompts(count: int = 6) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, 400) for _ in range(rng.randint(2, 40))] for _ in range(count)]


def test_sentence_transformers_config_selects_mean_pooling_and_normalisation(tiny_bert, tmp_path):
    path, model = tiny_bert
    st = tmp_path / "st"
    st.mkdir()
    for file in path.iterdir():
        (st / file.name).write_bytes(file.read_bytes())
    (st / "1_Pooling").mkdir()
    (st / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    (st / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
            ]
        )
    )
    llm = LLM(str(st), dtype="float32", hf_overrides={"is_matryoshka": True})  # so `dimensions` may cut it
    ids = prompts(1)[0]
    [output] = llm.embed({"prompt_token_ids": ids}, use_tqdm=False)
    expected = torch.nn.functional.normalize(reference(model, ids, "mean"), dim=-1)
    assert torch.allclose(torch.tensor(output.outputs.embedding), expected, atol=1e-5)
    [raw] = llm.embed({"prompt_token_ids": ids}, PoolingParams(normalize=False, dimensions=16), use_tqdm=False)
    assert torch.allclose(torch.tensor(raw.outputs.embedding), reference(model, ids, "mean")[:16], atol=1e-5)


def test_embedding_models_refuse_generation_and_bad_inputs(tiny_bert):
    llm = LLM(str(tiny_bert[0]), dtype="float32")
    with pytest.raises(ValueError, match="cannot generate"):
        llm.generate("hello", SamplingParams(), use_tqdm=False)
    with pytest.raises(ValueError, match="at most 128"):
        llm.embed({"prompt_token_ids": [5] * 129}, use_tqdm=False)
    with pytest.raises(ValueError, match="does not support Matryoshka embeddings"):
        llm.embed("hello", PoolingParams(dimensions=16), use_tqdm=False)
    assert len(llm.embed("hello", use_tqdm=False)[0].outputs.embedding) == 64
