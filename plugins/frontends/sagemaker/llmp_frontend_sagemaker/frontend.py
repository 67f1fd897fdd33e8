"""``POST /invocations``: SageMaker's single inference route, routed by the body's shape.

``messages`` -> a chat completion, ``prompt`` -> a completion, ``input`` -> embeddings, each
answered whole in OpenAI's JSON shape (streaming is refused). ``GET /ping`` is the core server's.

The bodies are those of the OpenAI routes (as vLLM's ``/invocations`` takes them): every field
is acted on as there, or refused with a 400 naming it (``UNSUPPORTED``) when a single text
answer has no place for it; keys no OpenAI route knows are ignored, as vLLM ignores them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmp import Prompt
from llmp.frontend import (
    FrontendKit,
    ReasoningEffort,
    SamplingRequest,
    bad_request,
    engine_request_id,
    until_disconnected,
    validation_message,
)


class _Sampling(BaseModel):
    """The fields of OpenAI's chat and completion bodies (with vLLM's extras) that a single,
    non-streamed, text-only answer honours; the others are refused (``UNSUPPORTED``), unknown keys
    ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    priority: int = 0  # needs --scheduling-policy priority unless 0
    request_id: str | None = None  # the response's id
    stream: bool = False
    user: str | None = None  # OpenAI's end-user tag: no effect on the answer, on any route


# OpenAI (and vLLM) request fields whose answer /invocations has no place for: a 400, never dropped.
# Each is refused when given a value other than its defaults (null and false, unless _DEFAULTS says).
UNSUPPORTED = (
    "n",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "structured_outputs",
    "include_reasoning",
    "echo",
    "suffix",
    "best_of",
    "stream_options",
    "return_token_ids",
)
EMBEDDING_UNSUPPORTED = ("encoding_format", "truncate_prompt_tokens")
_DEFAULTS = {
    "n": (None, 1),
    "parallel_tool_calls": (None, True),
    "include_reasoning": (None, True),
    "encoding_format": (None, "float"),
}


class ChatBody(_Sampling):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    reasoning_effort: ReasoningEffort | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None  # needs --trust-request-chat-template
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionBody(_Sampling):
    prompt: str | list[int]
    add_special_tokens: bool = True


class EmbeddingBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    normalize: bool | None = None
    dimensions: int | None = Field(default=None, ge=1)
    priority: int = 0
    user: str | None = None


