"""Constants and helpers of the MCP front-end tests (conftest imports them too)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from llmp.testing import LiveServer

API_KEY = "k"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "The quick brown fox"
MAX_TOKENS = 12
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paged attention keeps"}]


def server_model(server: LiveServer) -> str:
    import httpx

    response = httpx.get(f"{server.url}/v1/models", headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["data"][0]["id"]


def run_client(target: Any, work: Callable[[Any], Awaitable[Any]]) -> Any:
    """Open an MCP ``Client`` on ``target`` (a transport or stdio parameters), run ``work(client)``, close."""
    from mcp import Client

    async def main() -> Any:
        async with Client(target, read_timeout_seconds=120) as client:
            return await work(client)

    return asyncio.run(main())


def text_of(result: Any) -> str:
    assert len(result.content) == 1, result
    return result.content[0].text
