"""The gRPC front-end: ``llmp serve --frontend grpc`` (service ``llmp.v1.Llmp``, see ``llmp.proto``).

Registration imports neither grpc nor the generated stubs: they load with the front-end.
"""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import FrontendSpec


@hookimpl
def llmp_register_frontends() -> Iterator[FrontendSpec]:
    yield FrontendSpec(
        name="grpc",
        impl="llmp_frontend_grpc.frontend:GrpcFrontend",
        description="gRPC service llmp.v1.Llmp (Generate, GenerateStream, Tokenize, ListModels, Health) on its own "
        "port (LLMP_GRPC_PORT, default 50051)",
    )
