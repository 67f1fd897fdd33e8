"""The /mcp route on the shared app, in-process with a stand-in engine (tokenizer only): methods, the
trailing slash, the docs. Generation is covered against a live server in test_http, the API key on
/mcp by the conformance kit (test_conformance)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from starlette.middleware.cors import CORSMiddleware

from llmp.options import FrontendOptions
from llmp.testing import frontend_app

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
ACCEPT = {"Accept": "application/json, text/event-stream"}
AUTH = {"Authorization": "Bearer k", **ACCEPT}
ALLOWED_ORIGIN = "https://app.example"
LOOPBACK_ORIGINS = ("http://localhost:5173", "http://127.0.0.1", "https://[::1]:8443")
FOREIGN_ORIGINS = ("http://evil.example", "http://localhost.evil.example", "null")


class TokenizerOnlyEngine:
    def __init__(self) -> None:
        from llmp.testing import tiny_tokenizer

        self.info = {"vocab_size": 512}
        self.tokenizer = tiny_tokenizer()

    def get_tokenizer(self) -> Any:
        return self.tokenizer


@pytest.fixture(scope="module")
def responses() -> dict[str, Any]:
    from llmp_frontend_mcp.frontend import McpFrontend

    engine = TokenizerOnlyEngine()

    async def main() -> dict[str, Any]:
        frontend = McpFrontend(engine, FrontendOptions(served_model_names=("m",), max_model_len=64))
        app = frontend_app(frontend, api_keys=["k"])
        tokenize = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "tokenize", "arguments": {"text": "The quick brown fox"}},
        }
        app.add_middleware(CORSMiddleware, allow_origins=[ALLOWED_ORIGIN])  # --allowed-origins

        def call(arguments: dict) -> dict:
            return {**tokenize, "params": {"name": "tokenize", "arguments": arguments}}

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://127.0.0.1:8000") as c:
            return {
                "no_key": await c.post("/mcp", headers=ACCEPT, json=INIT),
                "origins": {
                    origin: await c.post("/mcp", headers={**AUTH, "Origin": origin}, json=INIT)
                    for origin in (ALLOWED_ORIGIN, *LOOPBACK_ORIGINS, *FOREIGN_ORIGINS)
                },
                "wrong_type": await c.post("/mcp", headers=AUTH, json=call({"text": "a", "add_special_tokens": "no"})),
                "unknown": await c.post("/mcp", headers=AUTH, json=call({"text": "a", "add_bos": False})),
                "tools": await c.post("/mcp", headers=AUTH, json={"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
                "init": await c.post("/mcp", headers=AUTH, json=INIT),
                "slash": await c.post("/mcp/", headers=AUTH, json=INIT),
                "get": await c.get("/mcp", headers=AUTH),
                "delete": await c.delete("/mcp", headers=AUTH),
                "tokenize": await c.post("/mcp", headers=AUTH, json=tokenize),
                "openapi": await c.get("/openapi.json", headers=AUTH),
            }

    return {"expected_ids": engine.tokenizer.encode("The quick brown fox"), **asyncio.run(main())}


def test_post_initialize(responses: dict[str, Any]) -> None:
    for key in ("init", "slash"):
        assert responses[key].status_code == 200, responses[key].text
        result = responses[key].json()["result"]
        assert result["serverInfo"]["name"] == "llmp"
        assert set(result["capabilities"]) >= {"tools", "resources"}


def test_no_get_stream_or_delete_when_stateless(responses: dict[str, Any]) -> None:
    assert responses["get"].status_code == 405
    assert responses["delete"].status_code == 405


def test_tokenize_tool(responses: dict[str, Any]) -> None:
    result = responses["tokenize"].json()["result"]
    ids = responses["expected_ids"]
    assert result["isError"] is False
    assert result["structuredContent"] == {"tokens": ids, "count": len(ids), "max_model_len": 64}


def test_not_in_the_openapi_docs(responses: dict[str, Any]) -> None:
    assert responses["openapi"].status_code == 200
    assert "/mcp" not in responses["openapi"].json()["paths"]


def test_gate_refusals_are_jsonrpc_errors(responses: dict[str, Any]) -> None:
    refused = responses["no_key"]
    assert refused.status_code == 401
    body = refused.json()
    assert body["jsonrpc"] == "2.0" and body["id"] is None
    assert body["error"]["code"] == -32600 and "API key" in body["error"]["message"]


def test_origin_is_validated(responses: dict[str, Any]) -> None:
    for origin, response in responses["origins"].items():
        if origin in FOREIGN_ORIGINS:  # a page of another site (DNS rebinding): refused
            assert response.status_code == 403, (origin, response.text)
            assert "Origin" in response.json()["error"]["message"]
        else:
            assert response.status_code == 200, (origin, response.text)
            assert response.json()["result"]["serverInfo"]["name"] == "llmp"
    assert responses["init"].status_code == 200  # no Origin: not a browser


def test_arguments_are_checked_strictly(responses: dict[str, Any]) -> None:
    for key, field in (("wrong_type", "add_special_tokens"), ("unknown", "add_bos")):
        result = responses[key].json()["result"]
        assert result["isError"], result  # neither coerced nor dropped
        assert field in result["content"][0]["text"]
    tools = responses["tools"].json()["result"]["tools"]
    assert tools and all(tool["inputSchema"]["additionalProperties"] is False for tool in tools)
