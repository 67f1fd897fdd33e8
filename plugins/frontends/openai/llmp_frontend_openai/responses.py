"""The Responses API: ``POST /v1/responses`` (whole or streamed as typed events) on the chat machinery.

With ``--enable-store`` results are kept in memory (the most recent
``STORE_SIZE``), which enables ``GET /v1/responses/{id}``,
``previous_response_id``, ``background`` and ``POST /v1/responses/{id}/cancel``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from llmp.server.app import until_disconnected
from llmp.server.errors import APIError, bad_request, error_body
from llmp_frontend_openai import protocol as p
from llmp.server.frontend_kit import engine_request_id, json_text

if TYPE_CHECKING:
    from llmp_frontend_openai.frontend import OpenAIFrontend

STORE_SIZE = 1024


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> None:
    store = ResponseStore(STORE_SIZE) if fe.options.get("enable_store") else None

    async def create_response(body: p.ResponsesRequest, request: Request) -> Any:
        run = await ResponseRun.prepare(fe, body, store)
        if body.stream:
            return StreamingResponse(run.events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        if body.background:
            run.task = asyncio.create_task(run.finish())
            return run.snapshot()
        return await until_disconnected(request, run.finish())

    async def retrieve_response(response_id: str) -> Any:
        return _stored(store, response_id).snapshot()

    async def cancel_response(response_id: str) -> Any:
        run = _stored(store, response_id)
        if run.task is None or run.task.done():
            raise bad_request("Cannot cancel a response that is not running in the background.", "response_id")
        run.task.cancel()
        try:
            await run.task
        except asyncio.CancelledError:
            pass
        run.status = "cancelled"
        return run.snapshot()

    router.add_api_route("/v1/responses", create_response, methods=["POST"], summary="Create a response")
    router.add_api_route("/v1/responses/{response_id}", retrieve_response, methods=["GET"],
                         summary="Retrieve a stored response (--enable-store)")
    router.add_api_route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"],
                         summary="Cancel a background response (--enable-store)")


class ResponseStore:
    """The most recent responses, in memory; the oldest are forgotten first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.runs: OrderedDict[str, ResponseRun] = OrderedDict()

    def put(self, run: ResponseRun) -> None:
        self.runs[run.id] = run
        self.runs.move_to_end(run.id)
        while len(self.runs) > self.size:
            self.runs.popitem(last=False)

    def get(self, response_id: str) -> ResponseRun | None:
        return self.runs.get(response_id)


def _stored(store: ResponseStore | None, response_id: str) -> ResponseRun:
    run = store.get(response_id) if store is not None else None
    if run is None:
        raise APIError(404, f"Response with id '{response_id}' not found.", param="response_id")
    return run


