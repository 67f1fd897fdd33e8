"""The Anthropic-compatible front-end: ``llmp serve --frontend anthropic``."""

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import FrontendSpec


@hookimpl
def llmp_register_frontends() -> Iterator[FrontendSpec]:
    yield FrontendSpec(
        name="anthropic",
        impl="llmp_frontend_anthropic.frontend:AnthropicFrontend",
        description="Anthropic Messages API: /v1/messages (whole and streamed), /v1/messages/count_tokens",
    )
