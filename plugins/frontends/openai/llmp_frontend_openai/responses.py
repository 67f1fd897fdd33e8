"""The Responses API: ``POST /v1/responses`` (whole or streamed as typed events) on the chat machinery.

With ``--enable-store`` results are kept in memory (the most recent
``STORE_SIZE``), which enables ``GET`` and ``DELETE /v1/responses/{id}``,
``GET /v1/responses/{id}/input_items``, ``previous_response_id``, ``background``
and ``POST /v1/responses/{id}/cancel``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Generator, Iterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from llmp.frontend import (
    APIError,
    OutputPlan,
    bad_request,
    engine_request_id,
    error_body,
    json_text,
    until_disconnected,
)
from llmp_frontend_openai import protocol as p
from llmp_frontend_openai.logprobs import chat_logprobs
from llmp_frontend_openai.pages import cursor_page

if TYPE_CHECKING:
    from llmp_frontend_openai.frontend import OpenAIFrontend

STORE_SIZE = 1024


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> None:
    store = ResponseStore(STORE_SIZE) if fe.options.enable_store else None

    async def create_response(body: p.ResponsesRequest, request: Request) -> Any:
        run = await ResponseRun.prepare(fe, body, store)
        if body.background:  # runs on whatever becomes of this request; a stream follows its events
            run.task = asyncio.create_task(run.produce())
            return _event_stream(run.follow(-1)) if body.stream else run.snapshot()
        if body.stream:
            return _event_stream(run.events())
        return await until_disconnected(request, run.finish())

    async def retrieve_response(response_id: str, stream: bool = False, starting_after: int = -1) -> Any:
        """The stored response; ``stream=true``: its events after the one numbered ``starting_after``
        (all by default), then those still to come while it runs (a streamed or background response)."""
        run = _stored(store, response_id)
        if not stream:
            return run.snapshot()
        if not run.streamed:
            raise bad_request("this response was not created with stream or background: it has no events", "stream")
        return _event_stream(run.follow(starting_after))

    async def delete_response(response_id: str) -> Any:
        run = _stored(store, response_id)
        if run.task is not None and not run.task.done():
            run.task.cancel()  # a background response still running goes with it
        store.forget(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def list_input_items(
        response_id: str, limit: int = 20, order: str = "desc", after: str | None = None
    ) -> dict[str, Any]:
        """OpenAI's input items of a stored response (its ``input``, each with an id), ``order`` ``desc``
        (newest first, the default) or ``asc``, ``limit`` 1 to 100, after the item ``after``."""
        if order not in ("asc", "desc"):
            raise bad_request(f"order must be asc or desc, got {order!r}", "order")
        if not 1 <= limit <= 100:
            raise bad_request(f"limit must be between 1 and 100, got {limit}", "limit")
        items = _stored(store, response_id).input_items
        return cursor_page(items if order == "asc" else items[::-1], after, limit, "after")

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
    router.add_api_route(
        "/v1/responses/{response_id}",
        retrieve_response,
        methods=["GET"],
        summary="Retrieve a stored response (--enable-store)",
    )
    router.add_api_route(
        "/v1/responses/{response_id}",
        delete_response,
        methods=["DELETE"],
        summary="Delete a stored response (--enable-store)",
    )
    router.add_api_route(
        "/v1/responses/{response_id}/input_items",
        list_input_items,
        methods=["GET"],
        summary="The input items of a stored response (--enable-store)",
    )
    router.add_api_route(
        "/v1/responses/{response_id}/cancel",
        cancel_response,
        methods=["POST"],
        summary="Cancel a background response (--enable-store)",
    )


def _event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


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

    def forget(self, response_id: str) -> None:
        self.runs.pop(response_id, None)


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
        self.top: int | None = None  # top_logprobs with the include of output logprobs, else None
        self.created_at = int(time.time())
        self.status = "queued" if body.background else "in_progress"
        self.text = ""
        self.items: OutputItems
        self.output_tokens = 0
        self.output_ids: list[int] = []
        self.cached_tokens = 0
        self.finish_reason: str | None = None
        self.task: asyncio.Task | None = None
        self.messages: list[dict[str, Any]] = []
        self.input_items: list[dict[str, Any]] = []  # the request's input as items with ids (input_items)
        # a streamed or background response's events as sent (index = sequence_number), for GET ?stream=true
        self.streamed = False
        self.log: list[str] = []
        self.ended = False
        self._waiters: list[asyncio.Future] = []
        self.model = fe.model_name  # the adapter's name when it runs on one (prepare)

    @classmethod
    async def prepare(cls, fe: OpenAIFrontend, body: p.ResponsesRequest, store: ResponseStore | None) -> ResponseRun:
        lora = await fe.lora_for(body.model)
        fe.check_unsupported(body)
        _check_responses_fields(body)
        tools, tool_choice = _chat_tools(body)
        fe.check_tools(tools, tool_choice)
        fmt = _text_format(body.text)
        try:
            constraint = fe.structured_outputs_of(body, fmt)
        except APIError as exc:
            exc.param = "text" if exc.param == "response_format" else exc.param
            raise
        if body.background and not body.store:  # vLLM's rule: its result could never be read
            raise bad_request("background can only be used when `store` is true", "background")
        if body.background and store is None:
            raise bad_request("background responses need the response store (start with --enable-store)", "background")
        run = cls(fe, body, store)
        run.model = fe.response_model(lora)
        run.messages = _history(store, body.previous_response_id) + _input_messages(body)
        run.input_items = _input_items(body)
        prompt = await _conversation_prompt(fe, body, run.messages, tools)
        run.prompt_ids = prompt.token_ids
        run.plan, constraint = fe.output_plan(
            run.prompt_ids,
            tools,
            tool_choice,
            constraint=constraint,
            parallel_tool_calls=body.parallel_tool_calls is not False,
        )
        if body.max_tool_calls is not None:  # the calls past it are dropped, as parallel_tool_calls false does
            cap = run.plan.max_tool_calls
            run.plan.max_tool_calls = body.max_tool_calls if cap is None else min(cap, body.max_tool_calls)
        await fe.check_constraint(constraint, "tool_choice" if tool_choice not in (None, "none", "auto") else "text")
        # vLLM's is_include_output_logprobs: the sampled tokens' logprobs, each with its top_logprobs
        run.top = (body.top_logprobs or 0) if OUTPUT_LOGPROBS in (body.include or ()) else None
        fe.check_caps(1, run.top, None, "top_logprobs")  # held to the cap chat has
        run.items = OutputItems(run.plan)
        run.params = fe.sampling_params(
            body,
            run.prompt_ids,
            max_tokens=body.max_output_tokens,
            logprobs=run.top,
            structured_outputs=constraint,
            skip_special_tokens=fe.skip_special_tokens(run.plan, body.skip_special_tokens),
            names={"max_tokens": "max_output_tokens", "logprobs": "top_logprobs"},
        )
        if run.params.n != 1:
            raise bad_request("n is not a field of the Responses API", "n")
        run.outputs = fe.engine.generate(
            prompt,
            run.params,
            engine_request_id("resp"),
            lora_request=lora,
            priority=body.priority,
            delta=True,
        )
        if store is not None and body.store:
            store.put(run)
        return run

    async def finish(self) -> dict[str, Any]:
        async for _ in self._generate():
            pass
        return self.snapshot()

    async def _generate(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Generate, yielding stream events as ``(type, fields)`` (the output items' deltas)."""
        self.status = "in_progress"
        try:
            async for output in self.outputs:
                seq = output.outputs[0]
                self.cached_tokens = output.num_cached_tokens
                self.output_tokens += len(seq.token_ids)
                if self.plan.reasoning_parser is not None:  # kept only to count reasoning tokens
                    self.output_ids += seq.token_ids
                self.text += seq.text
                if seq.finish_reason:
                    self.finish_reason = seq.finish_reason
                for event in self.items.feed(self.text, seq.finish_reason is not None, self._logprobs(seq)):
                    yield event
        except asyncio.CancelledError:
            self.status = "cancelled"
            raise
        except Exception:
            self.status = "failed"
            raise
        self.status = "incomplete" if self.finish_reason == "length" else "completed"
        self.messages.append(self.items.history_message())

    def _logprobs(self, seq: Any) -> list[dict[str, Any]]:
        """The new tokens' logprobs in the shape of an ``output_text`` part's (with the include)."""
        if self.top is None or seq.logprobs is None:
            return []
        as_ids = self.fe.options.return_tokens_as_token_ids
        return chat_logprobs(seq.token_ids, seq.logprobs, self.top, as_ids, self.fe.token_bytes)["content"]

    # -- the response object -------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        body = self.body
        done = self.status in ("completed", "incomplete")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "model": self.model,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if self.status == "incomplete" else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "output": self.items.output(self.status == "incomplete") if done else [],
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "max_tool_calls": body.max_tool_calls,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": None, "summary": None, **(body.reasoning.model_dump() if body.reasoning else {})},
            "service_tier": "default",  # llmp has one tier, whatever the request asked (as OpenAI reports it)
            "temperature": self.params.temperature,  # the values used (the model's defaults where unset)
            "top_p": self.params.top_p,
            "top_logprobs": self.top or 0,
            "user": body.user,
            "tool_choice": body.tool_choice or "auto",
            "tools": body.tools or [],
            "text": body.text or {"format": {"type": "text"}},
            "truncation": body.truncation or "disabled",
            "metadata": body.metadata or {},
            "store": bool(body.store and self.store is not None),
            "background": body.background,
            "usage": {
                "input_tokens": len(self.prompt_ids),
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.output_tokens,
                "output_tokens_details": {"reasoning_tokens": self.plan.reasoning_tokens(self.output_ids) or 0},
                "total_tokens": len(self.prompt_ids) + self.output_tokens,
            }
            if done
            else None,
        }

    # -- streamed events ---------------------------------------------------------------

    async def produce(self) -> None:
        """Run a background response to its end, its events kept for those who follow it."""
        async for _ in self.events():
            pass

    async def follow(self, after: int) -> AsyncIterator[str]:
        """The events numbered after ``after``, then each new one as it comes, until the response ends."""
        position = max(after + 1, 0)
        while True:
            if position < len(self.log):
                position += 1
                yield self.log[position - 1]
            elif self.ended:
                return
            else:
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter

    async def events(self) -> AsyncIterator[str]:
        """The response's stream events, each kept in ``log`` as it is sent."""
        self.streamed = True
        try:
            async for text in self._events():
                self.log.append(text)
                self._wake()
                yield text
        finally:
            self.ended = True
            self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _events(self) -> AsyncIterator[str]:
        sequence = iter(range(1 << 62))

        def event(kind: str, **data: Any) -> str:
            payload = {"type": kind, "sequence_number": next(sequence), **data}
            return f"event: {kind}\ndata: {json_text(payload)}\n\n"

        yield event("response.created", response=self.snapshot())
        yield event("response.in_progress", response=self.snapshot())
        for kind, data in self.items.start():
            yield event(kind, **data)
        try:
            async for kind, data in self._generate():
                yield event(kind, **data)
        except Exception as exc:
            self.status = "failed"
            status = 400 if isinstance(exc, ValueError | TypeError) else 500
            error = error_body(str(exc), "invalid_request_error" if status == 400 else "server_error", code=status)
            yield event("error", **error["error"])
            return
        for kind, data in self.items.close(self.status == "incomplete"):
            yield event(kind, **data)
        final = "response.incomplete" if self.status == "incomplete" else "response.completed"
        yield event(final, response=self.snapshot())


