"""The Anthropic-compatible front-end: ``llmp serve --frontend anthropic``."""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import FrontendSpec


@hookimpl
def llmp_register_frontends() -> Iterator[FrontendSpec]:
    yield FrontendSpec(
        name="anthropic",
        impl="llmp_frontend_anthropic.frontend:AnthropicFrontend",
        probe="llmp_frontend_anthropic.probe:MessagesProbe",
        description="Anthropic Messages API: /v1/messages (whole and streamed), /v1/messages/count_tokens",
    )
