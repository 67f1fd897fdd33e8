"""Request bodies of Ollama's API (what this server reads of them).

Unknown top-level fields are accepted and ignored, as Ollama does; ``options`` is read field by field
in :mod:`llmp_frontend_ollama.options`, where an option llmp cannot honour is refused.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

# Ollama's "think": on/off, or an effort level (gpt-oss)
Think = bool | Literal["low", "medium", "high"]


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    arguments: dict[str, Any] | str | None = None  # Ollama's is an object; JSON text is taken too


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    function: ToolCallFunction
    id: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | None = None
    thinking: str | None = None
    images: list[Any] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None  # a "tool" message: the tool that answered
    tool_call_id: str | None = None


class GenerationBase(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    stream: bool = True  # Ollama streams unless told not to
    options: dict[str, Any] | None = None
    format: str | dict[str, Any] | None = None
    keep_alive: float | str | None = None  # accepted: llmp keeps its one model loaded
    think: Think | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    template: str | None = None


class ChatRequest(GenerationBase):
    messages: list[Message] | None = None
    tools: list[dict[str, Any]] | None = None
    # llmp's extension (OpenAI's shape): Ollama has no tool_choice, its tools are always "auto"
    tool_choice: str | dict[str, Any] | None = None


class GenerateRequest(GenerationBase):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[Any] | None = None


class EmbedRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[str] = ""
    truncate: bool = True
    dimensions: int | None = None
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None


class EmbeddingsRequest(BaseModel):
    """The older ``/api/embeddings``: one prompt, one vector."""

    model_config = ConfigDict(extra="allow")

    model: str
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None


class ShowRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    name: str | None = None  # older clients send "name"
    verbose: bool = False


class ModelRequest(BaseModel):
    """The body of a model-management route (/api/pull, /api/delete ...): the name it is about."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    name: str | None = None
    source: str | None = None
    stream: bool | None = None
