"""The page's HTTP routes: public files with their types and caching, the API behind the key,
config.json, --root-path, and who owns "/" beside other front-ends."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest
from llmp_frontend_webui.frontend import WebUIFrontend
from webui_frontend_support import API_KEY

from llmp.options import FrontendOptions
from llmp.testing import LiveServer, frontend_app, serving

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def http(key_server: LiveServer) -> httpx.Client:
    with httpx.Client(base_url=key_server.url, timeout=60) as client:
        yield client


def test_the_page_and_its_files_are_public_while_the_api_needs_the_key(http: httpx.Client) -> None:
    page = http.get("/")
    assert page.status_code == 200, page.text
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["cache-control"] == "no-cache"
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    assert http.head("/").status_code == 200  # clients probe "/" to see the server is up

    kinds = {"app.js": "text/javascript", "markdown.js": "text/javascript", "style.css": "text/css"}
    for name, kind in kinds.items():
        version = re.search(rf'webui/{re.escape(name)}\?v=(\w+)"', page.text)
        assert version, f"the page does not load webui/{name} with its version"
        asset = http.get(f"/webui/{name}", params={"v": version[1]})
        assert asset.status_code == 200, asset.text
        assert asset.headers["content-type"].startswith(kind)
        assert "immutable" in asset.headers["cache-control"]
        assert asset.headers["etag"] == f'"{version[1]}"'  # the version is the content's hash
        again = http.get(f"/webui/{name}", headers={"If-None-Match": asset.headers["etag"]})
        assert again.status_code == 304 and not again.content

    missing = http.get("/webui/nothing.js")
    assert missing.status_code == 404
    assert "nothing.js" in missing.json()["error"]["message"]

    refused = http.get("/v1/models")
    assert refused.status_code == 401  # the page is public, the model is not
    assert http.post("/v1/chat/completions", json={"messages": []}).status_code == 401


def test_webui_alone_mounts_the_openai_routes_it_calls(http: httpx.Client) -> None:
    models = http.get("/v1/models", headers=AUTH)
    assert models.status_code == 200, models.text
    reply = http.post(
        "/v1/chat/completions",
        headers=AUTH,
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True},
    )
    assert reply.status_code == 200 and reply.text.rstrip().endswith("data: [DONE]")


def test_config_behind_a_key_says_only_that_a_key_is_needed(http: httpx.Client) -> None:
    config = http.get("/webui/config.json")  # public: no model names, no context length
    assert config.status_code == 200
    assert config.headers["cache-control"] == "no-store"
    assert config.json() == {"auth": True}
    (model,) = http.get("/v1/models", headers=AUTH).json()["data"]  # the page reads the rest here
    assert model["max_model_len"] == 512


def test_config_says_when_replies_carry_reasoning() -> None:
    options = FrontendOptions(served_model_names=("a", "b"), reasoning_parser="qwen3", max_model_len=4096)
    app = frontend_app(WebUIFrontend(None, options))

    async def get() -> dict:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
            return (await client.get("/webui/config.json")).json()

    config = asyncio.run(get())
    assert config == {"model": "a", "models": ["a", "b"], "reasoning": True, "auth": False, "max_model_len": 4096}


def test_behind_root_path_the_page_resolves_its_urls_under_the_prefix(http: httpx.Client) -> None:
    page = http.get("/llm/")
    assert page.status_code == 200
    assert '<base href="/llm/">' in page.text  # so /llm (no slash) and /llm/ both load webui/... under /llm
    assert not re.search(r'(?:src|href)="/(?!llm/)', page.text), "the page must use relative URLs"
    assert http.get("/llm/webui/app.js").status_code == 200
    assert http.get("/llm/v1/models", headers=AUTH).status_code == 200
    # the page's calls are relative too: nothing in the script starts at the host's root
    script = http.get("/webui/app.js").text
    assert re.findall(r'(?:fetch|api)\("(v1/[^"]+|webui/[^"]+)"', script)
    assert not re.search(r'(?:fetch|api)\("/', script)


def test_the_page_keeps_root_beside_ollama(tiny_model: Path) -> None:
    pytest.importorskip("llmp_frontend_ollama", reason="the ollama front-end (llmp-frontend-ollama) is not installed")
    # listed first, Ollama's banner still gives way to the page (root_priority 10 over 1)
    with serving(tiny_model, "--frontend", "ollama", "--frontend", "webui") as live:
        with httpx.Client(base_url=live.url, timeout=60) as client:
            page = client.get("/")
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert "Ollama is running" not in page.text
            assert client.head("/").status_code == 200
            assert client.get("/api/version").status_code == 200
            assert client.get("/v1/models").status_code == 200