class ResponseRun:
    """One response: its conversation, its generation, and the state GET and cancel read."""

    def __init__(self, fe: OpenAIFrontend, body: p.ResponsesRequest, store: ResponseStore | None) -> None:
        self.fe, self.body, self.store = fe, body, store
        self.id = f"resp_{uuid.uuid4().hex}"
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.status = "queued" if body.background else "in_progress"
        self.text = ""
        self.output_tokens = 0
        self.finish_reason: str | None = None
        self.task: asyncio.Task | None = None
        self.messages: list[dict[str, Any]] = []

    @classmethod
    async def prepare(cls, fe: OpenAIFrontend, body: p.ResponsesRequest, store: ResponseStore | None) -> ResponseRun:
        fe.check_model(body.model)
        fe.check_unsupported(body)
        if (body.text or {}).get("format", {}).get("type", "text") != "text":
            raise bad_request("structured outputs (text.format) are not supported by this server yet", "text")
        if body.tool_choice not in (None, "none", "auto") or (body.tool_choice == "auto" and body.tools):
            raise bad_request("tool calls need a tool-call parser (--tool-call-parser), which this server was "
                              "not started with", "tool_choice")
        if body.background and store is None:
            raise bad_request("background responses need the response store (start with --enable-store)",
                              "background")
        if body.background and body.stream:
            raise bad_request("background and stream cannot both be true", "background")
        run = cls(fe, body, store)
        run.messages = _history(store, body.previous_response_id) + _input_messages(body)
        conversation = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + run.messages
        text, run.prompt_ids = await fe.chat_prompt([p.ChatMessage(**m) for m in conversation], body)
        max_tokens = fe.resolve_max_tokens(body.max_output_tokens, len(run.prompt_ids))
        top_logprobs = getattr(body, "top_logprobs", None)
        limit = fe.options.get("max_logprobs", 20)
        if top_logprobs is not None and limit >= 0 and top_logprobs > limit:  # held to the cap chat has
            raise bad_request(f"top_logprobs={top_logprobs} exceeds the server's limit of {limit} (--max-logprobs)",
                              "top_logprobs")
        run.params = fe.sampling_params(body, max_tokens, None)
        if run.params.n != 1:
            raise bad_request("n is not a field of the Responses API", "n")
        run.outputs = fe.engine.generate({"prompt": text, "prompt_token_ids": run.prompt_ids}, run.params,
                                         engine_request_id("resp"), priority=body.priority, delta=True)
        if store is not None and body.store:
            store.put(run)
        return run

    async def finish(self) -> dict[str, Any]:
        async for _ in self._generate():
            pass
        return self.snapshot()

    async def _generate(self) -> AsyncIterator[str]:
        self.status = "in_progress"
        try:
            async for output in self.outputs:
                seq = output.outputs[0]
                self.output_tokens += len(seq.token_ids)
                self.text += seq.text
                if seq.finish_reason:
                    self.finish_reason = seq.finish_reason
                if seq.text:
                    yield seq.text
        except asyncio.CancelledError:
            self.status = "cancelled"
            raise
        except Exception:
            self.status = "failed"
            raise
        self.status = "incomplete" if self.finish_reason == "length" else "completed"
        self.messages.append({"role": "assistant", "content": self.text})

    # -- the response object -------------------------------------------------------

    def _message(self, status: str) -> dict[str, Any]:
        content = [self._part()] if status == "completed" else []
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": content}

    def _part(self, text: str | None = None) -> dict[str, Any]:
        return {"type": "output_text", "text": self.text if text is None else text, "annotations": [], "logprobs": []}

    def snapshot(self) -> dict[str, Any]:
        body = self.body
        done = self.status in ("completed", "incomplete")
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": self.status,
            "model": self.fe.model_name, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if self.status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "output": [self._message("completed")] if done else [],
            "parallel_tool_calls": body.parallel_tool_calls, "previous_response_id": body.previous_response_id,
            "temperature": body.temperature, "top_p": body.top_p, "tool_choice": body.tool_choice or "auto",
            "tools": body.tools or [], "text": body.text or {"format": {"type": "text"}},
            "truncation": body.truncation or "disabled", "metadata": body.metadata or {},
            "store": bool(body.store and self.store is not None), "background": body.background,
            "usage": {
                "input_tokens": len(self.prompt_ids), "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": self.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": len(self.prompt_ids) + self.output_tokens,
            } if done else None,
        }

    # -- streamed events ---------------------------------------------------------------

    async def events(self) -> AsyncIterator[str]:
        sequence = iter(range(1 << 62))

        def event(kind: str, **data: Any) -> str:
            payload = {"type": kind, "sequence_number": next(sequence), **data}
            return f"event: {kind}\ndata: {json_text(payload)}\n\n"

        item = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        yield event("response.created", response=self.snapshot())
        yield event("response.in_progress", response=self.snapshot())
        yield event("response.output_item.added", output_index=0, item=self._message("in_progress"))
        yield event("response.content_part.added", **item, part=self._part(""))
        try:
            async for delta in self._generate():
                yield event("response.output_text.delta", **item, delta=delta, logprobs=[])
        except Exception as exc:
            self.status = "failed"
            status = 400 if isinstance(exc, ValueError | TypeError) else 500
            error = error_body(str(exc), "invalid_request_error" if status == 400 else "server_error", code=status)
            yield event("error", **error["error"])
            return
        yield event("response.output_text.done", **item, text=self.text, logprobs=[])
        yield event("response.content_part.done", **item, part=self._part())
        yield event("response.output_item.done", output_index=0, item=self._message("completed"))
        final = "response.incomplete" if self.status == "incomplete" else "response.completed"
        yield event(final, response=self.snapshot())


def _history(store: ResponseStore | None, previous_id: str | None) -> list[dict[str, Any]]:
    if previous_id is None:
        return []
    previous = _stored(store, previous_id)
    if previous.status not in ("completed", "incomplete"):
        raise bad_request(f"response {previous_id!r} has not completed (status {previous.status})",
                          "previous_response_id")
    return list(previous.messages)


def _input_messages(body: p.ResponsesRequest) -> list[dict[str, Any]]:
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    messages = []
    for item in body.input:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", "user")
            messages.append({"role": "system" if role == "developer" else role,
                             "content": _content_text(item.get("content", ""))})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": str(item.get("output", "")),
                             "tool_call_id": item.get("call_id")})
        elif kind == "function_call":
            messages.append({"role": "assistant", "content": "", "tool_calls": [{
                "id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}]})
        elif kind != "reasoning":
            raise bad_request(f"input items of type {kind!r} are not supported", "input")
    if not messages:
        raise bad_request("input must hold at least one message", "input")
    return messages


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for part in content or []:
        if part.get("type") not in ("input_text", "output_text", "text"):
            raise bad_request(f"content parts of type {part.get('type')!r} are not supported: this model takes text",
                              "input")
        texts.append(str(part.get("text", "")))
    return "\n".join(texts)