Event = tuple[str, dict[str, Any]]


class OutputItems:
    """The output items of a response (reasoning, message, function calls) from the generated text.

    The text is split by the request's parsers; each item is added with its first piece and is done
    (its done events sent) when the next is added, as OpenAI streams items one at a time: text after a
    call is a new message item. A response cut by ``max_output_tokens`` leaves its last item
    ``incomplete``, as OpenAI's does. Without parsers there is one message item, added at once. With
    the logprobs ``feed`` is given (the include's), a message carries those of the tokens that wrote it.
    """

    def __init__(self, plan: OutputPlan) -> None:
        self.parsed = plan.reasoning_parser is not None or plan.tool_parser is not None
        self.stream = plan.message_stream()
        self.items: list[dict[str, Any]] = []  # in output order
        self.index: dict[str, int] = {}  # "reasoning", "message", "call:N" -> the output index of the latest
        self.done: set[int] = set()  # the output indexes whose done events were sent
        self.pending: list[dict[str, Any]] = []  # the logprobs of tokens whose text is not yet placed

    def start(self) -> Iterator[Event]:
        if not self.parsed:
            yield from self._add("message")

    def feed(self, text: str, final: bool, logprobs: list[dict[str, Any]] | None = None) -> Iterator[Event]:
        self.pending += logprobs or []
        piece = self.stream.feed(text, final)
        if piece.reasoning:
            index = yield from self._add("reasoning")
            self.items[index]["content"][0]["text"] += piece.reasoning
            yield (
                "response.reasoning_text.delta",
                {
                    "item_id": self.items[index]["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": piece.reasoning,
                },
            )
        # the end of a call written before this text goes first: the message item closes the call
        for call in piece.tool_calls:
            if call.name is None:
                yield from self._call_delta(call)
        if piece.content:
            index = yield from self._add("message")
            part = self.items[index]["content"][0]
            taken, self.pending = self.pending, []
            part["text"] += piece.content
            part["logprobs"] += taken
            yield (
                "response.output_text.delta",
                {
                    "item_id": self.items[index]["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": piece.content,
                    "logprobs": taken,
                },
            )
        elif piece:  # the new tokens wrote reasoning or calls
            self.pending = []
        for call in piece.tool_calls:
            if call.name is not None:
                yield from self._add(f"call:{call.index}", call.name, call.id)
                yield from self._call_delta(call)
        last = self.items[-1] if self.items else None
        if final and self.pending and last is not None and last["type"] == "message":  # tokens of no text
            last["content"][0]["logprobs"] += self.pending

    def _call_delta(self, call: Any) -> Iterator[Event]:
        index = self.index[f"call:{call.index}"]
        self.items[index]["arguments"] += call.arguments
        if call.arguments:
            yield (
                "response.function_call_arguments.delta",
                {"item_id": self.items[index]["id"], "output_index": index, "delta": call.arguments},
            )

    def close(self, incomplete: bool = False) -> Iterator[Event]:
        """The done events of the items not yet done; ``incomplete``: the response was cut short."""
        if not self.items:
            yield from self._add("message")
        for index in range(len(self.items)):
            last = index == len(self.items) - 1
            yield from self._done(index, "incomplete" if incomplete and last else "completed")

    def output(self, incomplete: bool = False) -> list[dict[str, Any]]:
        """The finished items (a response without output has one empty message)."""
        if not self.items:
            list(self._add("message"))
        statuses = ["completed"] * len(self.items)
        if incomplete:
            statuses[-1] = "incomplete"
        return [{**item, "status": status} for item, status in zip(self.items, statuses, strict=True)]

    def _done(self, index: int, status: str) -> Iterator[Event]:
        if index in self.done:
            return
        self.done.add(index)
        item = self.items[index]
        item["status"] = status
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "reasoning":
            yield "response.reasoning_text.done", {**where, "content_index": 0, "text": item["content"][0]["text"]}
        elif item["type"] == "message":
            part = item["content"][0]
            done = {**where, "content_index": 0, "text": part["text"], "logprobs": part["logprobs"]}
            yield "response.output_text.done", done
            yield "response.content_part.done", {**where, "content_index": 0, "part": part}
        else:
            done = {**where, "name": item["name"], "arguments": item["arguments"]}
            yield "response.function_call_arguments.done", done
        yield "response.output_item.done", {"output_index": index, "item": item}

    def history_message(self) -> dict[str, Any]:
        """The assistant turn for ``previous_response_id``: content and tool calls, not the reasoning."""
        sent = self.stream.sent
        message: dict[str, Any] = {"role": "assistant", "content": sent.content}
        if sent.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in sent.tool_calls
            ]
        return message

    def _add(self, key: str, name: str | None = None, call_id: str | None = None) -> Generator[Event, None, int]:
        """Add the item ``key`` unless it is being written (the items before it are done first); its index."""
        if key in self.index and self.index[key] not in self.done:
            return self.index[key]
        for index in range(len(self.items)):  # one item at a time: the parser has moved past the others
            yield from self._done(index, "completed")
        if key == "reasoning":
            item = {
                "type": "reasoning",
                "id": f"rs_{uuid.uuid4().hex}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": ""}],
                "status": "in_progress",
            }
        elif key == "message":
            item = {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "status": "in_progress",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}],
            }
        else:
            item = {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": call_id,
                "name": name,
                "arguments": "",
                "status": "in_progress",
            }
        index = self.index[key] = len(self.items)
        self.items.append(item)
        yield (
            "response.output_item.added",
            {"output_index": index, "item": {**item, "content": []} if key == "message" else dict(item)},
        )
        if key == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield (
                "response.content_part.added",
                {"item_id": item["id"], "output_index": index, "content_index": 0, "part": part},
            )
        return index


