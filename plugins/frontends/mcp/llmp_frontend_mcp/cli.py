"""``llmp mcp [MODEL]``: an in-process engine serving the MCP tools over stdio.

An MCP client (an editor, an agent) launches this command and talks JSON-RPC on its
stdin and stdout, so stdout carries the protocol only: logs go to stderr, and the
engine process is started with its stdout pointing at stderr. Heavy imports happen
inside the command: this module is imported whenever the CLI lists commands.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from llmp.cli.options import Select, options_command
from llmp.lora import LoRAModulePath
from llmp.options import EngineConfig, FrontendOptions, LogLevel, ServerOptions, option

# The engine options of ``llmp serve`` but --task (the MCP tools generate), and of its request options those
# the MCP tools use (LoRA resolvers: a tool's ``model`` may name an adapter of --lora-resolver-dir).
McpEngine = Annotated[EngineConfig, Select(omit=("task", "runner", "convert"))]
McpRequests = Annotated[
    FrontendOptions,
    Select(
        only=(
            "chat_template",
            "generation_config",
            "max_stop_sequences",
            "enable_lora_runtime_updates",
            "lora_resolver_dir",
        ),
        help={"enable_lora_runtime_updates": "Let LoRA resolvers load the adapters a tool's model names."},
    ),
]
McpNames = Annotated[
    ServerOptions,
    Select(
        only=("served_model_name", "lora_modules"),
        help={
            "served_model_name": "Public model name(s), listed by the llmp://models resource.",
            "lora_modules": 'Adapter the tools serve as a model: NAME=PATH or {"name","path","base_model_name"} '
            "(repeatable).",
        },
    ),
]


@dataclass(frozen=True, kw_only=True)
class McpLogging:
    # quieter than serve's: an MCP client shows the server's stderr to its user
    log_level: LogLevel = option("warning", "Log level of the messages written to stderr.")


@options_command
def mcp(engine: McpEngine, request: McpRequests, names: McpNames, logs: McpLogging) -> None:
    """Serve a model to an MCP client over stdio: tools generate, chat and tokenize, resource llmp://models."""
    raise typer.Exit(run(engine, request, names, logs))


def run(engine_config: EngineConfig, request: FrontendOptions, names: ServerOptions, logs: McpLogging) -> int:
    import asyncio
    import logging

    logging.basicConfig(level=logs.log_level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    from llmp.api import LLMPError
    from llmp.frontend import read_chat_template
    from llmp.lora import parse_lora_module

    try:  # bad values fail before the engine starts
        chat_template = read_chat_template(request.chat_template)
        lora_modules = [parse_lora_module(value) for value in names.lora_modules]
    except (LLMPError, ValueError) as exc:
        print(f"llmp mcp: {exc}", file=sys.stderr)
        return 2
    try:
        engine = _start_engine(engine_config)
    except (LLMPError, ValueError, TypeError, OSError) as exc:
        print(f"llmp mcp: cannot start the engine: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(engine_config, request, names, engine, chat_template, lora_modules))
    except KeyboardInterrupt:
        return 130
    finally:
        engine.shutdown()


def _start_engine(config: EngineConfig) -> Any:
    """``AsyncLLM`` with fd 1 pointing at stderr meanwhile, so the engine process (which inherits
    it) can never write into the protocol stream."""
    import os

    from llmp import AsyncLLM

    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        return AsyncLLM(config.model, engine_mode="process", **config.keywords())  # resolves the model, once
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


async def _serve(
    engine_config: EngineConfig,
    request: FrontendOptions,
    server: ServerOptions,
    engine: Any,
    chat_template: str | None,
    lora_modules: list[LoRAModulePath],
) -> int:
    from llmp.api import LLMPError
    from llmp.frontend import frontend_options, load_lora_modules, served_model_names
    from llmp_frontend_mcp.frontend import McpFrontend

    names = served_model_names(server.served_model_name, engine_config.model)
    try:
        await load_lora_modules(engine, lora_modules, names)
    except LLMPError as exc:
        print(f"llmp mcp: {exc}", file=sys.stderr)
        return 2
    # chat_template: the template text, read from a --chat-template file
    options = frontend_options(request, engine.info, names, chat_template=chat_template)
    frontend = McpFrontend(engine, options)
    await frontend.server.run_stdio_async()  # until the client closes stdin
    return 0
