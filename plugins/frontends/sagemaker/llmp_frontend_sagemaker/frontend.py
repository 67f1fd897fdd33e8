"""``POST /invocations``: SageMaker's single inference route, routed by the body's shape, as vLLM's.

The body's keys pick the route, the first that applies winning (vLLM's precedence):

- ``messages`` -> a chat completion, ``prompt`` -> a completion (models that generate);
- ``task`` -> ``/pooling`` (the raw pooled output of that task);
- ``input`` (and ``messages`` on a model that does not generate) -> the model's pooling task:
  embeddings (an embedding model), classification (a classifier, a cross-encoder, an LLM
  reranker) or ``/pooling`` (a reward model: the rewards per token);
- ``query`` and ``documents`` -> ``/rerank``;
- ``text_1``/``text_2``, ``queries``/``documents`` (or ``items``), ``data_1``/``data_2`` -> ``/score``.

A body the model cannot serve is a 400 saying what the model does. ``GET /ping`` is the core server's.

LoRA adapters (``--enable-lora``): the ``X-Amzn-SageMaker-Adapter-Identifier`` header names the
adapter a request runs on (SageMaker's inference components), else the body's ``model``. With
``--enable-lora-runtime-updates``, ``POST /adapters`` (``{"name", "src"}``) loads one and
``DELETE /adapters/{adapter_name}`` unloads it (the shapes vLLM registers for SageMaker).

Chat and completion bodies are those of the OpenAI routes (as vLLM's ``/invocations`` takes them),
answered whole (streaming is refused): every field is acted on as there, or refused with a 400 naming
it (``UNSUPPORTED``) when a single text answer has no place for it; keys no OpenAI route knows are
ignored, as vLLM ignores them. The pooling bodies go to the OpenAI front-end's own handlers (as vLLM's
``/invocations`` calls its OpenAI routes'), so they take every field and give every answer and error
those routes do.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from fastapi.routing import APIRoute
from llmp_frontend_openai import protocol as openai
from llmp_frontend_openai.frontend import NOT_DONE, OpenAIFrontend
from llmp_frontend_openai.pooling import POOLING_ROUTE_TASKS
from pydantic import BaseModel, ConfigDict, ValidationError

from llmp import LoRARequest, Prompt
from llmp.frontend import (
    FrontendKit,
    ReasoningEffort,
    SamplingRequest,
    bad_request,
    engine_request_id,
    until_disconnected,
    validation_message,
)
from llmp.options import FrontendOptions


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
    typical_p: float | None = None
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
    stream: bool | None = False  # null is false, as vLLM's
    user: str | None = None  # OpenAI's end-user tag: no effect on the answer, on any route
    truncate_prompt_tokens: int | None = None  # keep the prompt's last N tokens; -1 = max_model_len
    cache_salt: str | None = None  # keys the prompt's prefix-cache blocks (Prompt.cache_salt)
    thinking_token_budget: int | None = None  # vLLM's: reasoning cut at this many tokens (needs --reasoning-parser)


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
    "return_tokens_as_token_ids",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "modalities",
    "use_beam_search",  # n beams: /invocations answers one text
    "length_penalty",
    *NOT_DONE,  # vLLM's fields for what llmp does not do on any route
)
_DEFAULTS = {
    "n": (None, 1),
    "parallel_tool_calls": (None, True),
    "include_reasoning": (None, True),
    "modalities": (None, ["text"]),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1.0),
    **{name: (None, idle, {}) for name, (idle, _) in NOT_DONE.items()},
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


class LoadAdapterBody(BaseModel):
    """SageMaker's adapter load: ``name`` (how requests name it) and ``src`` (its PEFT directory)."""

    name: str = ""
    src: str = ""
    pin: bool = False  # never evicted from the engine's CPU cache


ADAPTER_HEADER = "x-amzn-sagemaker-adapter-identifier"


Endpoint = Callable[[Any, Request], Awaitable[Any]]