OUTPUT_LOGPROBS = "message.output_text.logprobs"
# what Responses clients (Codex) send routinely: reasoning items carry their text, nothing is encrypted
INCLUDABLE = frozenset({"reasoning.encrypted_content", OUTPUT_LOGPROBS})
TEXT_FORMATS = ("text", "json_object", "json_schema")


async def _conversation_prompt(
    fe: OpenAIFrontend, body: p.ResponsesRequest, messages: list[dict[str, Any]], tools: Any
) -> Any:
    """The prompt of the instructions and the conversation. With ``truncation: "auto"``, as OpenAI's:
    when it leaves no room for the output (``max_output_tokens``, else one token) in the context, the
    oldest items are dropped, a turn at a time (up to the next user message), until it does; the last
    user turn is kept, and when that alone does not fit, the error is the one ``disabled`` gives."""
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    while True:
        conversation = [p.ChatMessage(**m) for m in system + messages]
        [prompt] = fe.engine_prompts([await fe.chat_prompt(conversation, body, tools=tools)], body)
        room = body.max_output_tokens or 1
        if body.truncation != "auto" or len(prompt.token_ids) + room <= fe.max_model_len:
            return prompt
        later_turn = next((i for i in range(1, len(messages)) if messages[i].get("role") == "user"), None)
        if later_turn is None:
            return prompt
        messages = messages[later_turn:]


