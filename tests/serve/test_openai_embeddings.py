"""``/v1/embeddings`` with the real all-MiniLM-L6-v2, against the sentence-transformers recipe."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator

import httpx
import openai
import pytest
import torch

from llmp.testing import assert_openai_error as assert_error
from llmp.testing import minilm_dir, sentence_transformers_reference

MINILM = minilm_dir()

TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market crashed today."]
MODEL = str(MINILM)


@pytest.fixture(scope="module")
def embed_http(embed_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=embed_server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def reference() -> torch.Tensor:
    """What sentence-transformers computes (modules.json: Transformer, mean Pooling, Normalize)."""
    modules = json.loads((MINILM / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    assert json.loads((MINILM / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"]
    return sentence_transformers_reference(MINILM, TEXTS)


def embed(http: httpx.Client, inputs, **fields) -> dict:
    response = http.post("/v1/embeddings", json={"model": MODEL, "input": inputs, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def decode(b64: str) -> torch.Tensor:
    raw = base64.b64decode(b64)
    return torch.tensor(struct.unpack(f"<{len(raw) // 4}f", raw))


def test_vectors_equal_the_reference(embed_http, reference):
    body = embed(embed_http, TEXTS)
    assert body["object"] == "list" and body["model"] == MODEL
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(d["object"] == "embedding" for d in body["data"])
    got = torch.tensor([d["embedding"] for d in body["data"]])
    assert got.shape == (3, 384)
    cosine = torch.nn.functional.cosine_similarity(got, reference, dim=-1)
    assert torch.all(cosine > 1 - 1e-4), cosine
    assert torch.allclose(got.norm(dim=-1), torch.ones(3), atol=1e-4)


def test_base64_equals_float(embed_http):
    floats = embed(embed_http, TEXTS[0])["data"][0]["embedding"]
    encoded = embed(embed_http, TEXTS[0], encoding_format="base64")["data"][0]["embedding"]
    assert isinstance(encoded, str)
    assert torch.allclose(decode(encoded), torch.tensor(floats), atol=1e-6)


def test_sdk(embed_server, reference):
    with openai.OpenAI(base_url=embed_server.api_url, api_key="x", max_retries=0) as sdk:
        default = sdk.embeddings.create(model=MODEL, input=TEXTS)  # the SDK asks for base64 and decodes it
        floats = sdk.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    for response in (default, floats):
        got = torch.tensor([d.embedding for d in response.data])
        assert torch.all(torch.nn.functional.cosine_similarity(got, reference, dim=-1) > 1 - 1e-4)


def test_batch_keeps_order(embed_http):
    order = [2, 0, 1, 0]
    batch = embed(embed_http, [TEXTS[i] for i in order])["data"]
    alone = {i: torch.tensor(embed(embed_http, TEXTS[i])["data"][0]["embedding"]) for i in set(order)}
    assert [d["index"] for d in batch] == [0, 1, 2, 3]
    for position, i in enumerate(order):
        assert torch.allclose(torch.tensor(batch[position]["embedding"]), alone[i], atol=1e-5), position


def test_usage_counts_tokens(embed_http):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MINILM)
    usage = embed(embed_http, TEXTS)["usage"]
    expected = sum(len(tokenizer(t)["input_ids"]) for t in TEXTS)  # with [CLS] and [SEP]
    assert usage == {"prompt_tokens": expected, "total_tokens": expected}


def test_token_id_input(embed_http):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(MINILM)(TEXTS[0])["input_ids"]
    by_ids = torch.tensor(embed(embed_http, ids)["data"][0]["embedding"])
    by_text = torch.tensor(embed(embed_http, TEXTS[0])["data"][0]["embedding"])
    assert torch.allclose(by_ids, by_text, atol=1e-6)


def test_dimensions_need_a_matryoshka_model(embed_http):
    # all-MiniLM-L6-v2 was not trained to be cut: vLLM's 400, not a silently worse vector
    # (the cut itself: tests/engine/test_pooling_engine.py and the OpenAI plugin's pooling tests)
    for dimensions in (64, 384):
        response = embed_http.post("/v1/embeddings", json={"input": "x", "dimensions": dimensions})
        assert_error(response, 400, param="dimensions", contains="does not support Matryoshka")
    assert_error(embed_http.post("/v1/embeddings", json={"input": "x", "dimensions": 0}), 400, param="dimensions")
    # refused before the engine: a value past int64 once failed to serialise, with no param
    huge = embed_http.post("/v1/embeddings", json={"input": "x", "dimensions": 2**70})
    assert_error(huge, 400, param="dimensions", contains="Matryoshka")


def test_normalize_false(embed_http):
    raw = torch.tensor(embed(embed_http, TEXTS[0], normalize=False)["data"][0]["embedding"])
    unit = torch.tensor(embed(embed_http, TEXTS[0])["data"][0]["embedding"])
    assert raw.norm() > 1.5
    assert torch.allclose(torch.nn.functional.normalize(raw, dim=0), unit, atol=1e-5)


def test_long_input(embed_http):
    long = "hello " * 600
    # sentence-transformers truncates at max_seq_length (256 in sentence_bert_config.json): the context here too
    assert_error(embed_http.post("/v1/embeddings", json={"input": long}), 400, param="input", contains="256")
    assert embed(embed_http, long, truncate_prompt_tokens=100)["usage"]["prompt_tokens"] == 100


def test_truncate_prompt_tokens_cuts_the_text_and_keeps_cls_and_sep(embed_http):
    """As vLLM truncates text (its tokenizer, truncation side left): [CLS] <the text's last ids> [SEP]."""
    from transformers import AutoModel, AutoTokenizer

    text = " ".join(TEXTS)
    got = torch.tensor(embed(embed_http, text, truncate_prompt_tokens=8)["data"][0]["embedding"])
    tokenizer = AutoTokenizer.from_pretrained(MINILM)
    tokenizer.truncation_side = "left"  # vLLM loads its tokenizers so
    batch = tokenizer([text], truncation=True, max_length=8, return_tensors="pt")
    assert batch["input_ids"][0, 0] == tokenizer.cls_token_id and batch["input_ids"][0, -1] == tokenizer.sep_token_id
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(MINILM).eval()(**batch).last_hidden_state
    expected = torch.nn.functional.normalize(hidden.mean(1), dim=-1)[0]
    assert torch.allclose(got, expected, atol=1e-4)
    ids = embed_http.post("/tokenize", json={"prompt": text}).json()["tokens"]
    as_ids = torch.tensor(embed(embed_http, ids, truncate_prompt_tokens=8)["data"][0]["embedding"])
    assert not torch.allclose(as_ids, expected, atol=1e-3)  # ids given as ids are cut as they are (vLLM's)


