"""LoRA adapters (``--enable-lora --lora-modules a=PATH``) through the MCP tools' ``model`` argument
and the ``llmp://models`` resource, over HTTP on ``llmp serve`` (checked against the OpenAI routes
of the same server) and over stdio (``llmp mcp``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp_frontend_support import API_KEY, AUTH, MAX_TOKENS, MESSAGES, PROMPT, run_client, text_of

from llmp.testing import LiveServer, save_random_lora, serving


@pytest.fixture(scope="module")
def adapter(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_lora(tiny_dir, tmp_path_factory.mktemp("lora") / "a", seed=1)


@pytest.fixture(scope="module")
def lora_server(tiny_dir: Path, adapter: Path) -> Iterator[LiveServer]:
    with serving(
        tiny_dir,
        "--frontend",
        "openai",
        "--frontend",
        "mcp",
        "--dtype",
        "float32",
        "--api-key",
        API_KEY,
        "--enable-lora",
        "--lora-modules",
        f"a={adapter}",
    ) as live:
        yield live
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


def openai_text(server: LiveServer, route: str, **body: Any) -> str:
    response = httpx.post(
        f"{server.url}/v1/{route}",
        headers=AUTH,
        timeout=60,
        json={"max_tokens": MAX_TOKENS, "temperature": 0, **body},
    )
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return choice["text"] if route == "completions" else choice["message"]["content"]


def http_target(server: LiveServer) -> Any:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    client = httpx2.AsyncClient(headers=AUTH, timeout=httpx2.Timeout(30, read=120))
    return streamable_http_client(f"{server.url}/mcp", http_client=client)


def test_tools_run_on_the_named_adapter(lora_server: LiveServer, tiny_dir: Path) -> None:
    greedy = {"max_tokens": MAX_TOKENS, "temperature": 0}

    async def work(client: Any) -> Any:
        on_adapter = await client.call_tool("generate", {"prompt": PROMPT, "model": "a", **greedy})
        on_base = await client.call_tool("generate", {"prompt": PROMPT, **greedy})
        chat = await client.call_tool("chat", {"messages": MESSAGES, "model": "a", **greedy})
        unknown = await client.call_tool("generate", {"prompt": PROMPT, "model": "b", **greedy})
        return on_adapter, on_base, chat, unknown

    on_adapter, on_base, chat, unknown = run_client(http_target(lora_server), work)
    assert not on_adapter.is_error and not on_base.is_error and not chat.is_error
    assert text_of(on_adapter) == openai_text(lora_server, "completions", model="a", prompt=PROMPT)
    assert text_of(on_base) == openai_text(lora_server, "completions", model=str(tiny_dir), prompt=PROMPT)
    assert text_of(on_adapter) != text_of(on_base)
    assert text_of(chat) == openai_text(lora_server, "chat/completions", model="a", messages=MESSAGES)
    assert unknown.is_error and "b" in text_of(unknown)


def test_models_resource_lists_the_adapter(lora_server: LiveServer, tiny_dir: Path, adapter: Path) -> None:
    async def work(client: Any) -> Any:
        return await client.read_resource("llmp://models"), await client.read_resource("llmp://models/a")

    models, one = run_client(http_target(lora_server), work)
    listed = {m["name"]: m for m in json.loads(models.contents[0].text)["models"]}
    assert list(listed) == [str(tiny_dir), "a"]
    assert listed["a"]["root"] == str(adapter) and listed["a"]["parent"] == str(tiny_dir)
    assert json.loads(one.contents[0].text) == listed["a"]


def test_stdio_serves_lora_modules(tiny_dir: Path, adapter: Path, lora_server: LiveServer) -> None:
    from mcp.client.stdio import StdioServerParameters

    command = ["-m", "llmp", "mcp", str(tiny_dir), "--dtype", "float32", "--kv-cache-memory-gib", "0.25"]
    params = StdioServerParameters(
        command=sys.executable, args=[*command, "--enable-lora", "--lora-modules", f"a={adapter}"]
    )

    async def work(client: Any) -> Any:
        arguments = {"prompt": PROMPT, "model": "a", "max_tokens": MAX_TOKENS, "temperature": 0}
        result = await client.call_tool("generate", arguments)
        models = await client.read_resource("llmp://models")
        return result, models

    result, models = run_client(params, work)
    assert not result.is_error, result
    assert text_of(result) == openai_text(lora_server, "completions", model="a", prompt=PROMPT)
    assert [m["name"] for m in json.loads(models.contents[0].text)["models"]] == [str(tiny_dir), "a"]
