"""A live ``llmp serve`` with the OpenAI and MCP front-ends behind ``--api-key``, shared by the tests
(each server costs seconds): the OpenAI routes give the expected values the MCP tools must match."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for mcp_frontend_support (tests import it too)

from mcp_frontend_support import API_KEY, AUTH, MAX_TOKENS, PROMPT, server_model

from llmp.testing import LiveServer, save_tiny_llama, serving


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path)
    return path


@pytest.fixture(scope="session")
def server(tiny_dir: Path) -> Iterator[LiveServer]:
    with serving(
        tiny_dir, "--frontend", "openai", "--frontend", "mcp", "--dtype", "float32", "--api-key", API_KEY
    ) as live:
        yield live
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


@pytest.fixture(scope="session")
def expected_completion(server: LiveServer) -> str:
    """The OpenAI front-end's greedy completion of PROMPT: what the MCP `generate` tool must return."""
    import httpx

    response = httpx.post(
        f"{server.url}/v1/completions",
        headers=AUTH,
        timeout=60,
        json={"model": str(server_model(server)), "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0},
    )
    assert response.status_code == 200, response.text
    text = response.json()["choices"][0]["text"]
    assert text  # a tiny random model still says something in 12 tokens
    return text
