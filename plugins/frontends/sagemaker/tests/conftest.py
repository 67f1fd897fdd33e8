"""Live ``llmp serve`` processes for the SageMaker front-end tests.

* ``server``: a tiny random Llama with the SageMaker and OpenAI front-ends, so ``/invocations``
  can be checked against ``/v1/chat/completions`` and ``/v1/completions``.
* ``auth_server``: the same behind ``--api-key``.

Embeddings need a real embedding model from another distribution: that test is in
``tests_repo_level/`` (moved to the repository's ``tests/serve``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmp.testing import LiveServer, save_tiny_llama, serving

API_KEY = "Secret-Key-42"


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
def auth_server(model_dir: Path) -> Iterator[LiveServer]:
    yield from _serve(model_dir, "--frontend", "sagemaker", "--api-key", API_KEY)


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c
