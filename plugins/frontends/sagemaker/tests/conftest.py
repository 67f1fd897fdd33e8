"""Live ``llmp serve`` processes for the SageMaker front-end tests.

* ``server``: a tiny random Llama with the SageMaker and OpenAI front-ends, so ``/invocations``
  can be checked against ``/v1/chat/completions`` and ``/v1/completions``.
* ``cross_encoder``: a tiny random BERT cross-encoder (one label: classify, score, pooling): the
  server, the model directory and the transformers model, for the pooling bodies; it needs the bert
  model plugin, absent from this
  plugin's isolation venv (there it skips, and the main run takes it).
* ``llm_reranker``: the tiny Llama that also scores through the logits of two of its tokens
  (``classifier_from_token``, vLLM's LLM-reranker recipe): generation and pooling on one server.

Embeddings need a real embedding model from another distribution: that test is in
``tests_repo_level/`` (moved to the repository's ``tests/serve``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmp.testing import LiveServer, save_tiny_llama, serving


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path)
    return path


def _serve(model: Path, *args: str) -> Iterator[LiveServer]:
    with serving(model, "--dtype", "float32", *args) as live:
        yield live
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[LiveServer]:
    yield from _serve(model_dir, "--frontend", "sagemaker", "--frontend", "openai")


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


# the pooling servers' chat template: classify takes a chat as messages
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
MAX_SCORE_PAIRS = 4
RERANK_OVERRIDES = {"classifier_from_token": ["a", "b"], "method": "from_2_way_softmax"}  # [no, yes] tokens


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Path, Any]]:
    pytest.importorskip("llmp_models_bert", reason="the bert model plugin is not installed")
    from llmp.testing import save_tiny_cross_encoder

    path = tmp_path_factory.mktemp("cross-encoder")
    model = save_tiny_cross_encoder(path, "BertForSequenceClassification", num_labels=1)
    args = ("--max-score-pairs", str(MAX_SCORE_PAIRS), "--chat-template", CHAT_TEMPLATE)
    for live in _serve(path, "--frontend", "sagemaker", "--frontend", "openai", *args):
        yield live, path, model


@pytest.fixture(scope="module")
def llm_reranker(model_dir: Path) -> Iterator[LiveServer]:
    args = ("--hf-overrides", json.dumps(RERANK_OVERRIDES), "--max-model-len", "256")
    yield from _serve(model_dir, "--frontend", "sagemaker", "--frontend", "openai", *args)
