"""``llmp mcp [MODEL]``: an in-process engine serving the MCP tools over stdio.

An MCP client (an editor, an agent) launches this command and talks JSON-RPC on its
stdin and stdout, so stdout carries the protocol only: logs go to stderr, and the
engine process is started with its stdout pointing at stderr. Heavy imports happen
inside the command: this module is imported whenever the CLI lists commands.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic_settings import NoDecode

from llmp.cli import ConfigOption
from llmp.config import CommandSettings, load_settings

ListOfStr = Annotated[list[str], NoDecode]


class McpSettings(CommandSettings):
    model: str | None = None
    served_model_name: ListOfStr = []
    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 256
    kv_cache_memory_gib: float = 4.0
    num_threads: int | None = None
    seed: int = 0
    chat_template: str | None = None
    generation_config: str = "auto"
    max_stop_sequences: int = 64
    log_level: str = "warning"


def mcp(
    ctx: typer.Context,
    model: str | None = typer.Argument(
        None, help="Model directory, .gguf file or Hugging Face id in the local cache; default SmolLM2-135M-Instruct."
    ),
    served_model_name: list[str] | None = typer.Option(
        None, "--served-model-name", help="Public model name(s), listed by the llmp://models resource."
    ),
    dtype: str = typer.Option("auto", help="auto, bfloat16, float16 or float32."),
    max_model_len: int | None = typer.Option(
        None, help="Context length (default: the model's, capped by the KV cache)."
    ),
    max_num_seqs: int = typer.Option(256, help="Most sequences in one step."),
    kv_cache_memory_gib: float = typer.Option(4.0, help="Memory for the KV cache, in GiB."),
    num_threads: int | None = typer.Option(None, help="Torch threads of the engine (default: all cores)."),
    seed: int = typer.Option(0, help="Engine seed for requests without one."),
    chat_template: str | None = typer.Option(None, help="Chat template file or text (default: the tokenizer's)."),
    generation_config: str = typer.Option(
        "auto", help="'auto': sampling defaults from the model's generation_config.json; 'none': ignore it."
    ),
    max_stop_sequences: int = typer.Option(64, help="Most stop strings in one request."),
    log_level: str = typer.Option("warning", help="Log level of the messages written to stderr."),
    config: Path | None = ConfigOption,
) -> None:
    """Serve a model to an MCP client over stdio: tools generate, chat and tokenize, resource llmp://models."""
    raise typer.Exit(run(load_settings(McpSettings, ctx)))


def run(settings: McpSettings) -> int:
    import asyncio
    import logging

    logging.basicConfig(
        level=settings.log_level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    from llmp.api import LLMPError

    chat_template = _chat_template(settings.chat_template)  # a bad value fails before the engine starts
    try:
        engine = _start_engine(settings)
    except (LLMPError, ValueError, TypeError, OSError) as exc:
        print(f"llmp mcp: cannot start the engine: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(settings, engine, chat_template))
    except KeyboardInterrupt:
        return 130
    finally:
        engine.shutdown()


def _start_engine(settings: McpSettings) -> Any:
    """``AsyncLLM`` with fd 1 pointing at stderr meanwhile, so the engine process (which inherits
    it) can never write into the protocol stream."""
    import os

    from llmp.async_llm import AsyncLLM
    from llmp.modeling.files import resolve_model

    model_dir = resolve_model(settings.model)
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        return AsyncLLM(
            str(model_dir),
            engine_mode="process",
            dtype=settings.dtype,
            max_model_len=settings.max_model_len,
            max_num_seqs=settings.max_num_seqs,
            kv_cache_memory_bytes=int(settings.kv_cache_memory_gib * (1 << 30)),
            num_threads=settings.num_threads,
            seed=settings.seed,
        )
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


async def _serve(settings: McpSettings, engine: Any, chat_template: str | None) -> int:
    from llmp.modeling.files import DEFAULT_MODEL
    from llmp_frontend_mcp.frontend import McpFrontend

    info = engine.info
    options = {
        "served_model_names": settings.served_model_name or [settings.model or DEFAULT_MODEL],
        "model_root": info.get("model_dir", ""),
        "max_model_len": info["max_model_len"],
        "task": info.get("task", "generate"),
        "chat_template": chat_template,
        "generation_config": settings.generation_config,
        "max_stop_sequences": settings.max_stop_sequences,
    }
    frontend = McpFrontend(engine, options)
    await frontend.server.run_stdio_async()  # until the client closes stdin
    return 0


def _chat_template(value: str | None) -> str | None:
    if value is None or "{" in value:
        return value
    path = Path(value)
    if not path.is_file():
        raise typer.BadParameter(f"--chat-template {value!r} is neither a readable file nor template text")
    return path.read_text()
