"""Live ``llmp serve`` processes for the Anthropic front-end tests (each costs seconds to start).

* ``server``: a tiny random Llama with both the Anthropic and the OpenAI front-ends mounted,
  so the same greedy conversation can be compared across the two.
* ``strict_server``: the same model behind ``--api-key`` with room for one request at a time
  (``--max-num-seqs 1 --max-queue-len 0``): authentication and overload; it reports the prefix
  cache's reads (``--enable-prompt-tokens-details``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for anthropic_frontend_support (tests import it too)

from anthropic_frontend_support import API_KEY

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
    yield from _serve(model_dir, "--frontend", "anthropic", "--frontend", "openai")


@pytest.fixture(scope="module")
def strict_server(model_dir: Path) -> Iterator[LiveServer]:
    yield from _serve(
        model_dir,
        "--frontend",
        "anthropic",
        "--api-key",
        API_KEY,
        "--max-num-seqs",
        "1",
        "--max-queue-len",
        "0",
        "--enable-prompt-tokens-details",
    )


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60) as sdk:
        yield sdk


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c
