"""The web chat page: ``llmp serve --frontend webui`` (``/`` is a chat page on the server's OpenAI routes)."""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import FrontendSpec


@hookimpl
def llmp_register_frontends() -> Iterator[FrontendSpec]:
    yield FrontendSpec(
        name="webui",
        impl="llmp_frontend_webui.frontend:WebUIFrontend",
        description="a web chat page at / (streamed Markdown replies, conversations kept in the browser), "
        "on the OpenAI routes it mounts too",
        requires=("openai",),
    )
