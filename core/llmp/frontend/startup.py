"""What a server or a command does to build its front-ends once the engine is up: read the chat
template, name the model, and complete :class:`~llmp.options.FrontendOptions` with the engine's facts.
``llmp serve`` does it for every front-end it mounts; a command that runs a front-end itself
(``llmp mcp``) does the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from llmp.api import LLMPError
from llmp.options import DEFAULT_MODEL, FrontendOptions


def read_chat_template(value: str | None) -> str | None:
    """A ``--chat-template`` value as template text: the file it names, or the text itself.
    ``LLMPError`` when it is neither (before the engine starts)."""
    if value is None:
        return None
    path = Path(value)
    if len(value) < 4096 and ("{" not in value) and path.is_file():
        return path.read_text()
    if "{" not in value:
        raise LLMPError(f"--chat-template {value!r} is neither a readable file nor template text")
    return value


def served_model_names(names: Sequence[str], model: str | None) -> tuple[str, ...]:
    """The public model names: those given (``--served-model-name``), else the model as it was named."""
    return tuple(names) or (model or DEFAULT_MODEL,)


def frontend_options(
    request: FrontendOptions, info: Mapping[str, Any], served_names: Sequence[str], **server: Any
) -> FrontendOptions:
    """The options a front-end is built with: the request options as the command read them
    (``chat_template`` already read by :func:`read_chat_template`), completed with the engine's
    facts (``engine.info``) and the served names; ``server`` sets the server's own fields
    (``host``, ``api_keys``, ``max_request_body_bytes``)."""
    task = info.get("task", "generate")
    return replace(
        request,
        served_model_names=tuple(served_names),
        model_root=str(info.get("model_dir", "")),
        max_model_len=info["max_model_len"],
        task=task,
        supported_tasks=tuple(info.get("supported_tasks") or (task,)),
        **server,
    )
