"""The Ollama-compatible front-end: ``llmp serve --frontend ollama``."""

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import FrontendSpec


@hookimpl
def llmp_register_frontends() -> Iterator[FrontendSpec]:
    yield FrontendSpec(
        name="ollama",
        impl="llmp_frontend_ollama.frontend:OllamaFrontend",
        description="Ollama API: /api/chat, /api/generate (NDJSON streams), /api/embed, /api/tags, /api/show, "
        "/api/ps, /api/version",
    )