def _check_responses_fields(body: p.ResponsesRequest) -> None:
    """Chat and completions fields the Responses API has no place for, and outputs this server
    cannot add, are refused rather than dropped."""
    for name, given in (
        ("response_format", body.response_format is not None),
        ("echo", body.echo),
        ("prompt_logprobs", body.prompt_logprobs is not None),
        ("return_token_ids", body.return_token_ids),
        ("use_beam_search", body.use_beam_search),  # one response, n beams: use chat or completions
        ("length_penalty", body.length_penalty != 1.0),
    ):
        if given:
            hint = "; give text.format" if name == "response_format" else ""
            raise bad_request(f"{name} is not a field of the Responses API{hint}", name)
    unknown = sorted(set(body.include or ()) - INCLUDABLE)
    if unknown:
        raise bad_request(
            f"include {', '.join(map(repr, unknown))} is not supported (this server can include: "
            f"{', '.join(sorted(INCLUDABLE))})",
            "include",
        )
    if body.top_logprobs and OUTPUT_LOGPROBS not in (body.include or ()):  # never silently ignored
        raise bad_request(f'top_logprobs needs include ["{OUTPUT_LOGPROBS}"] (the logprobs it ranks)', "top_logprobs")
    if body.max_tool_calls is not None and body.max_tool_calls < 1:
        raise bad_request(
            f"max_tool_calls must be at least 1, got {body.max_tool_calls} (tool_choice none makes no calls)",
            "max_tool_calls",
        )