# The pooling bodies, answered by the OpenAI front-end's handlers: each kind's route and body type.
POOLING_ROUTES: dict[str, tuple[str, type[BaseModel]]] = {
    "embed": ("/v1/embeddings", openai.EmbeddingRequest),
    "classify": ("/classify", openai.ClassificationRequest),
    "rerank": ("/rerank", openai.RerankRequest),
    "score": ("/score", openai.ScoreRequest),
    "pooling": ("/pooling", openai.PoolingRequest),
}
SCORE_KEYS = ("text_1", "text_2", "queries", "documents", "items", "data_1", "data_2")  # /score's two sides
# what a model that cannot serve a kind of body "does not" do
_VERBS = {
    "chat": "generate",
    "completion": "generate",
    "input": "embed or classify",
    "embed": "embed",
    "classify": "classify",
    "rerank": "score",
    "score": "score",
    "pooling": "give pooled outputs",
}


class SageMakerFrontend(FrontendKit):
    def __init__(self, engine: Any, options: FrontendOptions) -> None:
        super().__init__(engine, options)
        # the OpenAI front-end's handlers, by route: mounted only where the model does the task
        routes = OpenAIFrontend(engine, options).http_router().routes
        self.openai_endpoints: dict[str, Endpoint] = {r.path: r.endpoint for r in routes if isinstance(r, APIRoute)}
        # the task of a pooling body that names none: the model's primary pooling task (the first listed)
        self.pooling_task = next((t for t in self.supported_tasks if t in POOLING_ROUTE_TASKS), None)

    def http_router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route(
            "/invocations",
            self.invocations,
            methods=["POST"],
            summary="SageMaker inference: chat (messages), completion (prompt), embeddings or classification "
            "(input), rerank (query, documents), score (text_1, text_2) or pooling (task), routed by the body",
        )
        if self.options.enable_lora_runtime_updates:
            router.add_api_route("/adapters", self.load_adapter_route, methods=["POST"], summary="Load a LoRA adapter")
            router.add_api_route(
                "/adapters/{adapter_name:path}",
                self.unload_adapter_route,
                methods=["DELETE"],
                summary="Unload a LoRA adapter",
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
        adapter = request.headers.get(ADAPTER_HEADER)
        if adapter:  # the inference component's adapter wins over the body's model
            body["model"] = adapter
        kind = self.body_kind(body)
        if not self.serves(kind):
            raise bad_request(f"this server's model {self.description()}; it does not {_VERBS[kind]}")
        if kind in POOLING_ROUTES:
            path, body_type = POOLING_ROUTES[kind]
            return await self.openai_endpoints[path](_validated(body_type, body), request)
        parsed = _validated(ChatBody if kind == "chat" else CompletionBody, body)
        unsupported = _unsupported(body, UNSUPPORTED)
        if unsupported:
            raise bad_request(
                f"{unsupported} is not supported on /invocations (one text answer per request); "
                "use the OpenAI routes (--frontend openai)",
                unsupported,
            )
        lora = await self.lora_for(parsed.model)
        if parsed.stream:
            raise bad_request("streaming is not supported on /invocations", "stream")
        handler = self.chat if kind == "chat" else self.completion
        return await until_disconnected(request, handler(parsed, lora))

    async def load_adapter_route(self, body: LoadAdapterBody) -> PlainTextResponse:
        await self.load_adapter(body.name, body.src, pin=body.pin)
        return PlainTextResponse(f"Success: LoRA adapter '{body.name}' added successfully.")

    async def unload_adapter_route(self, adapter_name: str) -> PlainTextResponse:
        await self.unload_adapter(adapter_name)
        return PlainTextResponse(f"Success: LoRA adapter '{adapter_name}' removed successfully.")

    # -- routing by body shape ------------------------------------------------------

    def body_kind(self, body: dict[str, Any]) -> str:
        """The kind of request a body is, by its keys, in vLLM's precedence (the module docstring)."""
        if "messages" in body and "generate" in self.supported_tasks:
            return "chat"
        if "prompt" in body:
            return "completion"
        if "task" in body:
            return "pooling"
        if "input" in body or "messages" in body:
            if self.pooling_task == "classify":
                return "classify"
            if self.pooling_task in ("token_embed", "token_classify"):
                return "pooling"
            if "messages" in body and self.pooling_task != "embed":  # /v1/embeddings takes a chat too (vLLM's)
                return "chat"
            return "embed" if self.pooling_task == "embed" else "input"
        if "query" in body:
            return "rerank"
        if any(key in body for key in SCORE_KEYS):
            return "score"
        raise bad_request(f"cannot tell the request type: give {self.accepted()}")

    def serves(self, kind: str) -> bool:
        if kind in ("chat", "completion"):
            return "generate" in self.supported_tasks
        return kind in POOLING_ROUTES and POOLING_ROUTES[kind][0] in self.openai_endpoints

    def description(self) -> str:
        """What the model does and the bodies that ask for it, e.g. "classifies: send input or messages
        (classification), ..."."""
        verbs = {"generate": "generates", "embed": "embeds", "classify": "classifies", "score": "scores"}
        does = [verbs[task] for task in ("generate", "embed", "classify", "score") if task in self.supported_tasks]
        return f"{_listed(does or ['gives pooled outputs'], 'and')}: send {self.accepted()}"

    def accepted(self) -> str:
        """The bodies this server's model takes, e.g. "messages (chat completion) or prompt (completion)"."""
        generates = "generate" in self.supported_tasks
        own = {"embed": "embeddings", "classify": "classification"}.get(self.pooling_task or "", "pooling")
        bodies = ["messages (chat completion)", "prompt (completion)"] if generates else []
        if self.pooling_task is not None:
            bodies.append(
                f"input ({own})" if generates or self.pooling_task == "embed" else f"input or messages ({own})"
            )
        if self.serves("rerank"):
            bodies += ["query and documents (rerank)", "text_1 and text_2 (score)"]
        if self.serves("pooling") and own != "pooling":
            bodies.append("task with input (pooling)")
        return _listed(bodies, "or")

    # -- generation ---------------------------------------------------------------

    async def chat(self, body: ChatBody, lora: LoRARequest | None) -> dict[str, Any]:
        if not body.messages:
            raise bad_request("messages must hold at least one message", "messages")
        conversation = [_message(m, i) for i, m in enumerate(body.messages)]
        prompt = await self.conversation_prompt(conversation, body)
        requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        seq, prompt_len = await self._generate(prompt, body, requested, lora)
        return {
            "id": f"chatcmpl-{body.request_id or uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.response_model(lora),
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

    async def completion(self, body: CompletionBody, lora: LoRARequest | None) -> dict[str, Any]:
        [prompt] = await self.prompt_inputs(body.prompt, "prompt", body.add_special_tokens)
        seq, prompt_len = await self._generate(prompt, body, body.max_tokens, lora)
        return {
            "id": f"cmpl-{body.request_id or uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.response_model(lora),
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

    async def _generate(self, prompt: Prompt, body: _Sampling, requested: int | None, lora: LoRARequest | None) -> Any:
        prompt = self.engine_prompt(
            prompt, truncate_prompt_tokens=body.truncate_prompt_tokens, cache_salt=body.cache_salt
        )
        name = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) is not None else "max_tokens"
        budget = body.thinking_token_budget
        markers = self.reasoning_markers(prompt.token_ids) if budget is not None else None
        params = self.sampling_params(
            SamplingRequest.from_body(
                body, max_tokens=requested, reasoning_markers=markers, names={"max_tokens": name}
            ),
            len(prompt.token_ids),
        )
        final = None
        outputs = self.engine.generate(
            prompt, params, engine_request_id("sagemaker"), lora_request=lora, priority=body.priority
        )
        async for final in outputs:
            pass
        return final.outputs[0], len(prompt.token_ids)


def _listed(items: list[str], conjunction: str) -> str:
    """``a, b and c`` (or ``a, b or c``)."""
    return f"{', '.join(items[:-1])} {conjunction} {items[-1]}" if len(items) > 1 else items[0]


def _validated(body_type: type[BaseModel], body: dict[str, Any]) -> Any:
    try:
        return body_type.model_validate(body)
    except ValidationError as exc:
        message, param = validation_message(list(exc.errors()))
        raise bad_request(message, param) from None


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
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        content = parts  # the template gets them as --chat-template-content-format says
    elif content is None:
        content = ""
    elif not isinstance(content, str):
        raise bad_request(f"messages.{index}.content must be a string or a list of text parts", "messages")
    return {**message, "content": content}


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
