"""The native BERT/XLM-R encoders and cross-encoder heads equal transformers' on random checkpoints,
driven as the model runner drives them: a flattened step of several requests, positions from 0.

These build the model class directly (no engine), so they check the modules alone: hidden states,
the padded attention of a whole step, token types, the position offset of XLM-R and ``classify``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from llmp.api import AttentionMetadata
from llmp.testing import load_native_model, save_tiny_cross_encoder

QUERY = "what does the fox jump over?"
DOCUMENTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention keeps the KV cache in fixed-size blocks.",
    "dog",
    "Continuous batching serves many requests at once, step by step.",
]
ARCHITECTURES = ["BertForSequenceClassification", "XLMRobertaForSequenceClassification"]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp(request.param)
    return path, save_tiny_cross_encoder(path, request.param, num_labels=3)


def native_model(path: Path, architecture: str | None = None) -> torch.nn.Module:
    """The plugin's model for ``path``, built and loaded as the model runner does."""
    from llmp_models_bert import model as models

    architecture = architecture or json.loads((path / "config.json").read_text())["architectures"][0]
    return load_native_model(getattr(models, architecture), path)


def step_of(encodings: list[dict]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor | None]:
    """One engine step holding every encoding: flattened ids, positions from 0 per request, metadata."""
    lengths = [len(e["input_ids"]) for e in encodings]
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    ids = torch.tensor([t for e in encodings for t in e["input_ids"]])
    positions = torch.cat([torch.arange(n) for n in lengths])
    types = (
        torch.tensor([t for e in encodings for t in e["token_type_ids"]]) if "token_type_ids" in encodings[0] else None
    )
    metadata = AttentionMetadata(
        query_start_loc=starts,
        seq_lens=torch.tensor(lengths, dtype=torch.int32),
        block_tables=torch.zeros(len(lengths), 0, dtype=torch.int32),
        slot_mapping=torch.full((sum(lengths),), -1, dtype=torch.int64),
        max_query_len=max(lengths),
        max_seq_len=max(lengths),
    )
    return ids, positions, metadata, types


def reference(hf: torch.nn.Module, tokenizer, pairs: list[tuple[str, str]]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """transformers' last hidden states (each request's real tokens) and logits of a padded batch."""
    batch = tokenizer([q for q, _ in pairs], [d for _, d in pairs], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = hf(**batch, output_hidden_states=True)
    mask = batch["attention_mask"].bool()
    return [h[m] for h, m in zip(out.hidden_states[-1], mask, strict=True)], out.logits


def native_run(
    model: torch.nn.Module, encodings: list[dict], *, types: bool = True
) -> tuple[torch.Tensor | None, list]:
    ids, positions, metadata, token_types = step_of(encodings)
    with torch.no_grad():
        hidden = model(ids, positions, metadata, token_types if types else None)
        starts = metadata.query_start_loc.tolist()
        logits = model.classify(hidden[starts[:-1]]) if hasattr(model, "classify") else None
    return logits, [hidden[a:b] for a, b in zip(starts, starts[1:])]


def test_a_padded_step_of_pairs_equals_transformers(checkpoint):
    from transformers import AutoTokenizer

    path, hf = checkpoint
    tokenizer = AutoTokenizer.from_pretrained(path)
    pairs = [(QUERY, d) for d in DOCUMENTS]
    encodings = [dict(tokenizer(q, d)) for q, d in pairs]
    assert len({len(e["input_ids"]) for e in encodings}) > 1  # requests of different lengths: padding matters
    expected_states, expected_logits = reference(hf, tokenizer, pairs)
    logits, states = native_run(native_model(path), encodings)
    for got, expected in zip(states, expected_states, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, expected_logits, atol=1e-5, rtol=1e-5)
    assert expected_logits.std(0).min() > 1e-2  # the pairs' logits differ: the comparison means something


def test_output_rows_compute_just_the_pooled_rows(checkpoint):
    """Given one row per request (its [CLS] or its last), the model's last layer computes only those,
    with the values of the full computation."""
    from transformers import AutoTokenizer

    path, _ = checkpoint
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = native_model(path)
    ids, positions, metadata, types = step_of([dict(tokenizer(QUERY, d)) for d in DOCUMENTS])
    starts = metadata.query_start_loc
    for rows in (starts[:-1], starts[1:] - 1):  # cls, last
        rows = rows.to(torch.int64)
        with torch.no_grad():
            full = model(ids, positions, metadata, types)
            only = model(ids, positions, metadata, types, output_rows=rows)
        assert only.shape == (len(DOCUMENTS), full.shape[-1])
        torch.testing.assert_close(only, full[rows], atol=1e-5, rtol=1e-5)


def test_each_request_alone_equals_the_batch(checkpoint):
    from transformers import AutoTokenizer

    path, _ = checkpoint
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = native_model(path)
    encodings = [dict(tokenizer(QUERY, d)) for d in DOCUMENTS]
    batched, _ = native_run(model, encodings)
    alone = torch.cat([native_run(model, [e])[0] for e in encodings])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


def test_token_types_are_used_for_bert_pairs(tmp_path):
    from transformers import AutoTokenizer

    hf = save_tiny_cross_encoder(tmp_path, "BertForSequenceClassification", num_labels=1)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    encodings = [dict(tokenizer(QUERY, d)) for d in DOCUMENTS]
    assert all(1 in e["token_type_ids"] for e in encodings)
    model = native_model(tmp_path)
    with_types, _ = native_run(model, encodings)
    without, _ = native_run(model, encodings, types=False)
    _, expected = reference(hf, tokenizer, [(QUERY, d) for d in DOCUMENTS])
    torch.testing.assert_close(with_types, expected, atol=1e-5, rtol=1e-5)
    assert (without - expected).abs().max() > 1e-2  # ignoring the second segment's type changes the score


@pytest.mark.parametrize("architecture", ["XLMRobertaModel", "RobertaModel"])
def test_roberta_encoders_offset_positions_past_the_padding_id(tmp_path, architecture):
    from transformers import AutoTokenizer

    hf = save_tiny_cross_encoder(tmp_path, architecture)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    texts = DOCUMENTS[:3]
    encodings = [dict(tokenizer(t)) for t in texts]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = hf(**batch).last_hidden_state
    _, states = native_run(native_model(tmp_path), encodings)
    for got, row, mask in zip(states, expected, batch["attention_mask"].bool(), strict=True):
        torch.testing.assert_close(got, row[mask], atol=1e-5, rtol=1e-5)


def test_encoder_checkpoints_load_from_a_classifier_prefix(tmp_path):
    """``bert.``/``roberta.``-prefixed weights (a classifier checkpoint) load into the bare encoder."""
    from transformers import AutoTokenizer

    for architecture, encoder in [
        ("BertForSequenceClassification", "BertModel"),
        (ARCHITECTURES[1], "XLMRobertaModel"),
    ]:
        path = tmp_path / architecture
        hf = save_tiny_cross_encoder(path, architecture)
        tokenizer = AutoTokenizer.from_pretrained(path)
        states, _ = reference(hf, tokenizer, [(QUERY, DOCUMENTS[0])])
        _, got = native_run(native_model(path, encoder), [dict(tokenizer(QUERY, DOCUMENTS[0]))])
        torch.testing.assert_close(got[0], states[0], atol=1e-5, rtol=1e-5)
