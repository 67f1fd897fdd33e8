"""The Anthropic front-end: ``POST /v1/messages`` (whole or streamed) and ``POST /v1/messages/count_tokens``.

Requests become a conversation for the chat template (``FrontendKit.conversation_prompt``) and
sampling parameters for the engine; every error on ``/v1/messages...`` is rendered in Anthropic's
shape ``{"type": "error", "error": {"type", "message"}}``, overload as 529 ``overloaded_error``.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import replace
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from llmp import Prompt, SamplingParams, StructuredOutputsParams
from llmp.frontend import (
    APIError,
    FrontendKit,
    OutputPlan,
    SamplingRequest,
    as_api_error,
    bad_request,
    engine_request_id,
    json_text,
    until_disconnected,
)
from llmp_frontend_anthropic import protocol as p

ERROR_PATHS = ("/v1/messages",)
log = logging.getLogger("llmp.frontend.anthropic")

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors)
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
OVERLOADED = 529


def anthropic_error(error: APIError) -> tuple[int, dict[str, Any]]:
    """``(status, body)`` of an error in Anthropic's shape.

    The gate's overload refusal (code ``"overloaded"``, 503 or 429) becomes 529 ``overloaded_error``,
    a request timeout 504 ``timeout_error``; other statuses keep their number."""
    status = error.status
    if error.code == "overloaded":
        status = OVERLOADED
    elif status == 408:
        status = 504
    kind = _TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    message = re.sub(r" at 0x[0-9a-fA-F]+", "", error.message)
    return status, {"type": "error", "error": {"type": kind, "message": message}}


MIN_THINKING_BUDGET = 1024  # the Messages API's least budget_tokens
# between_tools: thinking off, the model's short notes between tool calls as thinking blocks; here thinking off
THINKING_TYPES = ("enabled", "disabled", "adaptive", "between_tools")
THINKING_DISPLAYS = ("summarized", "omitted")


def check_thinking(body: p.MessagesBase) -> p.Thinking | None:
    """The request's ``thinking``, held to the Messages API's rules (a 400 otherwise)."""
    thinking = body.thinking
    if thinking is None:
        return None
    if thinking.type not in THINKING_TYPES:
        raise bad_request(
            f"thinking.type must be one of {', '.join(THINKING_TYPES)}; got {thinking.type!r}", "thinking.type"
        )
    if thinking.display not in (None, *THINKING_DISPLAYS):
        raise bad_request(
            f"thinking.display must be one of {', '.join(THINKING_DISPLAYS)}; got {thinking.display!r}",
            "thinking.display",
        )
    budget = thinking.budget_tokens
    if thinking.type != "enabled":
        if budget is not None:
            raise bad_request(f"thinking.budget_tokens is only for thinking of type enabled, not {thinking.type}")
        return thinking
    if budget is None:
        raise bad_request("thinking.enabled.budget_tokens: Field required", "thinking.budget_tokens")
    if budget < MIN_THINKING_BUDGET:
        raise bad_request(
            f"thinking.enabled.budget_tokens: Input should be greater than or equal to {MIN_THINKING_BUDGET}",
            "thinking.budget_tokens",
        )
    max_tokens = getattr(body, "max_tokens", None)  # count_tokens has none
    if max_tokens is not None and budget >= max_tokens:
        raise bad_request("`max_tokens` must be greater than `thinking.budget_tokens`", "max_tokens")
    return thinking


def output_format(body: p.MessagesBase) -> StructuredOutputsParams | None:
    """The JSON-schema constraint of ``output_config.format`` (or the structured-outputs beta's
    top-level ``output_format``): ``{"type": "json_schema", "schema": {...}}``."""
    given = body.output_config.format if body.output_config is not None else None
    if given is not None and body.output_format is not None:
        raise bad_request("give either output_config.format or output_format, not both", "output_config.format")
    param = "output_config.format" if given is not None else "output_format"
    given = given if given is not None else body.output_format
    if given is None:
        return None
    if given.get("type") != "json_schema":
        raise bad_request(f"{param}.type must be json_schema, got {given.get('type')!r}", param)
    if not isinstance(given.get("schema"), dict):
        raise bad_request(f"{param}.schema must be a JSON schema (an object)", param)
    if (body.tool_choice or {}).get("type") in ("any", "tool"):
        raise bad_request(f"{param} cannot be combined with tool_choice {body.tool_choice['type']}", param)
    return StructuredOutputsParams(json=given["schema"])


def _has_text(content: Any) -> bool:
    """Whether a turn's content (text, or a list of text parts) holds any text."""
    if isinstance(content, str):
        return bool(content)
    return any(isinstance(part, Mapping) and part.get("text") for part in content or ())