def _text_format(text: Any) -> dict[str, Any]:
    """``text.format`` (``{"type": "text"}`` unless given) as chat's ``response_format``."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") not in TEXT_FORMATS:
        raise bad_request(
            f"text.format must be an object whose type is one of {', '.join(TEXT_FORMATS)} "
            f'(e.g. {{"type": "json_object"}}), got {fmt!r}',
            "text",
        )
    if fmt["type"] == "json_schema":
        return {"type": "json_schema", "json_schema": {"schema": fmt.get("schema")}}
    return dict(fmt)


def _chat_tools(body: p.ResponsesRequest) -> tuple[list[dict[str, Any]] | None, Any]:
    """The Responses API's flat function tools and tool_choice in the chat shapes."""
    tools = None
    if body.tools is not None:
        tools = []
        for tool in body.tools:
            if tool.get("type") != "function":
                raise bad_request(f"tools of type {tool.get('type')!r} are not supported; give function tools", "tools")
            function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
            tools.append({"type": "function", "function": function})
    choice = body.tool_choice
    if isinstance(choice, dict):
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return tools, choice


def _history(store: ResponseStore | None, previous_id: str | None) -> list[dict[str, Any]]:
    if previous_id is None:
        return []
    previous = _stored(store, previous_id)
    if previous.status not in ("completed", "incomplete"):
        raise bad_request(
            f"response {previous_id!r} has not completed (status {previous.status})", "previous_response_id"
        )
    return list(previous.messages)


