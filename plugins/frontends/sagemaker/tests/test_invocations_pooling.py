"""``POST /invocations`` with pooling bodies (vLLM's: rerank, score, classify, pooling), checked
against the OpenAI front-end's routes on the same server and the transformers cross-encoder; and
the 400 that says what the model does when it cannot serve a body."""

from __future__ import annotations

import base64
import struct
from typing import Any

import httpx
import pytest

QUERY = "what does paged attention keep"
DOCS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention keeps the KV cache in fixed-size blocks.",
    "Continuous batching serves many requests at once.",
    "blocks of the cache",
]
ATOL = 1e-5


def post(http: httpx.Client, path: str, body: dict, status: int = 200) -> dict:
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


@pytest.fixture(scope="module")
def ce(cross_encoder) -> Any:
    live, _, _ = cross_encoder
    with httpx.Client(base_url=live.url, timeout=120) as c:
        yield c


def scores_of(response: dict) -> list[float]:
    return [d["score"] for d in response["data"]]


def transformers_scores(cross_encoder, documents: list[str]) -> list[float]:
    import torch
    from transformers import AutoTokenizer

    _, path, model = cross_encoder
    tokenizer = AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        batch = [tokenizer(text=QUERY, text_pair=d, return_tensors="pt") for d in documents]
        return [float(model(**b).logits[0, 0].sigmoid()) for b in batch]


