"""vLLM's ``--middleware``: ASGI middleware a user names by import path wraps the whole app."""

from __future__ import annotations

import textwrap
from pathlib import Path

import httpx

from llmp.testing import save_tiny_llama, serving

MIDDLEWARE = textwrap.dedent(
    """
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.responses import PlainTextResponse


    class Stamp(BaseHTTPMiddleware):  # a class: app.add_middleware
        async def dispatch(self, request, call_next):
            response = await call_next(request)
            response.headers["x-stamp"] = request.url.path
            return response


    async def teapot(request, call_next):  # an async function: an HTTP middleware
        if request.url.path == "/teapot":
            return PlainTextResponse("short and stout", status_code=418)
        response = await call_next(request)
        response.headers["x-order"] = response.headers.get("x-stamp", "none")  # Stamp ran inside it
        return response
    """
)


def test_middleware_classes_and_functions_wrap_every_route_in_order(tmp_path: Path) -> None:
    (tmp_path / "user_middleware.py").write_text(MIDDLEWARE)
    save_tiny_llama(tmp_path / "model")
    args = ("--middleware", "user_middleware.Stamp", "--middleware", "user_middleware:teapot", "--api-key", "k")
    with serving(tmp_path / "model", *args, env={"PYTHONPATH": str(tmp_path)}) as live:
        with httpx.Client(base_url=live.url, timeout=60) as http:
            teapot = http.get("/teapot")
            assert (teapot.status_code, teapot.text) == (418, "short and stout")  # before the API key's gate
            assert "x-stamp" not in teapot.headers  # the last given is outermost: it answered first
            body = {"prompt": "hi", "max_tokens": 2}
            completion = http.post("/v1/completions", json=body, headers={"Authorization": "Bearer k"})
            assert completion.status_code == 200, completion.text
            assert completion.headers["x-stamp"] == "/v1/completions"
            assert completion.headers["x-order"] == "/v1/completions"
            refused = http.post("/v1/completions", json=body)
            assert refused.status_code == 401 and refused.headers["x-stamp"] == "/v1/completions"
