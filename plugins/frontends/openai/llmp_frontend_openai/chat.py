"""``POST /v1/chat/completions``: a conversation in, one or ``n`` assistant messages out."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request

from llmp import Prompt
from llmp.frontend import bad_request, engine_request_id
from llmp_frontend_openai import protocol as p
from llmp_frontend_openai.logprobs import chat_logprobs, prompt_logprobs
from llmp_frontend_openai.wire import DONE, sse, sse_error, stream_usage, usage

if TYPE_CHECKING:
    from llmp_frontend_openai.frontend import OpenAIFrontend


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> None:
    async def create_chat_completion(body: p.ChatCompletionRequest, request: Request) -> Any:
        return await ChatCompletion(fe, body, request).run()

    router.add_api_route(
        "/v1/chat/completions",
        create_chat_completion,
        methods=["POST"],
        summary="Create a chat completion (OpenAI API)",
    )


class ChatCompletion:
    """One chat request: validated and tokenized in ``prepare``, then answered whole or streamed."""

    def __init__(self, fe: OpenAIFrontend, body: p.ChatCompletionRequest, request: Request) -> None:
        self.fe, self.body, self.request = fe, body, request
        self.id = fe.new_id(request, "chatcmpl", body)
        self.created = int(time.time())
        self.role = fe.options.response_role
        self.as_ids = fe.options.return_tokens_as_token_ids or bool(body.return_tokens_as_token_ids)

    async def run(self) -> Any:
        self.start(await self.prepare())
        stream = bool(self.body.stream)
        return await self.fe.respond(self.request, stream, self.stream if stream else self.whole)

    def start(self, prompt: Prompt) -> None:
        """Send the prepared prompt to the engine (its outputs are read by ``whole`` or ``stream``)."""
        fe, body = self.fe, self.body
        self.echo = _echo_text(body, self.role)
        if self.beam is not None:
            if hasattr(fe.engine, "check_capacity"):  # every beam of a step runs at once
                fe.engine.check_capacity(self.n, "n", "beams")
            skip = self.params.skip_special_tokens
            self.outputs = fe.beam_search(
                self.prompt_ids,
                self.beam,
                lora=self.lora,
                priority=body.priority,
                skip_special_tokens=skip,
                cache_salt=prompt.cache_salt,
            )
        else:
            self.outputs = fe.engine.generate(
                prompt,
                self.params,
                engine_request_id("chatcmpl"),
                lora_request=self.lora,
                priority=body.priority,
                delta=bool(body.stream),
            )

    async def prepare(self) -> Prompt:
        """Everything before the engine (shared with ``/v1/chat/completions/render``): the model and
        field checks, the chat template and its tokens, the output plan and the sampling parameters."""
        fe, body = self.fe, self.body
        self.lora = await fe.lora_for(body.model)
        self.model = fe.response_model(self.lora)
        fe.check_unsupported(body)
        if not body.messages:
            raise bad_request("messages must hold at least one message", "messages")
        fe.check_tools(body.tools, body.tool_choice)
        constraint = fe.structured_outputs_of(body)
        if body.top_logprobs is not None and not body.logprobs:
            raise bad_request("top_logprobs needs logprobs to be true", "top_logprobs")
        hide_tools = body.tool_choice == "none" and fe.options.exclude_tools_when_tool_choice_none
        prompt = await fe.chat_prompt(body.messages, body, tools=None if hide_tools else body.tools)
        [prompt] = fe.engine_prompts([prompt], body, body.truncate_prompt_tokens)
        self.prompt_ids = prompt.token_ids
        self.plan, constraint = fe.output_plan(
            self.prompt_ids,
            body.tools,
            body.tool_choice,
            parallel_tool_calls=body.parallel_tool_calls is not False,
            include_reasoning=body.include_reasoning,
            constraint=constraint,
        )
        self.parsed = self.plan.reasoning_parser is not None or self.plan.tool_parser is not None
        await fe.check_constraint(constraint, _constraint_param(body))
        field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        self.top = (body.top_logprobs or 0) if body.logprobs else None
        width = fe.beam_search_width(body)
        self.params = fe.sampling_params(
            body if width is None else body.model_copy(update={"n": 1}),
            self.prompt_ids,
            max_tokens=requested,
            logprobs=self.top,
            structured_outputs=constraint,
            skip_special_tokens=fe.skip_special_tokens(self.plan, body.skip_special_tokens),
            names={"max_tokens": field, "logprobs": "top_logprobs"},
        )
        self.beam = None if width is None else fe.beam_search_params(width, body, self.params, constraint)
        self.n = self.params.n if width is None else width
        return prompt

    # -- whole -------------------------------------------------------------------

    async def whole(self) -> dict[str, Any]:
        final = None
        async for final in self.outputs:
            pass
        choices = [self._choice(seq) for seq in final.outputs]
        completion_tokens = sum(len(seq.token_ids) for seq in final.outputs)
        response = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self._usage(completion_tokens, [seq.token_ids for seq in final.outputs], final.num_cached_tokens),
            "system_fingerprint": None,
        }
        if self.params.prompt_logprobs is not None:
            response["prompt_logprobs"] = prompt_logprobs(final.prompt_logprobs)
        if self.body.return_token_ids:
            response["prompt_token_ids"] = self.prompt_ids
        return response

    def _choice(self, seq: Any) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.echo + seq.text, "tool_calls": []}
        finish_reason = seq.finish_reason
        if self.parsed:
            stream = self.plan.message_stream()
            stream.feed(seq.text, final=True)
            parsed = stream.sent
            content = self.echo + parsed.content
            message["content"] = None if not content and parsed.tool_calls else content
            message["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call in parsed.tool_calls
            ]
            if self.plan.reasoning_parser is not None and self.plan.include_reasoning:
                message["reasoning"] = message["reasoning_content"] = parsed.reasoning
            finish_reason = self.plan.finish_reason(finish_reason, stream)
        if not message["tool_calls"]:  # left out when empty, as vLLM and OpenAI do
            del message["tool_calls"]
        choice = {
            "index": seq.index,
            "message": message,
            "logprobs": self._logprobs(seq),
            "finish_reason": finish_reason,
            "stop_reason": seq.stop_reason,
        }
        if self.body.return_token_ids:
            choice["token_ids"] = seq.token_ids
        return choice

    def _logprobs(self, seq: Any) -> dict[str, Any] | None:
        if self.top is None or seq.logprobs is None:
            return None
        return chat_logprobs(seq.token_ids, seq.logprobs, self.top, self.as_ids, self.fe.token_bytes)

    # -- streamed ----------------------------------------------------------------

    async def stream(self) -> AsyncIterator[str]:
        include_usage, continuous = stream_usage(self.body.stream_options, self.fe.options.enable_force_include_usage)
        prompt_len, generated = len(self.prompt_ids), [0] * self.n
        output_ids: list[list[int]] = [[] for _ in range(self.n)]  # kept only to count reasoning tokens
        keep_ids = self.plan.reasoning_parser is not None
        cached = 0
        done: set[int] = set()
        texts = [""] * self.n
        streams = [self.plan.message_stream() for _ in range(self.n)] if self.parsed else []
        try:
            for index in range(self.n):
                first: dict[str, Any] = {
                    "index": index,
                    "delta": {"role": self.role, "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                extra = {"prompt_token_ids": self.prompt_ids} if self.body.return_token_ids else {}
                yield sse(self._chunk([first], usage(prompt_len, 0) if continuous else None, **extra))
                if self.echo:
                    echoed = {"index": index, "delta": {"content": self.echo}, "logprobs": None, "finish_reason": None}
                    yield sse(self._chunk([echoed], usage(prompt_len, 0) if continuous else None))
            async for output in self.outputs:
                cached = output.num_cached_tokens
                for seq in output.outputs:
                    if seq.index in done:
                        continue
                    generated[seq.index] += len(seq.token_ids)
                    if keep_ids:
                        output_ids[seq.index] += seq.token_ids
                    # tokens that end in the middle of a character add no text yet: no chunk, unless
                    # their logprobs must be sent
                    if not (seq.text or seq.finish_reason or (self.top is not None and seq.token_ids)):
                        continue
                    delta: dict[str, Any] = {"content": seq.text} if seq.text else {}
                    finish_reason = seq.finish_reason
                    if streams:
                        texts[seq.index] += seq.text
                        stream = streams[seq.index]
                        delta = self._delta(stream.feed(texts[seq.index], final=bool(finish_reason)))
                        finish_reason = self.plan.finish_reason(finish_reason, stream)
                        if not (delta or finish_reason or (self.top is not None and seq.token_ids)):
                            continue
                    choice = {
                        "index": seq.index,
                        "delta": delta,
                        "logprobs": self._logprobs(seq),
                        "finish_reason": finish_reason,
                    }
                    if seq.finish_reason:
                        choice["stop_reason"] = seq.stop_reason
                        done.add(seq.index)
                    if self.body.return_token_ids:
                        choice["token_ids"] = seq.token_ids
                    yield sse(self._chunk([choice], usage(prompt_len, generated[seq.index]) if continuous else None))
            if include_usage:
                yield sse(self._chunk([], self._usage(sum(generated), output_ids, cached)))
        except Exception as exc:  # after the headers: report in-band and end; [DONE] marks success only
            yield sse_error(exc)
            return
        yield DONE

    def _usage(self, completion_tokens: int, output_ids: list[list[int]], cached_tokens: int) -> dict[str, Any]:
        """The whole answer's usage; with a reasoning parser, vLLM's ``completion_tokens_details``
        with the tokens the choices spent reasoning."""
        cached = cached_tokens if self.fe.options.enable_prompt_tokens_details else None
        counted: dict[str, Any] = usage(len(self.prompt_ids), completion_tokens, cached)
        if self.plan.reasoning_parser is not None:
            reasoning = sum(self.plan.reasoning_tokens(ids) or 0 for ids in output_ids)
            counted["completion_tokens_details"] = {"reasoning_tokens": reasoning}
        return counted

    def _delta(self, piece: Any) -> dict[str, Any]:
        """A chat delta from a ``llmp.parsing.MessageDelta``."""
        delta: dict[str, Any] = {}
        if piece.reasoning and self.plan.include_reasoning:
            delta["reasoning"] = delta["reasoning_content"] = piece.reasoning
        if piece.content:
            delta["content"] = piece.content
        if piece.tool_calls:
            delta["tool_calls"] = [_tool_call_delta(call) for call in piece.tool_calls]
        return delta

    def _chunk(self, choices: list[dict], usage: dict | None = None, **extra: Any) -> dict[str, Any]:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }
        if usage is not None:
            chunk["usage"] = usage
        return chunk


def _echo_text(body: p.ChatCompletionRequest, role: str) -> str:
    """With ``echo``, the reply starts with the last message when it is the role being continued."""
    if not body.echo or not body.messages or body.messages[-1].role != role:
        return ""
    content = body.messages[-1].content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content)
    return content or ""


def _constraint_param(body: p.ChatCompletionRequest) -> str:
    if body.tool_choice not in (None, "none", "auto"):
        return "tool_choice"
    return "structured_outputs" if body.structured_outputs else "response_format"


def _tool_call_delta(piece: Any) -> dict[str, Any]:
    if piece.name is None:
        return {"index": piece.index, "function": {"arguments": piece.arguments}}
    return {
        "index": piece.index,
        "id": piece.id,
        "type": "function",
        "function": {"name": piece.name, "arguments": piece.arguments},
    }
