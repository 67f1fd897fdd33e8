"""llmp-frontend-tgi: Hugging Face TGI's generate API for llmp, ``llmp serve MODEL --frontend tgi``.

Registering imports nothing heavier than ``llmp.api``: the front-end's module (and its web
framework) loads only when a server mounts it.
"""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import: an incompatible llmp says so in one line

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import FrontendSpec


@hookimpl
def llmp_register_frontends() -> Iterator[FrontendSpec]:
    yield FrontendSpec(
        name="tgi",
        impl="llmp_frontend_tgi.frontend:TGIFrontend",
        # how `llmp plugins verify frontend-tgi` asks this protocol for a generation
        probe="llmp_frontend_tgi.probe:TGIProbe",
        description="Hugging Face TGI's generate API (a subset) under /tgi: POST /tgi/generate, /tgi/generate_stream",
    )
