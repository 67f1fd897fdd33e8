"""``POST /invocations``: SageMaker's single inference route, routed by the body's shape.

``messages`` -> a chat completion, ``prompt`` -> a completion, ``input`` -> embeddings, each
answered whole in OpenAI's JSON shape (streaming is refused). ``GET /ping`` is the core server's.
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
    """The sampling fields of OpenAI's chat and completion bodies (with vLLM's extras) that a single,
    non-streamed, text-only answer can honour; the others are refused (``UNSUPPORTED``), unknown keys
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
    logit_bias: dict[str, float] | None = None
    bad_words: list[str] | None = None
    stream: bool = False


# OpenAI (and vLLM) request fields whose answer /invocations has no place for: a 400, never dropped
UNSUPPORTED = (
    "n",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "tools",
    "tool_choice",
    "response_format",
    "structured_outputs",
    "echo",
    "suffix",
    "best_of",
    "stream_options",
    "return_token_ids",
)


class ChatBody(_Sampling):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: ReasoningEffort | None = None


class CompletionBody(_Sampling):
    prompt: str | list[int]
    add_special_tokens: bool = True


class EmbeddingBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    normalize: bool | None = None
    dimensions: int | None = Field(default=None, ge=1)


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
        unsupported = None if kind is EmbeddingBody else _unsupported(body)
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
            "id": f"chatcmpl-{uuid.uuid4().hex}",
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
            "id": f"cmpl-{uuid.uuid4().hex}",
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
            SamplingRequest(
                temperature=body.temperature,
                top_p=body.top_p,
                top_k=body.top_k,
                min_p=body.min_p,
                repetition_penalty=body.repetition_penalty,
                presence_penalty=body.presence_penalty,
                frequency_penalty=body.frequency_penalty,
                seed=body.seed,
                max_tokens=requested,
                min_tokens=body.min_tokens,
                stop=body.stop,
                stop_token_ids=body.stop_token_ids,
                ignore_eos=body.ignore_eos,
                logit_bias=body.logit_bias,
                bad_words=body.bad_words,
                names={"max_tokens": name},
            ),
            len(prompt.token_ids),
        )
        final = None
        async for final in self.engine.generate(prompt, params, engine_request_id("sagemaker")):
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
            async for output in self.engine.encode(prompt, params, engine_request_id("embd")):
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


def _unsupported(body: dict[str, Any]) -> str | None:
    """The first field of ``UNSUPPORTED`` given with a value other than its default."""
    defaults = {"n": (None, 1)}
    return next((name for name in UNSUPPORTED if body.get(name) not in defaults.get(name, (None, False))), None)


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
