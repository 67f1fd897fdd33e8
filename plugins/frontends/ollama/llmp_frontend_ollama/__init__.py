"""The Ollama-compatible front-end: ``llmp serve --frontend ollama``."""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import FrontendSpec


@hookimpl
def llmp_register_frontends() -> Iterator[FrontendSpec]:
    yield FrontendSpec(
        name="ollama",
        impl="llmp_frontend_ollama.frontend:OllamaFrontend",
        probe="llmp_frontend_ollama.probe:ChatProbe",
        description="Ollama API: /api/chat, /api/generate (NDJSON streams), /api/embed, /api/tags, /api/show, "
        "/api/ps, /api/version",
    )
