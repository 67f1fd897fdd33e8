"""The pooling calls of the offline API (``LLM.score``, ``classify``, ``encode``, ``reward``, ``embed``)
on tiny random checkpoints, against transformers, and vLLM's refusals when a model cannot."""

from __future__ import annotations

import pytest
import torch

from llmp import LLM, ClassificationOutput, PoolingOutput, PoolingParams, ScoringOutput
from llmp.testing import minilm_dir, save_tiny_cross_encoder, save_tiny_llama, save_tiny_model

QUERY = "what does the quick brown fox do"
DOCS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention keeps the KV cache in fixed-size blocks.",
    "def add(a, b): return a + b",
]
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def hf_pair_logits(model, tokenizer, pairs, **tokenize) -> torch.Tensor:
    """transformers' logits of each (query, document) pair, one pair at a time (no padding)."""
    rows = []
    with torch.no_grad():
        for query, document in pairs:
            rows.append(model(**tokenizer(query, document, return_tensors="pt", **tokenize)).logits[0])
    return torch.stack(rows)


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    """A one-label BERT cross-encoder (token types matter: two random segment embeddings)."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("cross-encoder")
    model = save_tiny_cross_encoder(path)
    llm = LLM(str(path), dtype="float32")
    yield llm, model, AutoTokenizer.from_pretrained(path)
    llm.shutdown()


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A three-label BERT sequence classifier with id2label."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("classifier")
    model = save_tiny_cross_encoder(path, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    llm = LLM(str(path), dtype="float32")
    yield llm, model, AutoTokenizer.from_pretrained(path)
    llm.shutdown()


@pytest.fixture(scope="module")
def minilm():
    llm = LLM(str(minilm_dir()), dtype="float32")
    yield llm
    llm.shutdown()


def scores(outputs) -> torch.Tensor:
    assert all(isinstance(o.outputs, ScoringOutput) and o.finished for o in outputs)
    return torch.tensor([o.outputs.score for o in outputs])


# -- score: cross-encoders ------------------------------------------------------------------------


def test_score_one_to_one_one_to_many_and_many_to_many_equal_transformers(cross_encoder):
    llm, model, tokenizer = cross_encoder
    assert llm.engine.info.options["score_mode"] == "cross-encoder"
    expected = torch.sigmoid(hf_pair_logits(model, tokenizer, [(QUERY, d) for d in DOCS])[:, 0])
    assert expected.max() - expected.min() > 1e-2  # the pairs score apart: a swapped order would show

    one = llm.score(QUERY, DOCS[1], use_tqdm=False)
    assert len(one) == 1
    torch.testing.assert_close(scores(one), expected[1:2], atol=1e-5, rtol=0)
    assert one[0].prompt_token_ids == tokenizer(QUERY, DOCS[1])["input_ids"]

    torch.testing.assert_close(scores(llm.score(QUERY, DOCS, use_tqdm=False)), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(scores(llm.score([QUERY], DOCS, use_tqdm=False)), expected, atol=1e-5, rtol=0)

    queries = [DOCS[2], QUERY, DOCS[0]]
    many = llm.score(queries, DOCS, use_tqdm=False)
    reference = torch.sigmoid(hf_pair_logits(model, tokenizer, list(zip(queries, DOCS, strict=True)))[:, 0])
    torch.testing.assert_close(scores(many), reference, atol=1e-5, rtol=0)
    assert len({o.request_id for o in many}) == 3


def test_score_raw_logits_and_truncation(cross_encoder):
    llm, model, tokenizer = cross_encoder
    raw = llm.score(QUERY, DOCS, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    logits = hf_pair_logits(model, tokenizer, [(QUERY, d) for d in DOCS])[:, 0]
    torch.testing.assert_close(scores(raw), logits, atol=1e-5, rtol=0)

    long_doc = " ".join(DOCS * 6)
    cut = llm.score(QUERY, [long_doc, DOCS[0]], truncate_prompt_tokens=40, use_tqdm=False)
    pairs = [(QUERY, long_doc), (QUERY, DOCS[0])]
    expected = torch.sigmoid(hf_pair_logits(model, tokenizer, pairs, truncation=True, max_length=40)[:, 0])
    torch.testing.assert_close(scores(cut), expected, atol=1e-5, rtol=0)
    assert len(cut[0].prompt_token_ids) == 40
    # the same limit through the pooling params
    again = llm.score(QUERY, long_doc, pooling_params=PoolingParams(truncate_prompt_tokens=40), use_tqdm=False)
    torch.testing.assert_close(scores(again), expected[:1], atol=1e-5, rtol=0)


def test_an_over_long_pair_is_refused_before_any_request_is_queued(cross_encoder):
    llm, _, tokenizer = cross_encoder
    long_doc = " ".join(DOCS * 6)
    length = len(tokenizer(QUERY, long_doc)["input_ids"])
    assert length > 128
    with pytest.raises(ValueError, match=rf"the pair at index 1 is {length} tokens long; this model takes at most 128"):
        llm.score(QUERY, [DOCS[0], long_doc], use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(ValueError, match=r"truncate_prompt_tokens \(500\) must be <= max_model_len \(128\)"):
        llm.score(QUERY, DOCS, truncate_prompt_tokens=500, use_tqdm=False)
    with pytest.raises(ValueError, match="truncate_prompt_tokens must be -1 or an integer >= 1"):
        llm.score(QUERY, DOCS, truncate_prompt_tokens=0, use_tqdm=False)
    assert len(llm.score(QUERY, long_doc, truncate_prompt_tokens=-1, use_tqdm=False)[0].prompt_token_ids) == 128


@pytest.mark.parametrize(
    ("data_1", "data_2", "message"),
    [
        (QUERY, [], "At least one text_pair element must be given"),
        ([], DOCS, "At least one text element must be given"),
        ([QUERY, QUERY], DOCS, r"Input lengths must be either 1:1, 1:N or N:N"),
        ("", DOCS, "must not hold an empty string"),
        (QUERY, [DOCS[0], ""], "must not hold an empty string"),
        # a mapping (content parts, prompt ids) was once scored as its key names
        ({"content": [{"type": "text", "text": QUERY}]}, DOCS, "not a mapping"),
        (QUERY, {"prompt_token_ids": [101, 102]}, "not a mapping"),
    ],
)
def test_score_input_is_checked(cross_encoder, data_1, data_2, message):
    llm = cross_encoder[0]
    with pytest.raises(ValueError, match=message):
        llm.score(data_1, data_2, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_score_refuses_what_does_not_apply(cross_encoder):
    llm = cross_encoder[0]
    with pytest.raises(ValueError, match="chat_template applies only to LLM rerankers"):
        llm.score(QUERY, DOCS, chat_template="{{ messages[0]['content'] }}", use_tqdm=False)
    with pytest.raises(ValueError, match="You cannot overwrite"):
        llm.score(QUERY, DOCS, pooling_params=PoolingParams(task="embed"), use_tqdm=False)
    with pytest.raises(ValueError, match="add_special_tokens"):
        llm.score(QUERY, DOCS, tokenization_kwargs={"add_special_tokens": False}, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    # vLLM 0.32 names a cross-encoder's scoring task classify; tokenization_kwargs cut as truncate_prompt_tokens
    plain = scores(llm.score(QUERY, DOCS, truncate_prompt_tokens=12, use_tqdm=False))
    as_vllm = llm.score(
        QUERY,
        DOCS,
        pooling_params=PoolingParams(task="classify"),
        tokenization_kwargs={"truncation": True, "max_length": 12},
        use_tqdm=False,
    )
    torch.testing.assert_close(scores(as_vllm), plain)


# -- classify and encode ---------------------------------------------------------------------------


def test_classify_probabilities_and_labels_equal_transformers(classifier):
    llm, model, tokenizer = classifier
    with torch.no_grad():
        logits = model(**tokenizer(DOCS, padding=True, return_tensors="pt")).logits
    outputs = llm.classify(DOCS, use_tqdm=False)
    assert all(isinstance(o.outputs, ClassificationOutput) for o in outputs)
    probs = torch.tensor([o.outputs.probs for o in outputs])
    torch.testing.assert_close(probs, logits.softmax(-1), atol=1e-5, rtol=0)
    assert [o.outputs.num_classes for o in outputs] == [3, 3, 3]
    id2label = llm.engine.info.options["id2label"]
    assert {int(k): v for k, v in id2label.items()} == LABELS
    assert [id2label[str(int(p.argmax()))] for p in probs] == [LABELS[int(i)] for i in logits.argmax(-1)]

    raw = llm.classify(DOCS, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    torch.testing.assert_close(torch.tensor([o.outputs.probs for o in raw]), logits, atol=1e-5, rtol=0)
    alone = llm.classify(DOCS[2], use_tqdm=False)  # batched and alone agree
    torch.testing.assert_close(torch.tensor(alone[0].outputs.probs), probs[2], atol=1e-6, rtol=0)


def test_encode_returns_the_raw_pooled_data_of_the_task(classifier):
    llm, model, tokenizer = classifier
    probs = torch.tensor([o.outputs.probs for o in llm.classify(DOCS, use_tqdm=False)])
    for task in ("classify", None):  # None: the model's primary pooling task
        outputs = llm.encode(DOCS, pooling_task=task, use_tqdm=False)
        assert all(isinstance(o.outputs, PoolingOutput) for o in outputs)
        torch.testing.assert_close(torch.stack([o.outputs.data for o in outputs]), probs, atol=1e-6, rtol=0)
    params = PoolingParams(use_activation=False)
    raw = llm.encode(DOCS, [params] * 3, pooling_task="classify", use_tqdm=False)
    assert params.task is None  # the caller's params are not changed
    with torch.no_grad():
        logits = model(**tokenizer(DOCS, padding=True, return_tensors="pt")).logits
    torch.testing.assert_close(torch.stack([o.outputs.data for o in raw]), logits, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="You cannot overwrite"):
        llm.encode(DOCS, PoolingParams(task="embed"), pooling_task="classify", use_tqdm=False)
    with pytest.raises(ValueError, match="got 2 pooling params for 3 prompts"):
        llm.encode(DOCS, [params, params], pooling_task="classify", use_tqdm=False)


def test_score_on_a_multi_label_classifier_is_refused(classifier):
    llm = classifier[0]
    with pytest.raises(ValueError, match=r"^Scoring API is only enabled for num_labels == 1\.$"):
        llm.score(QUERY, DOCS, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


# -- embedding models: bi-encoder score, embed, token_embed -------------------------------------------


def test_bi_encoder_score_is_the_cosine_of_the_transformers_embeddings(minilm):
    from transformers import AutoModel, AutoTokenizer

    assert minilm.engine.info.options["score_mode"] == "bi-encoder"
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    model = AutoModel.from_pretrained(minilm_dir()).eval()

    def embedding(text: str) -> torch.Tensor:
        batch = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            return model(**batch).last_hidden_state[0].mean(0)

    expected = torch.stack([torch.cosine_similarity(embedding(QUERY), embedding(d), dim=0) for d in DOCS])
    outputs = minilm.score(QUERY, DOCS, use_tqdm=False)
    torch.testing.assert_close(scores(outputs), expected, atol=1e-5, rtol=0)
    query_ids = tokenizer(QUERY)["input_ids"]
    pad = tokenizer.pad_token_id
    assert outputs[1].prompt_token_ids == query_ids + [pad] + tokenizer(DOCS[1])["input_ids"]  # vLLM's usage count
    many = minilm.score(DOCS, [QUERY, QUERY, DOCS[2]], use_tqdm=False)  # each text embedded once
    torch.testing.assert_close(scores(many)[:2], expected[:2], atol=1e-5, rtol=0)
    assert abs(many[2].outputs.score - 1.0) < 1e-5


def test_embed_and_encode_on_an_embedding_model(minilm):
    from transformers import AutoModel, AutoTokenizer

    embedded = minilm.embed(DOCS, use_tqdm=False)
    vectors = torch.tensor([o.outputs.embedding for o in embedded])
    raw = minilm.encode(DOCS, pooling_task="embed", use_tqdm=False)
    assert all(isinstance(o.outputs, PoolingOutput) for o in raw)
    torch.testing.assert_close(torch.stack([o.outputs.data for o in raw]), vectors, atol=1e-6, rtol=0)

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(minilm_dir()).eval()(**tokenizer(DOCS[0], return_tensors="pt"))
    rows = minilm.encode(DOCS[0], pooling_task="token_embed", use_tqdm=False)[0].outputs.data
    expected = torch.nn.functional.normalize(hidden.last_hidden_state[0], dim=-1)
    torch.testing.assert_close(rows, expected, atol=1e-5, rtol=0)


def test_vllm_tokenization_kwargs_cut_and_leave_out_special_tokens(minilm):
    from transformers import AutoTokenizer

    def vectors(outputs) -> torch.Tensor:
        return torch.tensor([o.outputs.embedding for o in outputs])

    cut = vectors(minilm.embed(DOCS, truncate_prompt_tokens=4, use_tqdm=False))
    for kwargs in ({"truncate_prompt_tokens": 4}, {"truncation": True, "max_length": 4, "truncation_side": "left"}):
        got = vectors(minilm.embed(DOCS, tokenization_kwargs=kwargs, use_tqdm=False))
        torch.testing.assert_close(got, cut)
    bare = AutoTokenizer.from_pretrained(minilm_dir())(DOCS[0], add_special_tokens=False)["input_ids"]
    [without] = minilm.embed(DOCS[0], tokenization_kwargs={"add_special_tokens": False}, use_tqdm=False)
    assert without.prompt_token_ids == bare
    [by_ids] = minilm.embed({"prompt_token_ids": bare}, use_tqdm=False)
    assert without.outputs.embedding == by_ids.outputs.embedding
    for kwargs, message in (
        ({"padding": "max_length"}, "padding: not taken"),
        ({"truncation_side": "right"}, "truncation_side must be 'left'"),
        ({"max_length": 4}, "max_length applies with truncation=True"),
    ):
        with pytest.raises(ValueError, match=message):
            minilm.embed(DOCS, tokenization_kwargs=kwargs, use_tqdm=False)
    assert not minilm.engine.has_unfinished_requests()


def test_an_embedding_model_refuses_classification(minilm):
    message = (
        r"^Classification API is not supported by this model\. Try converting the model using `--convert classify`\.$"
    )
    with pytest.raises(ValueError, match=message):
        minilm.classify(DOCS, use_tqdm=False)
    with pytest.raises(ValueError, match=message):
        minilm.reward(DOCS, use_tqdm=False)
    with pytest.raises(ValueError, match=message):
        minilm.encode(DOCS, pooling_task="token_classify", use_tqdm=False)
    assert not minilm.engine.has_unfinished_requests()


# -- decoders: a reward model, an LLM reranker, a generator ------------------------------------------


def test_reward_and_classify_on_a_decoder_classifier(tmp_path):
    model = save_tiny_model(tmp_path, "LlamaForSequenceClassification", num_labels=2, pad_token_id=2)
    prompts = [[5, 17, 99, 4, 250], [300, 7, 8, 9, 10, 11, 12]]
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=64)
    try:
        rewards = llm.reward([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
        raw = llm.reward(
            [{"prompt_token_ids": p} for p in prompts],
            pooling_params=PoolingParams(use_activation=False),
            use_tqdm=False,
        )
        classified = llm.classify([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    finally:
        llm.shutdown()
    for prompt, reward, logits, label in zip(prompts, rewards, raw, classified, strict=True):
        with torch.no_grad():
            rows = model.score(model.model(torch.tensor([prompt])).last_hidden_state)[0]
        assert isinstance(reward.outputs, PoolingOutput)
        assert reward.outputs.data.shape == (len(prompt), 2)
        torch.testing.assert_close(logits.outputs.data, rows, atol=1e-5, rtol=0)
        torch.testing.assert_close(reward.outputs.data, rows.softmax(-1), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(label.outputs.probs), rows[-1].softmax(-1), atol=1e-5, rtol=0)


RERANK_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
    "{% if add_generation_prompt %}never rendered for scores{% endif %}"
)


def test_an_llm_reranker_scores_through_a_chat_template(tmp_path):
    """A causal LM whose yes/no logits are the score (vLLM's Qwen3-Reranker recipe, the model kept
    generative): ``chat_template`` renders each pair as the messages ``query`` and ``document``."""
    from transformers import AutoTokenizer

    model = save_tiny_model(tmp_path, "Qwen3ForCausalLM", head_dim=16)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    no, yes = tokenizer.convert_tokens_to_ids(["a", "b"])
    overrides = {"classifier_from_token": ["a", "b"], "is_original_qwen3_reranker": True}
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=256, hf_overrides=overrides)
    try:
        plain = llm.score(QUERY, DOCS, use_tqdm=False)
        templated = llm.score(QUERY, DOCS, chat_template=RERANK_TEMPLATE, use_tqdm=False)
    finally:
        llm.shutdown()

    def reference(text: str) -> float:
        with torch.no_grad():
            logits = model(torch.tensor([tokenizer.encode(text)])).logits[0, -1]
        return float(torch.sigmoid(logits[yes] - logits[no]))

    torch.testing.assert_close(scores(plain), torch.tensor([reference(QUERY + d) for d in DOCS]), atol=1e-4, rtol=0)
    rendered = [f"<|query|>{QUERY}\n<|document|>{d}\n<|assistant|>" for d in DOCS]
    torch.testing.assert_close(scores(templated), torch.tensor([reference(t) for t in rendered]), atol=1e-4, rtol=0)
    assert templated[0].prompt_token_ids == tokenizer.encode(rendered[0])


def test_a_generative_model_refuses_score_and_classify(tmp_path):
    save_tiny_llama(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=64)
    try:
        score = (
            r"^Score API is not supported by this model\. "
            r"Try converting the model using `--convert embed` or `--convert classify`\.$"
        )
        with pytest.raises(ValueError, match=score):
            llm.score("a", "b", use_tqdm=False)
        with pytest.raises(ValueError, match=r"^Classification API is not supported by this model\."):
            llm.classify("a", use_tqdm=False)
        assert not llm.engine.has_unfinished_requests()
    finally:
        llm.shutdown()
