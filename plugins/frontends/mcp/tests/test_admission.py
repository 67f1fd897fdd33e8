"""A full server refuses MCP tool calls that run the model, as tool errors, and still answers the rest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmp.testing import LiveServer, serving

ACCEPT = {"Accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def full_server(tiny_dir: Path) -> Iterator[LiveServer]:
    args = ("--frontend", "openai", "--frontend", "mcp", "--dtype", "float32", "--max-num-seqs", "1")
    with serving(tiny_dir, *args, "--max-queue-len", "0") as live:
        yield live


def rpc(http: httpx.Client, method: str, params: dict) -> httpx.Response:
    return http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers=ACCEPT)


def test_a_full_server_refuses_model_calls_as_tool_errors_and_answers_the_rest(full_server: LiveServer) -> None:
    hold = {"prompt": "1, 2, 3,", "max_tokens": 480, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=full_server.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=hold) as busy:  # takes the one place
            lines = busy.iter_lines()
            assert next(lines).startswith("data: ")
            listed = rpc(http, "tools/list", {})
            assert listed.status_code == 200, listed.text
            assert {t["name"] for t in listed.json()["result"]["tools"]} >= {"generate", "tokenize"}
            tokenized = rpc(http, "tools/call", {"name": "tokenize", "arguments": {"text": "fox"}})
            assert tokenized.status_code == 200 and not tokenized.json()["result"]["isError"]
            refused = rpc(http, "tools/call", {"name": "generate", "arguments": {"prompt": "Hi", "max_tokens": 2}})
            assert refused.status_code == 200, refused.text
            result = refused.json()["result"]
            assert result["isError"] and "capacity" in result["content"][0]["text"], result
        assert "Traceback" not in full_server.log()  # a refusal is no failure