def test_query_and_documents_is_a_rerank(cross_encoder, ce):
    body = {"query": QUERY, "documents": DOCS, "top_n": 3}
    got = post(ce, "/invocations", body)
    want = post(ce, "/rerank", body)
    assert got["id"].startswith("rerank-") and got["model"] == want["model"]
    assert [r["index"] for r in got["results"]] == [r["index"] for r in want["results"]]
    assert [r["document"] for r in got["results"]] == [{"text": DOCS[r["index"]]} for r in want["results"]]
    expected = transformers_scores(cross_encoder, DOCS)
    assert [r["index"] for r in got["results"]] == sorted(range(len(DOCS)), key=lambda i: -expected[i])[:3]
    for result in got["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-4)
    assert (got["usage"], got["meta"]) == (want["usage"], want["meta"])
    # Cohere's object documents, return_documents, and the OpenAI fields (model, request_id)
    objects = {"query": QUERY, "documents": [{"text": d, "id": i} for i, d in enumerate(DOCS)], "model": want["model"]}
    bare = post(ce, "/invocations", {**objects, "return_documents": False, "request_id": "mine"})
    assert all(set(r) == {"index", "relevance_score"} for r in bare["results"]) and bare["id"] == "rerank-mine"
    assert post(ce, "/invocations", objects)["results"][0]["document"]["id"] == got["results"][0]["index"]


@pytest.mark.parametrize(("first", "second"), [("text_1", "text_2"), ("queries", "documents"), ("data_1", "data_2")])
def test_text_pairs_are_a_score(ce, first, second):
    body = {first: QUERY, second: DOCS}
    got = post(ce, "/invocations", body)
    want = post(ce, "/score", body)
    assert got["object"] == "list" and got["id"].startswith("score-")
    assert [(d["index"], d["object"]) for d in got["data"]] == [(i, "score") for i in range(len(DOCS))]
    assert scores_of(got) == pytest.approx(scores_of(want), abs=ATOL)
    assert got["usage"] == want["usage"] and got["usage"]["prompt_tokens"] > 0
    raw = post(ce, "/invocations", {**body, "use_activation": False})
    assert scores_of(raw) == pytest.approx(scores_of(post(ce, "/score", {**body, "use_activation": False})), abs=ATOL)
    assert scores_of(raw) != pytest.approx(scores_of(got), abs=ATOL)  # logits, not sigmoids


def test_input_on_a_classifier_is_a_classification(ce):
    for body in (
        {"input": ["The quick brown fox", "dog"]},
        {"input": "dog", "truncate_prompt_tokens": 2},
        {"messages": [{"role": "user", "content": "The quick brown fox"}]},  # rendered by the chat template
    ):
        got = post(ce, "/invocations", body)
        want = post(ce, "/classify", body)
        assert got["id"].startswith("classify-") and got["usage"] == want["usage"], body
        assert [(d["index"], d["num_classes"]) for d in got["data"]] == [(d["index"], 1) for d in want["data"]]
        for mine, theirs in zip(got["data"], want["data"], strict=True):
            assert mine["probs"] == pytest.approx(theirs["probs"], abs=ATOL), body


def floats(response: dict) -> list[float]:
    """Every value of a /pooling response's data, decoded when base64 (little-endian float32)."""
    out: list[float] = []
    for item in response["data"]:
        if isinstance(item["data"], str):
            raw = base64.b64decode(item["data"])
            out += struct.unpack(f"<{len(raw) // 4}f", raw)
        else:
            out += item["data"]
    return out


def test_task_is_pooling(ce):
    for body in (
        {"input": ["dog", "fox"], "task": "classify"},
        {"input": "dog", "task": "classify", "use_activation": False},
        {"input": "dog", "task": "classify", "encoding_format": "base64"},
    ):
        got = post(ce, "/invocations", body)
        want = post(ce, "/pooling", body)
        assert got["id"].startswith("pool-") and [d["object"] for d in got["data"]] == ["pooling"] * len(want["data"])
        assert floats(got) == pytest.approx(floats(want), abs=ATOL), body
        assert isinstance(got["data"][0]["data"], str) == (body.get("encoding_format") == "base64")
    error = post(ce, "/invocations", {"input": "dog", "task": "token_embed"}, 400)["error"]
    assert error["param"] == "task" and "token_classify" in error["message"]


def test_pooling_errors_are_the_routes(ce):
    too_many = {"query": QUERY, "documents": ["a"] * 50}  # the server takes at most 4 (conftest)
    for body, param in (
        (too_many, "documents"),
        ({"query": "", "documents": ["a"]}, "query"),
        ({"query": QUERY}, "documents"),  # no documents: not a rerank body
        ({"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2"),
        ({"input": []}, "input"),
        ({"input": "dog", "truncate_prompt_tokens": 10_000}, "truncate_prompt_tokens"),
    ):
        error = post(ce, "/invocations", body, 400)["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param, (body, error)
    assert post(ce, "/invocations", too_many, 400) == post(ce, "/rerank", too_many, 400)
    assert (
        post(ce, "/invocations", {"query": QUERY, "documents": DOCS, "model": "nope"}, 404)["error"]["param"] == "model"
    )


def test_a_pooling_model_refuses_generation_saying_what_it_does(ce):
    for body in ({"prompt": "The quick brown fox", "max_tokens": 4}, {"foo": 1}):
        error = post(ce, "/invocations", body, 400)["error"]
        assert error["type"] == "invalid_request_error"
        message = error["message"]
        assert "input or messages (classification)" in message and "query and documents (rerank)" in message
        assert "text_1 and text_2 (score)" in message and "task with input (pooling)" in message
    message = post(ce, "/invocations", {"prompt": "x"}, 400)["error"]["message"]
    assert message.startswith("this server's model classifies and scores: send ") and message.endswith(
        "; it does not generate"
    )
    assert post(ce, "/invocations", {"foo": 1}, 400)["error"]["message"].startswith("cannot tell the request type")


def test_a_model_that_generates_and_scores_takes_both(llm_reranker):
    with httpx.Client(base_url=llm_reranker.url, timeout=120) as c:
        chat = post(c, "/invocations", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] == 3
        completion = post(c, "/invocations", {"prompt": "Paged attention", "max_tokens": 3})
        assert completion["object"] == "text_completion"
        body = {"query": QUERY, "documents": DOCS}
        got, want = post(c, "/invocations", body), post(c, "/rerank", body)
        assert [r["index"] for r in got["results"]] == [r["index"] for r in want["results"]]
        assert [r["relevance_score"] for r in got["results"]] == pytest.approx(
            [r["relevance_score"] for r in want["results"]], abs=ATOL
        )
        classified = post(c, "/invocations", {"input": "Paged attention"})
        assert classified["id"].startswith("classify-") and classified["data"][0]["num_classes"] == 1
        assert classified["data"][0]["probs"] == pytest.approx(
            post(c, "/classify", {"input": "Paged attention"})["data"][0]["probs"], abs=ATOL
        )
        assert post(c, "/invocations", {"text_1": QUERY, "text_2": DOCS[1]})["data"][0]["score"] == pytest.approx(
            want["results"][[r["index"] for r in want["results"]].index(1)]["relevance_score"], abs=ATOL
        )
        message = post(c, "/invocations", {"foo": 1}, 400)["error"]["message"]
        assert message == (
            "cannot tell the request type: give messages (chat completion), prompt (completion), "
            "input (classification), query and documents (rerank), text_1 and text_2 (score) "
            "or task with input (pooling)"
        )


def test_a_model_that_only_generates_refuses_pooling_bodies(http):
    for body, does_not in (
        ({"query": QUERY, "documents": DOCS}, "score"),
        ({"text_1": QUERY, "text_2": DOCS}, "score"),
        ({"queries": QUERY, "documents": DOCS}, "score"),
        ({"input": "x"}, "embed or classify"),
        ({"input": "x", "task": "classify"}, "give pooled outputs"),
    ):
        error = post(http, "/invocations", body, 400)["error"]
        assert error["message"] == (
            "this server's model generates: send messages (chat completion) or prompt (completion); "
            f"it does not {does_not}"
        ), body
        assert error["type"] == "invalid_request_error" and error["param"] is None