def sse(event: str, payload: Mapping[str, Any]) -> str:
    return f"event: {event}\ndata: {json_text(payload)}\n\n"


class AnthropicFrontend(FrontendKit):
    """Thin translators between Anthropic's Messages API and the engine client."""

    error_paths = ERROR_PATHS
    fallback_paths = ("/v1/models", "/v1/models/{model_id:path}")  # the OpenAI front-end's, when it is mounted

    @staticmethod
    def render_error(error: APIError) -> tuple[int, dict[str, Any]]:
        return anthropic_error(error)  # static: it shapes the server's refusals while the model loads too

    def http_router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/v1/models", self.list_models, methods=["GET"], summary="Served models (Anthropic)")
        router.add_api_route(
            "/v1/models/{model_id:path}", self.retrieve_model, methods=["GET"], summary="One served model (Anthropic)"
        )
        if self.task == "generate":
            router.add_api_route(
                "/v1/messages",
                self.create_message,
                methods=["POST"],
                summary="Create a message (Anthropic Messages API)",
            )
            router.add_api_route(
                "/v1/messages/count_tokens",
                self.count_tokens,
                methods=["POST"],
                summary="Count the tokens of a message request (Anthropic API)",
            )
        return router

    async def serve(self) -> None:  # HTTP only: the shared server runs the routes
        return None

    # -- routes ----------------------------------------------------------------

    async def create_message(self, body: p.MessagesRequest, request: Request) -> Any:
        return await MessageRun(self, body, request).run()

    async def list_models(
        self, limit: int = Query(20, ge=1, le=1000), after_id: str | None = None, before_id: str | None = None
    ) -> dict[str, Any]:
        """Anthropic's List Models: the served names and adapters, a page of ``limit`` after ``after_id``
        (or before ``before_id``)."""
        models = [self._model_object(card) for card in self.model_cards()]
        ids = [model["id"] for model in models]
        start, end = 0, len(models)
        if after_id is not None:
            start = ids.index(after_id) + 1 if after_id in ids else end
        elif before_id is not None:
            end = ids.index(before_id) if before_id in ids else 0
            start = max(end - limit, 0)
        page = models[start : min(start + limit, end)]
        return {
            "data": page,
            "has_more": start + len(page) < end if before_id is None else start > 0,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
        }

    async def retrieve_model(self, model_id: str) -> dict[str, Any]:
        card = next((card for card in self.model_cards() if card["id"] == model_id), None)
        if card is None:
            raise APIError(404, f"model: {model_id}", param="model")
        return self._model_object(card)

    def _model_object(self, card: Mapping[str, Any]) -> dict[str, Any]:
        created = datetime.fromtimestamp(card["created"], timezone.utc).isoformat().replace("+00:00", "Z")
        return {"type": "model", "id": card["id"], "display_name": card["id"], "created_at": created}

    async def count_tokens(self, body: p.CountTokensRequest) -> dict[str, int]:
        prompt = await self.prompt(body)
        return {"input_tokens": len(prompt.token_ids)}

    # -- shared conversions ---------------------------------------------------------

    def check_model(self, name: str | None) -> None:
        if not name:  # the Messages API requires it (vLLM's too): no silent default model
            served = ", ".join(card["id"] for card in self.model_cards())
            raise bad_request(f"model: Field required (this server serves: {served})", "model")
        if not self.is_served(name):  # FrontendKit's check (LoRA adapters included), Anthropic's wording
            served = ", ".join(card["id"] for card in self.model_cards())
            raise APIError(404, f"model: {name} (this server serves: {served})", param="model")

    async def prompt(self, body: p.MessagesBase) -> Prompt:
        """The engine's prompt: the rendered conversation and its token ids. ``thinking`` turns the chat
        template's ``enable_thinking`` on or off (``adaptive``: the template's default). A conversation
        ending with an assistant turn is a prefill: the reply continues it (no new assistant turn)."""
        self.check_model(body.model)
        if not body.messages:
            raise bad_request("messages: at least one message is required", "messages")
        thinking = check_thinking(body)
        tools, _ = self.tools(body)
        variables = {}
        if thinking is not None and thinking.type != "adaptive":
            variables["enable_thinking"] = thinking.type == "enabled"
        turns = conversation(body)
        try:  # JSON may carry a lone surrogate ("\ud800"), which no tokenizer takes
            json.dumps([turns, tools], ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise bad_request("messages: the text is not valid Unicode (a lone surrogate)", "messages") from None
        last = turns[-1]
        prefill = last["role"] == "assistant" and not last.get("tool_calls") and _has_text(last["content"])
        rendering = SimpleNamespace(  # what the kit reads of the body to render: no extra field of the client's
            chat_template_kwargs=body.chat_template_kwargs,
            add_generation_prompt=not prefill,
            continue_final_message=prefill,
        )
        return await self.conversation_prompt(turns, rendering, tools=tools, variables=variables)

    def thinking_budget(self, body: p.MessagesRequest, prompt_ids: list[int]) -> tuple[int | None, Any]:
        """``thinking.budget_tokens`` as the engine's ``thinking_token_budget`` and the reasoning parser's
        markers it counts with. A server without ``--reasoning-parser`` cannot tell thinking from the
        answer: the budget is not applied, and the log says so (clients such as Claude Code send it to
        any model, so it is no error)."""
        thinking = body.thinking
        if thinking is None or thinking.type != "enabled":
            return None, None
        if self.reasoning_parser is None:
            log.warning(
                "thinking.budget_tokens=%d not applied: the server has no --reasoning-parser to tell the "
                "model's thinking from its answer",
                thinking.budget_tokens,
            )
            return None, None
        return thinking.budget_tokens, self.reasoning_markers(prompt_ids, "thinking.budget_tokens")

    def tools(self, body: p.MessagesBase) -> tuple[list[dict[str, Any]] | None, Any]:
        """The tools as OpenAI function tools (for the chat template) and the OpenAI ``tool_choice``:
        ``any`` is ``required``, ``tool`` a named function; ``auto`` (the default) lets the model call
        tools when the server parses them (--enable-auto-tool-choice), else the reply is text."""
        tools = _tools(body)
        kind = (body.tool_choice or {}).get("type", "auto")
        if not tools or kind == "none":
            return tools, "none" if tools else None
        if kind == "any":
            return tools, "required"
        if kind == "tool":
            return tools, {"type": "function", "function": {"name": body.tool_choice.get("name")}}
        return tools, "auto" if self.auto_tools else "none"

    def sampling_params(
        self,
        body: p.MessagesRequest,
        prompt_ids: list[int],
        constraint: StructuredOutputsParams | None = None,
        skip_special_tokens: bool = True,
    ) -> SamplingParams:
        """The engine's sampling parameters (the kit's one path, under Anthropic's field names)."""
        budget, markers = self.thinking_budget(body, prompt_ids)
        request = SamplingRequest.from_body(
            body,
            stop=body.stop_sequences or None,
            structured_outputs=constraint,
            skip_special_tokens=skip_special_tokens,
            thinking_token_budget=budget,
            reasoning_markers=markers,
            names={"stop": "stop_sequences", "thinking_token_budget": "thinking.budget_tokens"},
        )
        return super().sampling_params(request, len(prompt_ids))


class MessageRun:
    """One ``/v1/messages`` request: validated and tokenized in ``run``, then answered whole or streamed."""

    def __init__(self, fe: AnthropicFrontend, body: p.MessagesRequest, request: Request) -> None:
        self.fe, self.body, self.request = fe, body, request
        self.id = f"msg_{uuid.uuid4().hex}"  # unique and opaque, whatever the client's X-Request-Id
        self.model = body.model or fe.model_name
        self.omit_thinking = body.thinking is not None and body.thinking.display == "omitted"

    async def run(self) -> Any:
        fe, body = self.fe, self.body
        self.lora = await fe.lora_for(body.model)
        if self.lora is not None:  # an adapter answers under its own name (a base alias is echoed as sent)
            self.model = fe.response_model(self.lora)
        prompt = await fe.prompt(body)
        self.prompt_ids = prompt.token_ids
        tools, tool_choice = fe.tools(body)
        parallel = not (body.tool_choice or {}).get("disable_parallel_tool_use", False)
        constraint = output_format(body)
        param = "output_format" if body.output_format else "output_config.format" if constraint else "tool_choice"
        self.plan, constraint = fe.output_plan(
            self.prompt_ids, tools, tool_choice, parallel_tool_calls=parallel, constraint=constraint
        )
        await fe.check_constraint(constraint, param)
        self.params = fe.sampling_params(body, self.prompt_ids, constraint, fe.skip_special_tokens(self.plan))
        self.outputs = fe.engine.generate(
            prompt,
            self.params,
            engine_request_id("msg"),
            lora_request=self.lora,
            delta=body.stream,
        )
        if body.stream:
            return StreamingResponse(
                self.stream(),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return JSONResponse(await until_disconnected(self.request, self.whole()))

    async def whole(self) -> dict[str, Any]:
        final = None
        async for final in self.outputs:
            pass
        seq = final.outputs[0]
        blocks = BlockStream(self.plan, self.omit_thinking)
        list(blocks.feed(seq.text, final=True))
        stop_reason, stop_sequence = _stop_reason(seq, blocks)
        if stop_reason == "stop_sequence" and blocks.called:  # a call cut by the stop string: its text, not a call
            blocks = BlockStream(replace(self.plan, tool_parser=None), self.omit_thinking)
            list(blocks.feed(seq.text, final=True))
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": blocks.content(),
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": self.usage(len(seq.token_ids), final.num_cached_tokens),
        }

    def usage(self, output_tokens: int, cached_tokens: int | None) -> dict[str, int]:
        """Anthropic's usage. With ``--enable-prompt-tokens-details`` (vLLM's flag) the prompt tokens read
        from the prefix cache are ``cache_read_input_tokens`` and, as Anthropic counts them, not part of
        ``input_tokens``."""
        if cached_tokens is None or not self.fe.options.enable_prompt_tokens_details:
            return {"input_tokens": len(self.prompt_ids), "output_tokens": output_tokens}
        return {
            "input_tokens": len(self.prompt_ids) - cached_tokens,
            "cache_read_input_tokens": cached_tokens,
            "output_tokens": output_tokens,
        }

    async def stream(self) -> AsyncIterator[str]:
        generated, text, cached = 0, "", None
        blocks = BlockStream(self.plan, self.omit_thinking)
        try:
            outputs = aiter(self.outputs)
            first = None
            if self.fe.options.enable_prompt_tokens_details:  # the cache's share is known once the prompt ran
                first = await anext(outputs, None)
                cached = first.num_cached_tokens if first is not None else None
            start = {
                "id": self.id,
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": self.usage(0, cached),
            }
            yield sse("message_start", {"type": "message_start", "message": start})
            for event in blocks.start():
                yield event
            yield sse("ping", {"type": "ping"})
            seq = None
            async for output in _after(first, outputs):
                seq = output.outputs[0]
                generated += len(seq.token_ids)
                text += seq.text
                for event in blocks.feed(text, final=seq.finish_reason is not None):
                    yield event
            for event in blocks.close():
                yield event
            stop_reason, stop_sequence = _stop_reason(seq, blocks)
            yield sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": self.usage(generated, cached) if cached is not None else {"output_tokens": generated},
                },
            )
            yield sse("message_stop", {"type": "message_stop"})
        except Exception as exc:  # noqa: BLE001  (after the headers, the error travels in the stream)
            yield sse("error", anthropic_error(as_api_error(exc))[1])


