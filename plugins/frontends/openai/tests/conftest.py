"""Live ``llmp serve`` processes for the OpenAI front-end tests, shared per session (each costs seconds).

* ``server``: a tiny random Llama (vocab 512) with ``--max-n 4`` and a small
  ``--max-request-body-bytes``; generation, errors and concurrency tests.
* ``ops_server``: the same model with CORS, ``--root-path /llm`` and
  ``--return-tokens-as-token-ids``; probes, metrics and aborts (its counters
  see only those tests).
* ``auth_server``: the same model behind ``--api-key``, under an alias
  (``--served-model-name``) and with ``--max-model-len 64``.

The embedding model and the default model need other distributions: their
tests are in the repository's ``tests/serve``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for openai_frontend_support (tests import it too)

from openai_frontend_support import (  # noqa: E402
    ALIAS,
    API_KEY,
    BODY_LIMIT,
    MAX_N,
    OK_ORIGIN,
    ROOT_PATH,
    SHORT_CONTEXT,
    TinyLlama,
)

from llmp.testing import LiveServer, save_tiny_llama, serving  # noqa: E402


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyLlama:
    path = tmp_path_factory.mktemp("tiny-llama")
    return TinyLlama(path, save_tiny_llama(path))


def _serve(model: Any, *args: str) -> Iterator[LiveServer]:
    with serving(model, *args) as live:
        yield live
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


@pytest.fixture(scope="session")
def server(tiny: TinyLlama) -> Iterator[LiveServer]:
    yield from _serve(tiny.path, "--max-n", str(MAX_N), "--max-request-body-bytes", str(BODY_LIMIT))


@pytest.fixture(scope="session")
def ops_server(tiny: TinyLlama) -> Iterator[LiveServer]:
    yield from _serve(
        tiny.path,
        "--allowed-origins",
        OK_ORIGIN,
        "--root-path",
        ROOT_PATH,
        "--return-tokens-as-token-ids",
        "--enable-prompt-tokens-details",
    )


@pytest.fixture(scope="session")
def auth_server(tiny: TinyLlama) -> Iterator[LiveServer]:
    yield from _serve(
        tiny.path, "--api-key", API_KEY, "--served-model-name", ALIAS, "--max-model-len", str(SHORT_CONTEXT)
    )


@pytest.fixture(scope="session")
def client(server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=60) as sdk:
        yield sdk


@pytest.fixture(scope="session")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def ops_http(ops_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=ops_server.url, timeout=60) as c:
        yield c
