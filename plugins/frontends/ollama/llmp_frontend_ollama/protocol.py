"""Request bodies of Ollama's API (what this server reads of them), validated as Ollama's Go
structs are: JSON types strictly (``"stream": "no"`` is a 400, not false), unknown top-level fields
accepted and ignored, and every failure one readable line (:func:`read_body`).

``options`` is read field by field in :mod:`llmp_frontend_ollama.options`, as Ollama's
``Options.FromMap`` reads it.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, TypeVar

from fastapi import Request
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from llmp.frontend import bad_request

THINK_LEVELS = ("high", "medium", "low", "max")
# a Go duration ("5m", "1h30m", "-1s", "300ms"), as keep_alive may be written
_DURATION = re.compile(r"[-+]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+")
_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")

Body = TypeVar("Body", bound=BaseModel)


class OllamaBody(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


def think_value(value: Any) -> bool | str | None:
    """Ollama's ``ThinkValue``: a boolean, or an effort level."""
    if value is None or isinstance(value, bool) or value in THINK_LEVELS:
        return value
    if isinstance(value, str):
        raise ValueError(f'invalid think value: "{value}" (must be "high", "medium", "low", "max", true, or false)')
    raise ValueError('think must be a boolean or string ("high", "medium", "low", "max", true, or false)')


def keep_alive_seconds(value: Any) -> float | None:
    """``keep_alive`` in seconds (negative: forever), as Ollama's ``Duration`` reads it: a number of
    seconds, or a Go duration string ("5m", "0s"); a bare number in a string is taken as seconds."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f'keep_alive must be a duration ("5m") or a number of seconds, got {json.dumps(value)}')
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    if not _DURATION.fullmatch(text):
        raise ValueError(f'keep_alive: invalid duration "{value}" (a duration such as "5m", "1h" or "0", or -1)')
    seconds = sum(float(n) * _SECONDS[unit] for n, unit in _DURATION_PART.findall(text))
    return -seconds if text.startswith("-") else seconds


def _checked_keep_alive(value: Any) -> Any:
    keep_alive_seconds(value)
    return value


def _input_texts(value: Any) -> str | list[str]:
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(item, str) for item in value)):
        return value
    raise ValueError("invalid input type: input must be a string or a list of strings")


Think = Annotated[Any, AfterValidator(think_value)]  # None, a boolean or a level
KeepAlive = Annotated[Any, AfterValidator(_checked_keep_alive)]  # seconds, or a duration string


class ToolCallFunction(OllamaBody):
    name: str
    arguments: Any = None  # Ollama's is an object; JSON text is taken too (checked where it is read)


class ToolCall(OllamaBody):
    function: ToolCallFunction
    id: str | None = None


class Message(OllamaBody):
    role: str
    content: str | None = None
    thinking: str | None = None
    images: list[Any] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None  # a "tool" message: the tool that answered
    tool_call_id: str | None = None

    @field_validator("role")
    @classmethod
    def _lowercase(cls, role: str) -> str:  # as Ollama's Message.UnmarshalJSON
        if not role.strip():  # as a missing role: no template has a turn for it
            raise ValueError("role must not be empty")
        return role.lower()


class GenerationBase(OllamaBody):
    model: str
    stream: bool = True  # Ollama streams unless told not to
    options: dict[str, Any] | None = None
    format: Any = None  # "json" or a JSON schema: checked where it becomes a constraint
    keep_alive: KeepAlive = None  # accepted: llmp keeps its one model loaded
    think: Think = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    template: str | None = None
    truncate: bool | None = None  # false: a prompt longer than the window is a 400, not cut (nor messages dropped)
    # Ollama shifts the context to generate past the window; llmp never does: a reply ends there (length)
    shift: bool | None = None
    debug_render_only: bool = Field(False, alias="_debug_render_only")  # the rendered prompt, nothing generated

    @field_validator("stream", mode="before")
    @classmethod
    def _stream_default(cls, value: Any) -> Any:
        return True if value is None else value


class ChatRequest(GenerationBase):
    messages: list[Message] | None = None
    tools: list[dict[str, Any]] | None = None
    # llmp's extension (OpenAI's shape): Ollama has no tool_choice, its tools are always "auto"
    tool_choice: Any = None


class GenerateRequest(GenerationBase):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[Any] | None = None


class EmbedRequest(OllamaBody):
    model: str
    input: Annotated[Any, AfterValidator(_input_texts)] = ""
    truncate: bool = True
    dimensions: int | None = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class EmbeddingsRequest(OllamaBody):
    """The older ``/api/embeddings``: one prompt, one vector."""

    model: str
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class ShowRequest(OllamaBody):
    model: str | None = None
    name: str | None = None  # older clients send "name"
    verbose: bool | None = None


class ModelRequest(OllamaBody):
    """The body of a model-management route (/api/pull, /api/delete ...): the name it is about."""

    model: str | None = None
    name: str | None = None
    source: str | None = None
    stream: bool | None = None


async def read_body(request: Request, kind: type[Body]) -> Body:
    """The request's JSON body as ``kind``; a 400 in one line when it is missing or does not validate."""
    raw = await request.body()
    if not raw.strip():
        raise bad_request("missing request body")
    try:
        return kind.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        param = ".".join(str(p) for p in errors[0]["loc"]) or None
        raise bad_request("; ".join(dict.fromkeys(error_line(e) for e in errors)), param) from None


def error_line(error: dict[str, Any]) -> str:
    """One pydantic error as Ollama-style text: ``stream: must be a boolean, got "no"``."""
    where = ".".join(str(p) for p in error["loc"])
    kind = error["type"]
    if kind == "value_error":  # our validators' messages say it all
        return str(error["ctx"]["error"])
    if kind == "json_invalid":
        return f"invalid JSON: {error['ctx']['error']}"
    if kind == "missing":
        return f"{where} is required"
    message = error["msg"].replace("Input should be", "must be")
    given = json.dumps(error.get("input"), default=str)
    return f"{where or 'body'}: {message}, got {given if len(given) <= 40 else given[:37] + '...'}"
