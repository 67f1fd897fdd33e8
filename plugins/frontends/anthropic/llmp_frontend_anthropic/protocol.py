"""Request bodies of the Anthropic Messages API (what this server reads of them).

Unknown top-level fields (``service_tier``, ``container``, ``context_management`` ...) are accepted,
as clients such as Claude Code send fields a server need not act on, and named in a warning in the
server's log, as the OpenAI front-end does, as are unknown keys of ``thinking``, ``output_config``
(``effort``, a hint) and of a tool (``strict``); a ``cache_control`` needs no act (the prefix
cache keeps every prompt's blocks).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

log = logging.getLogger("llmp.frontend.anthropic")


class ContentBlock(BaseModel):
    """A content block: ``text``, ``tool_use``, ``tool_result`` (others are refused or skipped)."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None
    # tool_use
    id: str | None = None
    name: str | None = None
    input: Any = None
    # tool_result
    tool_use_id: str | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    # "system" is not Anthropic's, but clients (Claude Code) send it; it joins the system prompt
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom", or a server tool type (refused)

    def ignored(self) -> list[str]:
        return [name for name in self.model_extra or () if name != "cache_control"]


class Thinking(BaseModel):
    """Extended thinking: ``enabled`` (with ``budget_tokens``, at least 1024 and below ``max_tokens``),
    ``disabled``, ``between_tools`` (thinking off) or ``adaptive`` (the model decides); ``display``
    ``summarized`` or ``omitted``. The values are checked by the front-end (a 400 naming them); other
    keys are accepted and named in the warning of ignored fields."""

    model_config = ConfigDict(extra="allow")

    type: str
    budget_tokens: StrictInt | None = None
    display: str | None = None


class OutputConfig(BaseModel):
    """``output_config``: ``format`` (``{"type": "json_schema", "schema": {...}}``) constrains the answer;
    ``effort`` (a hint) and other keys are named in the warning of ignored fields."""

    model_config = ConfigDict(extra="allow")

    format: dict[str, Any] | None = None


class MessagesBase(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[Message]
    system: str | list[ContentBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    output_format: dict[str, Any] | None = None  # the structured-outputs beta's name of output_config.format
    # llmp's (and vLLM's) extension: variables of the chat template
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _warn_of_ignored_fields(self) -> MessagesBase:
        ignored = sorted(self.model_extra or ())
        ignored += [f"thinking.{name}" for name in sorted((self.thinking and self.thinking.model_extra) or ())]
        config = self.output_config
        ignored += [f"output_config.{name}" for name in sorted((config and config.model_extra) or ())]
        ignored += sorted({f"tools.{name}" for tool in self.tools or () for name in tool.ignored()})
        if ignored:
            log.warning("The following fields were present in the request but ignored: %s", ", ".join(ignored))
        return self


class MessagesRequest(MessagesBase):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None


class CountTokensRequest(MessagesBase):
    pass