def test_bad_inputs(embed_http):
    assert_error(embed_http.post("/v1/embeddings", json={"input": []}), 400, param="input")
    assert_error(embed_http.post("/v1/embeddings", json={"input": [""]}), 400)
    assert_error(embed_http.post("/v1/embeddings", json={"input": [1, 10**9]}), 400, param="input")
    assert_error(embed_http.post("/v1/embeddings", json={"input": "x", "model": "nope"}), 404, param="model")
    assert_error(embed_http.post("/v1/embeddings", json={"input": "x", "encoding_format": "int8"}), 400)
    assert embed(embed_http, "still serving")["data"]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_generation_routes_are_absent(embed_http, route):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    assert_error(embed_http.post(route, json=body), 404)


def test_models_and_tokenize(embed_http):
    models = embed_http.get("/v1/models").json()["data"]
    assert [m["id"] for m in models] == [MODEL] and models[0]["root"] == MODEL
    assert embed_http.post("/tokenize", json={"prompt": "hello"}).json()["count"] == 3  # [CLS] hello [SEP]


def test_causal_lm_served_as_embedding_model_with_task_embed(tmp_path):
    # `llmp serve DIR --task embed` on a native decoder: last-token, normalised hidden states
    import torch.nn.functional as F

    from llmp.testing import save_tiny_model, serving

    model = save_tiny_model(tmp_path, "Qwen3ForCausalLM", seed=3, head_dim=16)
    prompts = [[5, 17, 42, 99], [7, 8, 9, 10, 11, 12, 13]]
    with torch.no_grad():
        expected = [F.normalize(model.model(torch.tensor([p])).last_hidden_state[0, -1], dim=-1) for p in prompts]
    with (
        serving(tmp_path, "--task", "embed", "--dtype", "float32") as server,
        httpx.Client(base_url=server.url, timeout=60) as http,
    ):
        body = http.post("/v1/embeddings", json={"model": str(tmp_path), "input": prompts}).json()
        assert [d["index"] for d in body["data"]] == [0, 1]
        for item, ref in zip(body["data"], expected, strict=True):
            assert F.cosine_similarity(torch.tensor(item["embedding"]), ref, dim=0) > 0.9999
        assert body["usage"]["prompt_tokens"] == sum(map(len, prompts))
        refused = http.post("/v1/completions", json={"model": str(tmp_path), "prompt": "hi", "max_tokens": 2})
        assert_error(refused, 404)  # an embedding server mounts no generation routes