def _input_messages(body: p.ResponsesRequest) -> list[dict[str, Any]]:
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    messages = []
    for at, item in enumerate(body.input):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", "user")
            content = _content(item.get("content", ""), f"input[{at}].content")
            messages.append({"role": "system" if role == "developer" else role, "content": content})
        elif kind == "function_call_output":  # its output a text, or text parts (the template joins them)
            output = _content(item.get("output", ""), f"input[{at}].output")
            messages.append({"role": "tool", "content": output, "tool_call_id": item.get("call_id")})
        elif kind == "function_call":
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": item.get("call_id"),
                            "type": "function",
                            "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
                        }
                    ],
                }
            )
        elif kind != "reasoning":
            raise bad_request(f"input items of type {kind!r} are not supported", "input")
    if not messages:
        raise bad_request("input must hold at least one message", "input")
    return messages


def _input_items(body: p.ResponsesRequest) -> list[dict[str, Any]]:
    """The request's ``input`` as OpenAI lists it back: items with ids, a text as one user message."""
    given = [{"type": "message", "role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    items = []
    for item in given:
        item = {"type": "message", **item}
        if item["type"] == "message":
            content = item.get("content", "")
            if isinstance(content, str):  # OpenAI lists an assistant's text as output_text
                kind = "output_text" if item.get("role") == "assistant" else "input_text"
                content = [{"type": kind, "text": content}]
            item = {"id": f"msg_{uuid.uuid4().hex}", "status": "completed", **item, "content": content}
        else:
            item = {"id": f"{item['type'][:2]}_{uuid.uuid4().hex}", **item}
        items.append(item)
    return items


def _content(content: Any, where: str = "input") -> str | list[dict[str, str]]:
    """A message's content (or a call's output, at ``where``): its text, or its text parts (each a part
    for the chat template, as in chat)."""
    if isinstance(content, str) or content is None:
        return content or ""
    if not isinstance(content, list) or not all(isinstance(part, dict) for part in content):
        raise bad_request(f"{where} must be a string or a list of content parts, got {content!r}", "input")
    parts = []
    for part in content:
        if part.get("type") not in ("input_text", "output_text", "text"):
            raise bad_request(
                f"content parts of type {part.get('type')!r} are not supported: this model takes text", "input"
            )
        parts.append({"type": "text", "text": str(part.get("text", ""))})
    return parts
