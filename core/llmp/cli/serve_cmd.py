"""``llmp serve [MODEL]``: the engine behind one HTTP server, with front-end plugins mounted on it.

The options are generated from ``EngineConfig``, ``ServerOptions`` and ``FrontendOptions``.
Kept light at import time: the server, the engine and torch load only when the command runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from llmp.cli.options import options_command
from llmp.options import EngineConfig, FrontendOptions, ServerOptions


@options_command
def serve(engine: EngineConfig, server: ServerOptions, request: FrontendOptions) -> None:
    """Serve a model over HTTP: OpenAI-compatible by default (chat, completions, embeddings, responses)."""
    from llmp.engine.engine_process import EngineProcess
    from llmp.engine.process_settings import exit_without_teardown

    # the engine process first: it imports torch and the engine while this process imports the web
    # stack and resolves the model
    engine_process = EngineProcess(server.log_level)
    try:
        from llmp.server.launch import run
        from llmp.server.settings import ServeSettings

        status = run(ServeSettings(engine=engine, server=server, frontend=request), engine_process)
    finally:
        engine_process.discard()  # never given its arguments (the start-up failed or was stopped)
    # a process started as `llmp serve` ends without the interpreter's slow teardown; a caller running
    # the command in its own process (a test) keeps its process
    if len(sys.argv) > 1 and sys.argv[1] == "serve" and Path(sys.argv[0]).name in ("llmp", "__main__.py"):
        exit_without_teardown(status)
    raise typer.Exit(status)
