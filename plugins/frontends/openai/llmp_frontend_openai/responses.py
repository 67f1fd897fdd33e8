"""``POST /v1/responses``: the Responses API, on top of chat completions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter

if TYPE_CHECKING:
    from llmp_frontend_openai.frontend import OpenAIFrontend


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> None:
    return None
