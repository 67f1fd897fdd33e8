"""What ``llmp serve`` runs with, as one typed record (built by the CLI, or by a program)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmp.options import EngineConfig, FrontendOptions, ServerOptions


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    engine: EngineConfig = field(default_factory=EngineConfig)
    server: ServerOptions = field(default_factory=ServerOptions)
    # the request options; the server fills in the rest (model names, context length ...) once the engine is up
    frontend: FrontendOptions = field(default_factory=FrontendOptions)