class SageMakerFrontend(FrontendKit):
    def http_router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route(
            "/invocations",
            self.invocations,
            methods=["POST"],
            summary="SageMaker inference: chat (messages), completion (prompt) or embeddings (input)",
        )
        return router

    async def serve(self) -> None:  # HTTP only: the shared server runs the routes
        return None

    async def invocations(self, request: Request) -> Any:
        try:
            body = await request.json()
        except ValueError:
            raise bad_request("the body must be a JSON object") from None
        if not isinstance(body, dict):
            raise bad_request("the body must be a JSON object")
        if "messages" in body:
            kind, handler = ChatBody, self.chat
        elif "prompt" in body:
            kind, handler = CompletionBody, self.completion
        elif "input" in body:
            kind, handler = EmbeddingBody, self.embeddings
        else:
            raise bad_request(
                "cannot tell the request type: give 'messages' (chat completion), 'prompt' "
                "(completion) or 'input' (embeddings)"
            )
        try:
            parsed = kind.model_validate(body)
        except ValidationError as exc:
            message, param = validation_message(list(exc.errors()))
            raise bad_request(message, param) from None
        unsupported = _unsupported(body, EMBEDDING_UNSUPPORTED if kind is EmbeddingBody else UNSUPPORTED)
        if unsupported:
            raise bad_request(
                f"{unsupported} is not supported on /invocations (one text answer per request); "
                "use the OpenAI routes (--frontend openai)",
                unsupported,
            )
        self.check_model(parsed.model)
        wanted = "embed" if kind is EmbeddingBody else "generate"
        if wanted != self.task:
            raise bad_request(
                f"this server's model does not {'embed' if wanted == 'embed' else 'generate'}: "
                f"send {'input' if self.task == 'embed' else 'messages or prompt'}"
            )
        if getattr(parsed, "stream", False):
            raise bad_request("streaming is not supported on /invocations", "stream")
        return await until_disconnected(request, handler(parsed))

    # -- generation ---------------------------------------------------------------

    async def chat(self, body: ChatBody) -> dict[str, Any]:
        if not body.messages:
            raise bad_request("messages must hold at least one message", "messages")
        conversation = [_message(m, i) for i, m in enumerate(body.messages)]
        prompt = await self.conversation_prompt(conversation, body)
        requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        seq, prompt_len = await self._generate(prompt, body, requested)
        return {
            "id": f"chatcmpl-{body.request_id or uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": seq.text},
                    "logprobs": None,
                    "finish_reason": seq.finish_reason,
                    "stop_reason": seq.stop_reason,
                }
            ],
            "usage": _usage(prompt_len, len(seq.token_ids)),
        }

    async def completion(self, body: CompletionBody) -> dict[str, Any]:
        [prompt] = await self.prompt_inputs(body.prompt, "prompt", body.add_special_tokens)
        seq, prompt_len = await self._generate(prompt, body, body.max_tokens)
        return {
            "id": f"cmpl-{body.request_id or uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "text": seq.text,
                    "logprobs": None,
                    "finish_reason": seq.finish_reason,
                    "stop_reason": seq.stop_reason,
                }
            ],
            "usage": _usage(prompt_len, len(seq.token_ids)),
        }

    async def _generate(self, prompt: Prompt, body: _Sampling, requested: int | None) -> Any:
        name = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) is not None else "max_tokens"
        params = self.sampling_params(
            SamplingRequest.from_body(body, max_tokens=requested, names={"max_tokens": name}), len(prompt.token_ids)
        )
        final = None
        async for final in self.engine.generate(prompt, params, engine_request_id("sagemaker"), priority=body.priority):
            pass
        return final.outputs[0], len(prompt.token_ids)

    # -- embeddings ---------------------------------------------------------------

    async def embeddings(self, body: EmbeddingBody) -> dict[str, Any]:
        from llmp import PoolingParams

        inputs = await self.prompt_inputs(body.input, "input", True)
        for prompt in inputs:
            if len(prompt.token_ids) > self.max_model_len:
                raise bad_request(
                    f"an input is {len(prompt.token_ids)} tokens long; this model takes at most {self.max_model_len}",
                    "input",
                )
        try:
            params = PoolingParams(normalize=body.normalize, dimensions=body.dimensions)
        except ValueError as exc:
            raise bad_request(str(exc), "dimensions") from None

        async def one(prompt: Prompt) -> list[float]:
            async for output in self.engine.encode(prompt, params, engine_request_id("embd"), priority=body.priority):
                return output.outputs.embedding
            raise RuntimeError("the embedding request was aborted")

        tasks = [asyncio.ensure_future(one(prompt)) for prompt in inputs]
        try:
            vectors = await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        tokens = sum(len(prompt.token_ids) for prompt in inputs)
        return {
            "object": "list",
            "model": self.model_name,
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }


def _unsupported(body: dict[str, Any], names: tuple[str, ...]) -> str | None:
    """The first field of ``names`` given with a value other than its defaults."""
    return next((name for name in names if body.get(name) not in _DEFAULTS.get(name, (None, False))), None)


def _message(message: Any, index: int) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise bad_request(f"messages.{index} must be an object with a role", "messages")
    content = message.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise bad_request(f"messages.{index}.content: only text parts are supported", "messages")
            parts.append(str(part.get("text", "")))
        content = "\n".join(parts)
    elif content is None:
        content = ""
    elif not isinstance(content, str):
        raise bad_request(f"messages.{index}.content must be a string or a list of text parts", "messages")
    return {**message, "content": content}


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
