"""``llmp mcp MODEL`` over stdio, driven by the MCP SDK's stdio client."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mcp_frontend_support import MAX_TOKENS, PROMPT, run_client, text_of


def test_stdio_generate_equals_http(tiny_dir: Path, expected_completion: str) -> None:
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "llmp", "mcp", str(tiny_dir), "--dtype", "float32", "--kv-cache-memory-gib", "0.25"],
    )

    async def work(client: Any) -> Any:
        tools = await client.list_tools()
        result = await client.call_tool("generate", {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0})
        bad = await client.call_tool("generate", {"prompt": PROMPT, "temperature": -1})
        tokens = await client.call_tool("tokenize", {"text": PROMPT})
        return tools, result, bad, tokens

    tools, result, bad, tokens = run_client(params, work)
    assert sorted(t.name for t in tools.tools) == ["chat", "generate", "tokenize"]
    assert not result.is_error, result
    assert text_of(result) == expected_completion
    assert bad.is_error and "temperature" in text_of(bad)
    assert tokens.structured_content["count"] == len(tokens.structured_content["tokens"]) > 1