async def _after(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """``first`` (when there is one), then the rest of the outputs."""
    if first is not None:
        yield first
    async for output in rest:
        yield output


class BlockStream:
    """Anthropic content blocks (thinking, text, tool_use) from a completion's text, as SSE events.

    The text is split by the request's parsers (``OutputPlan.message_stream``); a block opens with
    its first piece and closes when another kind of piece comes. Without parsers there is one text
    block, opened at once, as Anthropic's own stream does. ``omit_thinking`` (``thinking.display:
    omitted``): thinking blocks keep their signature but not their text.
    """

    def __init__(self, plan: OutputPlan, omit_thinking: bool = False) -> None:
        self.parsed = plan.reasoning_parser is not None or plan.tool_parser is not None
        self.stream = plan.message_stream() if self.parsed else None
        self.omit_thinking = omit_thinking
        self.blocks: list[dict[str, Any]] = []
        self.open: int | None = None
        self.text = ""

    @property
    def called(self) -> bool:
        return any(block["type"] == "tool_use" for block in self.blocks)

    @property
    def calls_complete(self) -> bool:
        """Whether every tool call was whole when the text ended (none was cut short: the message
        stream's ``calls_whole``, which also catches a lenient parser closing a cut call)."""
        return self.stream is None or self.stream.calls_whole

    def start(self) -> Iterator[str]:
        if not self.parsed:
            yield from self._open({"type": "text", "text": ""})

    def feed(self, text: str, final: bool) -> Iterator[str]:
        if self.stream is None:
            new, self.text = text[len(self.text) :], text
            if not self.blocks:
                yield from self._open({"type": "text", "text": ""})
            if new:
                yield from self._delta("text", {"type": "text_delta", "text": new}, new)
            return
        piece = self.stream.feed(text, final)
        if piece.reasoning:
            yield from self._delta("thinking", {"type": "thinking_delta", "thinking": piece.reasoning}, piece.reasoning)
        if piece.content:
            yield from self._delta("text", {"type": "text_delta", "text": piece.content}, piece.content)
        for call in piece.tool_calls:
            if call.name is not None:
                yield from self._close()
                block_id = f"toolu_{uuid.uuid4().hex[:24]}"
                yield from self._open({"type": "tool_use", "id": block_id, "name": call.name, "input": {}})
            if call.arguments:
                yield from self._delta(
                    "tool_use", {"type": "input_json_delta", "partial_json": call.arguments}, call.arguments
                )

    def close(self) -> Iterator[str]:
        if not self.blocks:  # an empty reply is one empty text block
            yield from self._open({"type": "text", "text": ""})
        yield from self._close()

    def content(self) -> list[dict[str, Any]]:
        """The blocks of the whole message."""
        if not self.blocks:
            return [{"type": "text", "text": ""}]
        out = []
        for block in self.blocks:
            entry = {k: v for k, v in block.items() if k != "json"}
            if entry["type"] == "tool_use":
                entry["input"] = _tool_input(block.get("json", ""))
            out.append(entry)
        return out

    def _delta(self, kind: str, delta: dict[str, Any], text: str) -> Iterator[str]:
        if self.open is None or self.blocks[self.open]["type"] != kind:
            yield from self._close()
            if kind == "thinking":
                yield from self._open({"type": "thinking", "thinking": "", "signature": ""})
                self.blocks[self.open]["signature"] = uuid.uuid4().hex  # sent when the block ends
            else:
                yield from self._open({"type": "text", "text": ""})
        block = self.blocks[self.open]
        if kind == "thinking" and self.omit_thinking:
            return
        field = {"thinking": "thinking", "text": "text", "tool_use": "json"}[kind]
        block[field] = block.get(field, "") + text
        yield sse("content_block_delta", {"type": "content_block_delta", "index": self.open, "delta": delta})

    def _open(self, block: dict[str, Any]) -> Iterator[str]:
        self.blocks.append(block)
        self.open = len(self.blocks) - 1
        yield sse(
            "content_block_start",
            {"type": "content_block_start", "index": self.open, "content_block": {k: v for k, v in block.items()}},
        )

    def _close(self) -> Iterator[str]:
        if self.open is None:
            return
        if self.blocks[self.open]["type"] == "thinking":  # clients expect a signature before a thinking block ends
            yield sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": self.open,
                    "delta": {"type": "signature_delta", "signature": self.blocks[self.open]["signature"]},
                },
            )
        yield sse("content_block_stop", {"type": "content_block_stop", "index": self.open})
        self.open = None


