"""The Model Context Protocol front-end: ``llmp serve --frontend mcp`` (streamable HTTP at ``/mcp``)
and ``llmp mcp MODEL`` (stdio). Registering imports nothing heavier than ``llmp.api``."""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import CommandSpec, FrontendSpec


@hookimpl
def llmp_register_frontends() -> Iterator[FrontendSpec]:
    yield FrontendSpec(
        name="mcp",
        impl="llmp_frontend_mcp.frontend:McpFrontend",
        probe="llmp_frontend_mcp.probe:GenerateToolProbe",
        description="Model Context Protocol over streamable HTTP at /mcp: tools generate, chat, tokenize; "
        "resource llmp://models",
    )


@hookimpl
def llmp_register_commands() -> Iterator[CommandSpec]:
    yield CommandSpec(
        name="mcp",
        impl="llmp_frontend_mcp.cli:mcp",
        help="Serve a model to an MCP client over stdio (tools generate, chat, tokenize).",
    )
