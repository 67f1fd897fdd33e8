"""Cross-encoders through the real engine (``llmp.LLM``): scores and class probabilities of tiny
random BERT and XLM-R checkpoints equal transformers' (float32, atol 1e-5) and sentence-transformers'
``CrossEncoder``; batching, token types and truncation do not change them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmp import LLM, PoolingParams
from llmp.testing import save_tiny_cross_encoder

QUERY = "what does the fox jump over?"
DOCUMENTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention keeps the KV cache in fixed-size blocks.",
    "dog",
    "Continuous batching serves many requests at once, step by step.",
    "def add(a, b): return a + b",
]
CROSS_ENCODERS = ["BertForSequenceClassification", "XLMRobertaForSequenceClassification"]
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


@pytest.fixture(scope="module", params=CROSS_ENCODERS)
def cross_encoder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(directory, transformers model, tokenizer, LLM) of a one-label cross-encoder."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp(request.param)
    hf = save_tiny_cross_encoder(path, request.param, num_labels=1)
    return path, hf, AutoTokenizer.from_pretrained(path), LLM(str(path), dtype="float32")


@pytest.fixture(scope="module", params=CROSS_ENCODERS)
def classifier(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(directory, transformers model, tokenizer, LLM) of a three-label classifier with named labels."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp(request.param + "-3")
    hf = save_tiny_cross_encoder(path, request.param, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    return path, hf, AutoTokenizer.from_pretrained(path), LLM(str(path), dtype="float32")


def hf_logits(hf: torch.nn.Module, tokenizer, first: list[str], second: list[str] | None = None, **cut) -> torch.Tensor:
    batch = tokenizer(first, second, padding=True, return_tensors="pt", **cut)
    with torch.no_grad():
        return hf(**batch).logits


def scores(outputs) -> torch.Tensor:
    return torch.tensor([o.outputs.score for o in outputs])


def test_scores_equal_the_sigmoid_of_transformers_logits(cross_encoder):
    _, hf, tokenizer, llm = cross_encoder
    assert "score" in llm.engine.info.options["supported_tasks"]
    outputs = llm.score(QUERY, DOCUMENTS, use_tqdm=False)
    expected = torch.sigmoid(hf_logits(hf, tokenizer, [QUERY] * len(DOCUMENTS), DOCUMENTS)[:, 0])
    torch.testing.assert_close(scores(outputs), expected, atol=1e-5, rtol=0)
    assert expected.max() - expected.min() > 0.05  # the documents score apart: the order is meaningful
    assert [o.prompt_token_ids for o in outputs] == [tokenizer(QUERY, d)["input_ids"] for d in DOCUMENTS]
    # N-N pairs and a single pair give the same numbers
    pairs = llm.score([QUERY, DOCUMENTS[1]], [DOCUMENTS[0], QUERY], use_tqdm=False)
    expected_pairs = torch.sigmoid(hf_logits(hf, tokenizer, [QUERY, DOCUMENTS[1]], [DOCUMENTS[0], QUERY])[:, 0])
    torch.testing.assert_close(scores(pairs), expected_pairs, atol=1e-5, rtol=0)
    [one] = llm.score(QUERY, DOCUMENTS[2], use_tqdm=False)
    assert abs(one.outputs.score - float(expected[2])) < 1e-5


def test_bert_pairs_use_their_token_types(tmp_path):
    """The second segment's token type changes a BERT score: ignoring it fails the parity above."""
    from transformers import AutoTokenizer

    hf = save_tiny_cross_encoder(tmp_path, "BertForSequenceClassification")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    got = scores(LLM(str(tmp_path), dtype="float32").score(QUERY, DOCUMENTS, use_tqdm=False))
    batch = tokenizer([QUERY] * len(DOCUMENTS), DOCUMENTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        with_types = torch.sigmoid(hf(**batch).logits[:, 0])
        batch["token_type_ids"].zero_()
        without_types = torch.sigmoid(hf(**batch).logits[:, 0])
    torch.testing.assert_close(got, with_types, atol=1e-5, rtol=0)
    assert (got - without_types).abs().max() > 1e-2


def test_a_batch_scores_as_each_pair_alone(cross_encoder):
    _, _, _, llm = cross_encoder
    together = scores(llm.score(QUERY, DOCUMENTS, use_tqdm=False))
    alone = torch.tensor([llm.score(QUERY, d, use_tqdm=False)[0].outputs.score for d in DOCUMENTS])
    torch.testing.assert_close(together, alone, atol=1e-6, rtol=0)


def test_truncation_matches_the_tokenizer_and_an_over_long_pair_is_refused(cross_encoder):
    _, hf, tokenizer, llm = cross_encoder
    long_document = " ".join(DOCUMENTS * 8)
    assert len(tokenizer(QUERY, long_document)["input_ids"]) > 128
    for k in (20, 128):
        [output] = llm.score(QUERY, long_document, truncate_prompt_tokens=k, use_tqdm=False)
        expected = tokenizer(QUERY, long_document, truncation=True, max_length=k)["input_ids"]
        assert output.prompt_token_ids == expected and len(expected) == k
        logit = hf_logits(hf, tokenizer, [QUERY], [long_document], truncation=True, max_length=k)[0, 0]
        assert abs(output.outputs.score - float(torch.sigmoid(logit))) < 1e-5
    [cut] = llm.score(QUERY, long_document, truncate_prompt_tokens=-1, use_tqdm=False)
    assert len(cut.prompt_token_ids) == 128
    with pytest.raises(ValueError, match=r"tokens long; this model takes at most 128"):
        llm.score(QUERY, long_document, use_tqdm=False)


def test_sentence_transformers_cross_encoder_predicts_the_same_scores(cross_encoder):
    from sentence_transformers import CrossEncoder

    path, _, _, llm = cross_encoder
    predicted = CrossEncoder(str(path), device="cpu").predict([(QUERY, d) for d in DOCUMENTS], batch_size=2)
    got = scores(llm.score(QUERY, DOCUMENTS, use_tqdm=False))
    torch.testing.assert_close(got, torch.tensor(predicted, dtype=torch.float32), atol=1e-5, rtol=0)


def test_a_sentence_transformers_identity_activation_gives_raw_logits(tmp_path):
    """``config.sentence_transformers.activation_fn`` decides the score's activation, as in ``CrossEncoder``."""
    import json

    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer

    hf = save_tiny_cross_encoder(tmp_path, "BertForSequenceClassification")
    config = json.loads((tmp_path / "config.json").read_text())
    config["sentence_transformers"] = {"activation_fn": "torch.nn.modules.linear.Identity"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    got = scores(LLM(str(tmp_path), dtype="float32").score(QUERY, DOCUMENTS, use_tqdm=False))
    expected = hf_logits(hf, tokenizer, [QUERY] * len(DOCUMENTS), DOCUMENTS)[:, 0]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    predicted = CrossEncoder(str(tmp_path), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    torch.testing.assert_close(got, torch.tensor(predicted, dtype=torch.float32), atol=1e-5, rtol=0)
    assert (expected < 0).any() or (expected > 1).any()  # a sigmoid could not give these


def test_classify_gives_softmax_probabilities_and_id2label_labels(classifier):
    _, hf, tokenizer, llm = classifier
    options = llm.engine.info.options
    assert options["num_labels"] == 3 and "score" not in options["supported_tasks"]
    outputs = llm.classify(DOCUMENTS, use_tqdm=False)
    logits = hf_logits(hf, tokenizer, DOCUMENTS)
    probs = torch.tensor([o.outputs.probs for o in outputs])
    torch.testing.assert_close(probs, logits.softmax(-1), atol=1e-5, rtol=0)
    assert all(o.outputs.num_classes == 3 for o in outputs)
    labels = [options["id2label"][str(int(p.argmax()))] for p in probs]
    assert labels == [LABELS[int(i)] for i in logits.argmax(-1)]
    assert len(set(labels)) > 1  # the texts are told apart
    raw = llm.classify(DOCUMENTS, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    torch.testing.assert_close(torch.tensor([o.outputs.probs for o in raw]), logits, atol=1e-5, rtol=0)
    alone = torch.tensor([llm.classify(d, use_tqdm=False)[0].outputs.probs for d in DOCUMENTS])
    torch.testing.assert_close(alone, probs, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="num_labels == 1"):
        llm.score(QUERY, DOCUMENTS, use_tqdm=False)


@pytest.mark.parametrize("form", ["Prompt", "dict"])
def test_classify_takes_a_token_pair_with_its_token_types(classifier, form):
    """A pair given as token ids with ``token_type_ids`` (a ``Prompt``, or vLLM's ``TokensPrompt``
    dict) classifies as the pair."""
    from llmp import Prompt

    _, hf, tokenizer, llm = classifier
    encoded = tokenizer(QUERY, DOCUMENTS[0])
    ids, types = encoded["input_ids"], encoded.get("token_type_ids")
    prompt = Prompt(token_ids=ids, token_type_ids=types) if form == "Prompt" else {"prompt_token_ids": ids}
    if form == "dict" and types is not None:
        prompt["token_type_ids"] = types
    [output] = llm.classify(prompt, use_tqdm=False)
    expected = hf_logits(hf, tokenizer, [QUERY], [DOCUMENTS[0]]).softmax(-1)[0]
    torch.testing.assert_close(torch.tensor(output.outputs.probs), expected, atol=1e-5, rtol=0)


def test_token_types_the_model_has_no_embeddings_for_are_refused(classifier):
    """A tokenizer that disagrees with its config (XLM-R's one type, a BERT tokenizer's type 1) is a
    ValueError for that request, never an index error that stops the engine."""
    import json

    from llmp import Prompt

    path, _, tokenizer, llm = classifier
    types = json.loads((path / "config.json").read_text())["type_vocab_size"]
    ids = tokenizer(QUERY)["input_ids"]
    with pytest.raises(ValueError, match="token type id .* is out of range"):
        llm.classify(Prompt(token_ids=ids, token_type_ids=[types] * len(ids)), use_tqdm=False)
    assert llm.classify(QUERY, use_tqdm=False)[0].outputs.probs  # the engine goes on


@pytest.mark.parametrize("architecture", ["BertModel", "XLMRobertaModel"])
def test_encoders_embed_as_transformers_and_score_by_cosine(tmp_path: Path, architecture: str):
    from transformers import AutoTokenizer

    hf = save_tiny_cross_encoder(tmp_path, architecture)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32")
    assert llm.engine.task == "embed"
    with torch.no_grad():
        expected = torch.stack([hf(**tokenizer(t, return_tensors="pt")).last_hidden_state[0, 0] for t in DOCUMENTS])
    got = torch.tensor([o.outputs.embedding for o in llm.embed(DOCUMENTS, use_tqdm=False)])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    cosine = torch.nn.functional.cosine_similarity(expected[:1], expected[1:])
    torch.testing.assert_close(
        scores(llm.score(DOCUMENTS[0], DOCUMENTS[1:], use_tqdm=False)), cosine, atol=1e-5, rtol=0
    )
    # positions past the padding id: the longest input XLM-R takes is max_position_embeddings - 2
    with pytest.raises(ValueError, match="at most 128"):
        llm.embed({"prompt_token_ids": [5] * 129}, use_tqdm=False)