def _tool_input(arguments: str) -> Any:
    """A tool call's arguments as the ``input`` object; a call cut off by max_tokens gives what parses."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        from partial_json_parser import loads as partial_loads

        try:
            value = partial_loads(arguments)
        except Exception:  # noqa: BLE001  (nothing usable was generated)
            value = {}
    return value if isinstance(value, dict) else {}


# -- conversions --------------------------------------------------------------------


def conversation(body: p.MessagesBase) -> list[dict[str, Any]]:
    """``system`` and the messages as chat-template messages (OpenAI's shape: tool calls as
    ``tool_calls`` of the assistant, tool results as ``tool`` messages)."""
    system = [_system_text(body.system)] if body.system else []
    turns: list[dict[str, Any]] = []
    for index, message in enumerate(body.messages):
        if message.role == "system":  # Claude Code sends these; they add to the system prompt
            system.append(_system_text(message.content))
            continue
        if isinstance(message.content, str):
            turns.append({"role": message.role, "content": message.content})
            continue
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for block in message.content:
            kind = block.type
            if kind == "text":
                texts.append(block.text or "")
            elif kind == "tool_use" and message.role == "assistant":
                calls.append(
                    {
                        "id": block.id or "",
                        "type": "function",
                        "function": {"name": block.name or "", "arguments": block.input or {}},
                    }
                )
            elif kind == "tool_result" and message.role == "user":
                text = _result_text(block, index)
                if block.is_error:  # the model is told the call failed (Anthropic's is_error)
                    text = f"Tool error: {text}" if text else "Tool error"
                results.append({"role": "tool", "tool_call_id": block.tool_use_id or "", "content": text})
            elif kind in ("thinking", "redacted_thinking") and message.role == "assistant":
                continue  # earlier reasoning is not fed back
            else:
                raise bad_request(
                    f"messages.{index}.content: content blocks of type {kind!r} are not supported "
                    f"in {message.role} messages by this server (it takes text, tool_use and "
                    "tool_result)",
                    "messages",
                )
        turns.extend(results)  # tool results answer the previous assistant turn: they come first
        if texts or calls or not results:
            # text blocks as text parts: the template gets them as --chat-template-content-format says
            turn: dict[str, Any] = {"role": message.role, "content": [{"type": "text", "text": t} for t in texts]}
            if calls:
                turn["tool_calls"] = calls
            turns.append(turn)
    system = [text for text in system if text]
    if system:
        turns.insert(0, {"role": "system", "content": "\n".join(system)})
    return turns


# Claude Code's first system block: a hash that changes with every request would defeat the prefix cache
# for the whole prompt after it, and tells the model nothing (vLLM drops it too)
BILLING_HEADER = "x-anthropic-billing-header"


def _system_text(system: str | list[p.ContentBlock]) -> str:
    if isinstance(system, str):
        return "" if system.startswith(BILLING_HEADER) else system
    for block in system:
        if block.type != "text":
            raise bad_request(f"system: blocks of type {block.type!r} are not supported; use text blocks", "system")
    return "\n".join(block.text or "" for block in system if not (block.text or "").startswith(BILLING_HEADER))


def _result_text(block: p.ContentBlock, index: int) -> str:
    content = block.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") != "text":
            raise bad_request(
                f"messages.{index}.content: tool_result content of type {part.get('type')!r} "
                "is not supported; use text",
                "messages",
            )
        parts.append(str(part.get("text", "")))
    return "\n".join(parts)


def _tools(body: p.MessagesBase) -> list[dict[str, Any]] | None:
    """Anthropic tools as OpenAI function tools for the chat template; forcing a tool is refused."""
    choice = body.tool_choice or {}
    kind = choice.get("type", "auto")
    if kind not in ("auto", "any", "tool", "none"):
        raise bad_request(f"tool_choice.type must be one of auto, any, tool, none; got {kind!r}", "tool_choice")
    if body.tool_choice is not None and kind != "none" and not body.tools:
        raise bad_request("tool_choice needs tools", "tool_choice")
    if kind == "tool" and choice.get("name") not in {t.name for t in body.tools or []}:
        raise bad_request(
            f"tool_choice names the tool {choice.get('name')!r}, which is not among the tools", "tool_choice"
        )
    if not body.tools:
        return None
    tools = []
    for tool in body.tools:
        if tool.type not in (None, "custom"):
            raise bad_request(
                f"tools: server tools ({tool.type!r}) are not supported; give custom tools with "
                "name, description and input_schema",
                "tools",
            )
        function = {"name": tool.name, "parameters": tool.input_schema or {"type": "object", "properties": {}}}
        if tool.description is not None:
            function["description"] = tool.description
        tools.append({"type": "function", "function": function})
    return tools


def _stop_reason(seq: Any, blocks: BlockStream) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` from the engine's finish and stop reasons. A
    matched stop string wins over tool calls unless every call is whole (as vLLM): one it cut short
    must not run."""
    if seq is None or seq.finish_reason == "length":
        return "max_tokens", None
    if isinstance(seq.stop_reason, str) and not (blocks.called and blocks.calls_complete):
        return "stop_sequence", seq.stop_reason
    if blocks.called and blocks.calls_complete:  # a call the end of the text cut short must not run
        return "tool_use", None
    return "end_turn", None
