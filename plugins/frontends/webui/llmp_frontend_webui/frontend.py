"""The web chat page: ``GET /`` is a single page, its files under ``/webui/``, and
``GET /webui/config.json`` what the page needs to know about the server.

The page is plain HTML, CSS and JavaScript shipped as package data (no build step, no CDN:
many deployments are offline). It talks to the server's own OpenAI routes (``/v1/models``,
``/v1/chat/completions`` streamed), which this front-end ``requires``; the page and its
files are public (no API key), the page sends the key the user gives it on those calls.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from llmp.frontend import APIError
from llmp.options import FrontendOptions

ASSET_PREFIX = "/webui/"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# the page runs only its own files and talks only to its own server: model output that slipped
# past the renderer's escaping still could not load or run anything
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'self'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
# asset URLs carry their content's hash (?v=...), so a browser may keep them for good
ASSET_CACHE = "public, max-age=31536000, immutable"
NO_CACHE = "no-cache"  # the page itself is revalidated: a new llmp version is seen at the next load


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def load_assets() -> dict[str, Asset]:
    """The page's files by name (``app.js``), read once from the package."""
    assets = {}
    for entry in resources.files("llmp_frontend_webui").joinpath("static").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in CONTENT_TYPES:
            body = entry.read_bytes()
            assets[entry.name] = Asset(body, CONTENT_TYPES[suffix], f'"{hashlib.sha256(body).hexdigest()[:16]}"')
    return assets


def versioned_page(page: str, assets: dict[str, Asset]) -> str:
    """The page with each ``webui/NAME`` reference made ``webui/NAME?v=HASH``."""

    def version(match: re.Match) -> str:
        name = match.group(1)
        return f"webui/{name}?v={assets[name].etag.strip(chr(34))}" if name in assets else match.group(0)

    return re.sub(r"webui/([\w.-]+\.(?:js|css|svg))", version, page)


class WebUIFrontend:
    """Serves the chat page; its model calls go to the OpenAI front-end's routes."""

    public_paths = ("/", ASSET_PREFIX)  # a static page and its files: no data, no model
    root_priority = 10  # the page wins "/" over a banner (Ollama's "Ollama is running")

    def __init__(self, engine: Any, options: FrontendOptions) -> None:
        self.options = options
        self.assets = load_assets()
        self.page = versioned_page(self.assets["index.html"].body.decode(), self.assets)

    def config(self) -> dict[str, Any]:
        """What the page reads at start: the default model, whether replies carry reasoning,
        whether an API key is needed, the context length. Public (no key): behind ``--api-key``
        it says only ``{"auth": true}``, and the page asks ``/v1/models`` once it has the key."""
        if self.options.api_keys:
            return {"auth": True}
        names = list(self.options.served_model_names)
        return {
            "model": names[0] if names else None,
            "models": names,
            "reasoning": self.options.reasoning_parser is not None,
            "auth": False,
            "max_model_len": self.options.max_model_len,
        }

    def http_router(self) -> APIRouter:
        router = APIRouter()
        # HEAD too: clients probe a server's "/" to see it is up (Ollama's do)
        router.add_api_route("/", self.index, methods=["GET", "HEAD"], include_in_schema=False)
        router.add_api_route(ASSET_PREFIX + "config.json", self.config_json, methods=["GET"], include_in_schema=False)
        router.add_api_route(ASSET_PREFIX + "{name}", self.asset, methods=["GET", "HEAD"], include_in_schema=False)
        return router

    async def serve(self) -> None:  # HTTP only: the shared server runs the routes
        return None

    # -- routes ----------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        page = self.page
        root = request.scope.get("root_path", "").rstrip("/")
        if root:  # behind --root-path: the page's relative URLs resolve under it however it was reached
            page = page.replace("<head>", f'<head>\n<base href="{_attr(root)}/">', 1)
        headers = {
            **SECURITY_HEADERS,
            "Cache-Control": NO_CACHE,
            "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        }
        return Response(page, media_type=CONTENT_TYPES[".html"], headers=headers)

    async def config_json(self) -> JSONResponse:
        return JSONResponse(self.config(), headers={**SECURITY_HEADERS, "Cache-Control": "no-store"})

    async def asset(self, name: str, request: Request) -> Response:
        asset = self.assets.get(name)
        if asset is None or name == "index.html":
            raise APIError(404, f"no such file: {ASSET_PREFIX}{name}", type="NotFoundError")
        headers = {**SECURITY_HEADERS, "Cache-Control": ASSET_CACHE, "ETag": asset.etag}
        if request.headers.get("if-none-match") == asset.etag:
            return Response(status_code=304, headers=headers)
        return Response(asset.body, media_type=asset.content_type, headers=headers)


def _attr(text: str) -> str:
    """``text`` safe inside a double-quoted HTML attribute."""
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
