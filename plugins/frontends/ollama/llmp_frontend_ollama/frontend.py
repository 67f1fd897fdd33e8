"""The Ollama front-end: Ollama's ``/api/*`` routes over llmp's engine, so tools that speak only
Ollama's API (editor assistants, Open WebUI, agents) talk to ``llmp serve --frontend ollama``.

Requests become a conversation for the chat template (``FrontendKit.conversation_prompt``) and
sampling parameters (:mod:`llmp_frontend_ollama.options`); replies are Ollama's JSON objects, streamed
as NDJSON (:mod:`llmp_frontend_ollama.generation`). Every error on ``/api/`` is Ollama's
``{"error": "..."}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from llmp import PoolingParams, PoolingRequestOutput, Prompt
from llmp.frontend import (
    APIError,
    FrontendKit,
    bad_request,
    engine_request_id,
    read_variables,
    special_tokens_around,
    template_variables,
    until_disconnected,
)
from llmp.options import FrontendOptions
from llmp_frontend_ollama import protocol as p
from llmp_frontend_ollama.facts import go_value, model_info, now_rfc3339, read_facts, stop_texts
from llmp_frontend_ollama.generation import Generation
from llmp_frontend_ollama.options import read_options

# the Ollama release whose API these routes were checked against (what /api/version reports)
OLLAMA_VERSION = "0.32.15"
BANNER = "Ollama is running"
# Ollama's name for a Hugging Face generation-config default, for /api/show's "parameters"
PARAMETER_NAMES = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repeat_penalty",
    "max_new_tokens": "num_predict",
}
# a model llmp keeps loaded until the server stops: Ollama's "forever" (keep_alive -1) is this far off
FOREVER = timedelta(seconds=2**63 // 10**9)
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def ollama_error(error: APIError) -> tuple[int, dict[str, Any]]:
    """``(status, body)`` of an error in Ollama's shape ``{"error": "message"}``; a request body
    that does not validate is a 400, as Ollama's are."""
    status = 400 if error.status == 422 else error.status
    return status, {"error": _ADDRESS.sub("", error.message)}


@dataclass
class TemplateFields:
    """The chat-template variables of a request's ``think`` (what ``conversation_prompt`` reads)."""

    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    # a chat that ends with an assistant message is Ollama's prefill: the reply continues that message
    continue_final_message: bool = False
    add_generation_prompt: bool = True


class OllamaFrontend(FrontendKit):
    """Thin translators between Ollama's API and the engine client."""

    error_paths = ("/api/",)
    public_paths = ("/", "/api/version")  # Ollama has no auth; the banner and the version hold no data
    root_priority = 1  # a web page mounted beside it keeps "/"
    any_body_type_paths = ("/api/",)  # Ollama's documented `curl -d '{...}'` sends a form content type

    def __init__(self, engine: Any, options: FrontendOptions) -> None:
        super().__init__(engine, options)
        self.facts = read_facts(options.model_root, engine.info.get("dtype"))
        self.names = self._accepted_names()
        self.template_renders_tools = "tools" in read_variables(self.tokenizer, options.chat_template)

    @staticmethod
    def render_error(error: APIError) -> tuple[int, dict[str, Any]]:
        return ollama_error(error)  # static: it shapes the server's refusals while the model loads too

    async def serve(self) -> None:  # HTTP only: the shared server runs the routes
        return None

    def http_router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/", self.banner, methods=["GET", "HEAD"], summary="Ollama's banner")
        router.add_api_route("/api/version", self.version, methods=["GET", "HEAD"], summary="Ollama version (API)")
        router.add_api_route("/api/tags", self.tags, methods=["GET", "HEAD"], summary="Local models (Ollama API)")
        router.add_api_route("/api/ps", self.ps, methods=["GET"], summary="Running models (Ollama API)")
        router.add_api_route("/api/show", self.show, methods=["POST"], summary="Model information (Ollama API)")
        # mounted whatever the model does: a model that cannot answer one is Ollama's 400 naming what it lacks
        router.add_api_route("/api/chat", self.chat, methods=["POST"], summary="Chat (Ollama API)")
        router.add_api_route("/api/generate", self.generate, methods=["POST"], summary="Generate (Ollama API)")
        router.add_api_route("/api/embed", self.embed, methods=["POST"], summary="Embeddings (Ollama API)")
        router.add_api_route(
            "/api/embeddings", self.embeddings, methods=["POST"], summary="One embedding (older Ollama API)"
        )
        router.add_api_route("/api/pull", self.pull, methods=["POST"], summary="Ollama's pull: see `llmp pull`")
        for path, methods in (
            ("/api/push", ["POST"]),
            ("/api/create", ["POST"]),
            ("/api/copy", ["POST"]),
            ("/api/delete", ["DELETE"]),
            ("/api/blobs/{digest}", ["HEAD", "POST"]),
        ):
            router.add_api_route(path, self.not_here, methods=methods, summary="Not available in llmp")
        return router

    # -- models ----------------------------------------------------------------------

    def _listed_names(self) -> list[tuple[str, str]]:
        """``(name, served name)`` of every name ``/api/tags`` lists: each served name and, for a
        packaged model, its Hub id and Ollama tags (``smollm2:135m``: the kit's ``model_aliases``),
        which requests may use too."""
        listed: dict[str, tuple[str, str]] = {}
        for served in self.model_names:
            others = [alias for alias, owner in self.model_aliases.items() if owner == served]
            for name in (served, *others):
                listed.setdefault(tagged(name).casefold(), (name, served))
        return list(listed.values())

    def _accepted_names(self) -> dict[str, str]:
        """Every name a request may use (case-insensitive, with or without ``:latest``) -> the served
        name: exactly the names ``/api/tags`` lists."""
        names: dict[str, str] = {}
        for name, served in self._listed_names():
            names.setdefault(tagged(name).casefold(), served)
        return names

    def resolve(self, name: str | None) -> str:
        """The served name a request's ``model`` selects; Ollama's 404 when none."""
        served = self.names.get(tagged(name or "").casefold()) or self.names.get(
            tagged(short_name(name or "")).casefold()
        )
        if served is None:
            raise APIError(404, f"model '{name}' not found", param="model")
        return served

    def capabilities(self) -> list[str]:
        """What Ollama's ``/api/show`` lists: tools only when calls can be parsed (``--tool-call-parser``
        with ``--enable-auto-tool-choice``, as Ollama's tools are always "auto") and the chat template
        shows the model its tools."""
        tasks = set(self.supported_tasks)
        out = []
        if "generate" in tasks:
            out.append("completion")
            if self.auto_tools and self.template_renders_tools:
                out.append("tools")
            if self.reasoning_parser is not None:
                out.append("thinking")
            if self.fim is not None:  # suffix: fill in the middle
                out.append("insert")
        if "embed" in tasks:
            out.append("embedding")
        return out

    def require(self, task: str, name: str, what: str) -> None:
        """Ollama's 400 for a route the served model cannot answer (``"x" does not support chat``)."""
        if task in self.supported_tasks:
            return
        if task == "embed":
            raise bad_request(
                f'"{name}" does not support embeddings: this server\'s model does not produce embeddings; '
                "serve an embedding model (`llmp serve all-minilm --frontend ollama`) or this model's "
                "embeddings (`llmp serve MODEL --convert embed --frontend ollama`)",
                "model",
            )
        raise bad_request(f'"{name}" does not support {what}: this server\'s model does not generate text', "model")

    def model_entry(self, name: str) -> dict[str, Any]:
        tagged_name = tagged(name)
        facts = self.facts
        return {
            "name": tagged_name,
            "model": tagged_name,
            "modified_at": facts.modified_at or now_rfc3339(),
            "size": facts.size,
            "digest": facts.digest,
            "details": facts.details(self.max_model_len),
            "capabilities": self.capabilities(),
        }

    async def banner(self) -> PlainTextResponse:
        return PlainTextResponse(BANNER)

    async def version(self) -> dict[str, str]:
        return {"version": OLLAMA_VERSION}

    async def tags(self) -> dict[str, Any]:
        return {"models": [self.model_entry(name) for name, _ in self._listed_names()]}

    async def ps(self) -> dict[str, Any]:
        on_gpu = str(self.engine.info.get("device", "cpu")).startswith("cuda")
        expires = (datetime.now(UTC) + FOREVER).isoformat().replace("+00:00", "Z")
        models = [
            {
                **self.model_entry(name),
                "expires_at": expires,
                "size_vram": self.facts.size if on_gpu else 0,
                "context_length": self.max_model_len,
            }
            for name in self.model_names
        ]
        return {"models": models}

    async def show(self, request: Request) -> dict[str, Any]:
        body = await p.read_body(request, p.ShowRequest)
        name = body.model or body.name
        if not name:
            raise bad_request("model is required", "model")
        self.resolve(name)
        template = self.options.chat_template or getattr(self.tokenizer, "chat_template", None) or ""
        if isinstance(template, dict):
            template = template.get("default") or next(iter(template.values()), "")
        if self.fim is not None:  # how Continue tells a model takes a suffix: its template reads .Suffix
            template += "{# fill in the middle: /api/generate's suffix, Ollama's .Suffix #}"
        parameters = "\n".join(f"{key:<30} {go_value(value)}" for key, value in self.parameters())
        modelfile = f"# Modelfile generated by llmp\nFROM {self.options.model_root}\n" + "".join(
            f"PARAMETER {line}\n" for line in parameters.splitlines()
        )
        return {
            "license": "",
            "modelfile": modelfile,
            "parameters": parameters,
            "template": template,
            "details": self.facts.details(self.max_model_len),
            "model_info": model_info(self.facts, name, self.max_model_len),
            "capabilities": self.capabilities(),
            "modified_at": self.facts.modified_at or now_rfc3339(),
        }

    def parameters(self) -> list[tuple[str, Any]]:
        """``/api/show``'s Modelfile parameters: the generation-config defaults under Ollama's names,
        the window a request gets (``num_ctx``) and the texts that end a reply (``stop``)."""
        out: list[tuple[str, Any]] = [
            (PARAMETER_NAMES[key], value) for key, value in self.defaults.items() if key in PARAMETER_NAMES
        ]
        out.append(("num_ctx", self.max_model_len))
        if "generate" in self.supported_tasks:
            out += [("stop", text) for text in stop_texts(self.tokenizer, self.options.model_root)]
        return out

    async def pull(self, request: Request) -> dict[str, str]:
        body = await p.read_body(request, p.ModelRequest)
        name = body.model or body.name
        try:
            self.resolve(name)
        except APIError:
            raise APIError(
                501,
                f"llmp does not pull models over the API: run `llmp pull {name}` on the server, then "
                f"`llmp serve {name}` (this server serves {', '.join(self.model_names)})",
            ) from None
        return {"status": "success"}  # the model is here already

    async def not_here(self, request: Request) -> None:
        raise APIError(
            501,
            f"{request.url.path} is not available: llmp serves the one model it was started with "
            f"({', '.join(self.model_names)}); manage models with `llmp pull`, `llmp ls` and `llmp rm`, "
            "and choose one with `llmp serve NAME`",
        )

    # -- generation --------------------------------------------------------------------

    def check_request(self, body: p.GenerationBase) -> None:
        if body.template:
            raise bad_request(
                "template: Ollama's Go templates are not supported; llmp renders the model's Jinja chat "
                "template (choose another with `llmp serve --chat-template`)",
                "template",
            )

    def template_fields(self, name: str, think: bool | str | None) -> TemplateFields:
        """The chat-template variables of ``think``: ``enable_thinking`` (when the template reads it)
        and, for a level, ``reasoning_effort`` ("max" is "high", as Ollama tells gpt-oss). Thinking
        needs the server's reasoning parser."""
        if think is None:
            return TemplateFields()
        if think is not False and self.reasoning_parser is None:
            raise bad_request(
                f'"{name}" does not support thinking: start llmp serve with --reasoning-parser NAME '
                "(the model's thinking format, e.g. deepseek_r1 or qwen3)",
                "think",
            )
        known = template_variables(self.tokenizer, self.options.chat_template)
        kwargs = {"enable_thinking": bool(think)} if "enable_thinking" in known else None
        effort = ("high" if think == "max" else think) if isinstance(think, str) else None
        return TemplateFields(chat_template_kwargs=kwargs, reasoning_effort=effort)

    def tools(self, body: p.ChatRequest) -> tuple[list[dict[str, Any]] | None, Any]:
        """The request's tools and the tool choice: Ollama's tools are always "auto", which needs
        the server's tool parser and a chat template that shows the model its tools (llmp's
        ``tool_choice`` extension may force a call)."""
        if not body.tools:
            if body.tool_choice not in (None, "none"):
                raise bad_request("tool_choice needs tools", "tool_choice")
            return None, None
        self.check_tools(body.tools, None)  # each a function with a name, before the template reads them
        if self.tool_parser is None or (body.tool_choice is None and not self.auto_tools):
            raise bad_request(
                f'"{body.model}" does not support tools: start llmp serve with --tool-call-parser NAME '
                "(the model's tool-call format, e.g. hermes or llama3_json) and --enable-auto-tool-choice",
                "tools",
            )
        if not self.template_renders_tools:
            raise bad_request(
                f'"{body.model}" does not support tools: its chat template does not show the model any '
                "tools; start llmp serve with a --chat-template that renders `tools`",
                "tools",
            )
        return body.tools, body.tool_choice or "auto"

    def load_reply(self, body: p.GenerationBase, chat: bool) -> dict[str, Any]:
        """Ollama's reply to a request with nothing to generate, which loads (or with keep_alive 0
        unloads) a model: llmp's one model stays loaded for the server's lifetime."""
        unload = p.keep_alive_seconds(body.keep_alive) == 0
        reply: dict[str, Any] = {"model": body.model, "created_at": now_rfc3339()}
        if chat:
            reply["message"] = {"role": self.options.response_role, "content": ""}
        else:
            reply["response"] = ""
        return {**reply, "done_reason": "unload" if unload else "load", "done": True}

    async def chat(self, request: Request) -> Any:
        started = time.perf_counter_ns()
        body = await p.read_body(request, p.ChatRequest)
        self.resolve(body.model)
        self.require("generate", body.model, "chat")
        self.check_request(body)
        run = Generation(self, body, request, model=body.model, chat=True, started=started)
        if not body.messages:
            return self.load_reply(body, chat=True)
        turns = conversation(body.messages)
        tools, tool_choice = self.tools(body)
        fields = self.template_fields(body.model, body.think)
        if turns[-1]["role"] == "assistant" and not turns[-1].get("tool_calls"):
            fields.continue_final_message, fields.add_generation_prompt = True, False
        # messages dropped until the prompt leaves the run its room (one token, or num_predict's)
        fits = run.window - run.room + 1
        prompt = await self.fitting_prompt(turns, fields, tools, fits, body.truncate is not False)
        if body.debug_render_only:
            run.fit(prompt.token_ids)  # what the window refuses (truncate: false) is refused here too
            return debug_reply(body, prompt.text or self.tokenizer.decode(prompt.token_ids), chat=True)
        return await run.start(prompt.token_ids, tools, tool_choice, text=prompt.text)

    async def fitting_prompt(
        self, turns: list[dict[str, Any]], fields: TemplateFields, tools: Any, window: int, truncate: bool
    ) -> Prompt:
        """The conversation's prompt, its oldest messages dropped until it is shorter than ``window``, as
        Ollama's ``chatPrompt`` does: system messages and the last user message
        (with what follows it) always stay; if those alone do not fit, the prompt is cut later, token-wise."""
        prompt = await self.conversation_prompt(turns, fields, tools)
        if not truncate or len(prompt.token_ids) < window:
            return prompt
        users = [i for i, turn in enumerate(turns) if turn["role"] == "user"]
        last_kept = users[-1] if users else len(turns) - 1
        for first in range(1, last_kept + 1):
            if turns[first - 1]["role"] == "system":  # kept anyway: nothing more was dropped
                continue
            kept = [turn for turn in turns[:first] if turn["role"] == "system"] + turns[first:]
            prompt = await self.conversation_prompt(kept, fields, tools)
            if len(prompt.token_ids) < window:
                break
        return prompt

    async def generate(self, request: Request) -> Any:
        started = time.perf_counter_ns()
        body = await p.read_body(request, p.GenerateRequest)
        self.resolve(body.model)
        self.require("generate", body.model, "generate")
        if body.raw and (body.template or body.system or body.context):
            raise bad_request("raw mode does not support template, system, or context", "raw")
        self.check_request(body)
        refuse_images(body.images, "images")
        if body.suffix and (body.raw or body.system or body.context):
            raise bad_request("suffix (insert) does not take raw, system or context", "suffix")
        run = Generation(self, body, request, model=body.model, chat=False, started=started)
        if not body.prompt:
            return self.load_reply(body, chat=False)
        context = list(body.context or [])
        self.check_token_ids(context, "context")
        if body.suffix:  # fill in the middle, in the model's own tokens (Ollama's template .Suffix)
            if self.fim is None:
                raise bad_request(f'"{body.model}" does not support insert', "suffix")
            if body.think:
                raise bad_request("think does not apply to an insertion (suffix)", "think")
            ids = (await self.fim_prompt(body.prompt, body.suffix)).token_ids
            text = self.tokenizer.decode(ids)
        elif body.raw:  # the prompt as written: no template
            text, ids = body.prompt, await self.encode(body.prompt, add_special_tokens=True)
        else:
            turns = [{"role": "system", "content": body.system}] if body.system else []
            turns.append({"role": "user", "content": body.prompt})
            fields = self.template_fields(body.model, body.think)
            prompt = await self.conversation_prompt(turns, fields)
            text, ids = prompt.text or "", prompt.token_ids
        if body.debug_render_only:  # as Ollama: the context's text, then the prompt's
            run.fit(context + ids)  # what the window refuses (truncate: false) is refused here too
            return debug_reply(body, self.tokenizer.decode(context) + text, chat=False)
        return await run.start(context + ids, text=None if context else text)

    # -- embeddings ---------------------------------------------------------------------

    async def embed(self, request: Request) -> dict[str, Any]:
        started = time.perf_counter_ns()
        body = await p.read_body(request, p.EmbedRequest)
        self.resolve(body.model)
        self.require("embed", body.model, "embeddings")
        options = read_options(body.options)
        texts = [body.input] if isinstance(body.input, str) else list(body.input)
        if texts in ([], [""]):  # Ollama answers an empty input with no embeddings
            return {"model": body.model, "embeddings": []}
        prompts = await self.prompt_inputs(texts, "input", True)
        prompts = self.fit_inputs(prompts, options.num_ctx, body.truncate)
        outputs = await until_disconnected(request, self.encode_all(prompts, self.pooling_params(normalize=True)))
        return {
            "model": body.model,
            "embeddings": [cut_embedding(output.outputs.embedding, body.dimensions) for output in outputs],
            "total_duration": time.perf_counter_ns() - started,
            "load_duration": 0,
            "prompt_eval_count": sum(len(prompt.token_ids) for prompt in prompts),
        }

    async def embeddings(self, request: Request) -> dict[str, Any]:
        """The older route: one prompt, its vector as the model computes it, not normalised (as Ollama's)."""
        body = await p.read_body(request, p.EmbeddingsRequest)
        self.resolve(body.model)
        self.require("embed", body.model, "embeddings")
        options = read_options(body.options)
        if not body.prompt:
            return {"embedding": []}
        prompts = self.fit_inputs(await self.prompt_inputs(body.prompt, "prompt", True), options.num_ctx, True)
        outputs = await until_disconnected(
            request, self.encode_all(prompts, PoolingParams(task="embed", normalize=False))
        )
        return {"embedding": outputs[0].outputs.embedding}

    def fit_inputs(self, prompts: list[Prompt], num_ctx: int | None, truncate: bool) -> list[Prompt]:
        """Each input within the context (``num_ctx``, at most ``--max-model-len``): its text's end cut
        off, the special tokens around it kept (``truncate``, Ollama's default, which leaves room for
        them), else a 400."""
        window = min(num_ctx or self.max_model_len, self.max_model_len)
        out = []
        for prompt in prompts:
            ids = prompt.token_ids
            if len(ids) > window:
                if not truncate:
                    raise bad_request(
                        f"the input length ({len(ids)} tokens) exceeds the context length ({window})", "input"
                    )
                ids = self._first_tokens(prompt, window)
            out.append(Prompt(token_ids=ids))
        return out

    def _first_tokens(self, prompt: Prompt, window: int) -> list[int]:
        ids = prompt.token_ids or []
        text_ids = self.tokenizer.encode(prompt.text, add_special_tokens=False) if prompt.text else []
        head, tail = special_tokens_around(ids, text_ids) if text_ids else ([], [])
        room = window - len(head) - len(tail)
        if (head or tail) and room >= 1:
            return [*head, *text_ids[:room], *tail]
        return list(ids[:window])

    async def encode_all(self, prompts: list[Prompt], params: PoolingParams) -> list[PoolingRequestOutput]:
        """One engine request per input, all refused together when the server cannot take them now."""
        if hasattr(self.engine, "check_capacity"):
            self.engine.check_capacity(len(prompts), "input")

        async def one(prompt: Prompt) -> PoolingRequestOutput:
            outputs = self.engine.encode(prompt, params, engine_request_id("embd"))
            async with contextlib.aclosing(outputs):
                async for output in outputs:
                    return output
            raise RuntimeError("the embedding request was aborted")

        tasks = [asyncio.ensure_future(one(prompt)) for prompt in prompts]
        try:
            return await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()


# -- conversions ----------------------------------------------------------------------


def tagged(name: str) -> str:
    """A model name as Ollama lists it: with ``:latest`` when its last path part has no tag."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def short_name(name: str) -> str:
    """``name`` without Ollama's default host and namespace (``registry.ollama.ai/library/x`` is ``x``),
    as Ollama's ``ParseName`` fills them in."""
    for prefix in ("registry.ollama.ai/", "library/"):
        if name.casefold().startswith(prefix):
            name = name[len(prefix) :]
    return name


def debug_reply(body: p.GenerationBase, rendered: str, chat: bool) -> dict[str, Any]:
    """Ollama's answer to ``_debug_render_only``: the prompt the model would be given, nothing generated."""
    reply: dict[str, Any] = {"model": body.model, "created_at": now_rfc3339()}
    reply.update({"message": {"role": "", "content": ""}} if chat else {"response": ""})
    return {**reply, "done": False, "_debug_info": {"rendered_template": rendered}}


def refuse_images(images: list[Any] | None, param: str) -> None:
    if images:
        raise bad_request("images are not supported: llmp serves text-only models", param)


def conversation(messages: list[p.Message]) -> list[dict[str, Any]]:
    """Ollama's messages as chat-template messages (OpenAI's shape, tool-call arguments as objects)."""
    turns = []
    for index, message in enumerate(messages):
        refuse_images(message.images, f"messages.{index}.images")
        turn: dict[str, Any] = {"role": message.role, "content": message.content or ""}
        if message.thinking and message.role == "assistant":
            turn["reasoning"] = message.thinking
        if message.tool_calls:
            turn["tool_calls"] = [
                {
                    "id": call.id or f"call_{index}_{k}",
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments, index)},
                }
                for k, call in enumerate(message.tool_calls)
            ]
        if message.tool_name:
            turn["name"] = message.tool_name
        if message.tool_call_id:
            turn["tool_call_id"] = message.tool_call_id
        turns.append(turn)
    return turns


def _arguments(arguments: dict[str, Any] | str | None, index: int) -> dict[str, Any]:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise bad_request(
                f"messages.{index}.tool_calls: arguments must be an object (or its JSON text)", "messages"
            ) from None
    if arguments is not None and not isinstance(arguments, dict):
        raise bad_request(f"messages.{index}.tool_calls: arguments must be an object", "messages")
    return arguments or {}


def cut_embedding(vector: list[float], dimensions: int | None) -> list[float]:
    """Ollama's ``dimensions``, for any model (vLLM's Matryoshka rule is not Ollama's): the first N
    values normalised again; 0 or less, or the whole vector or more, leaves it whole."""
    if dimensions is None or not 0 < dimensions < len(vector):
        return vector
    kept = vector[:dimensions]
    norm = math.sqrt(sum(value * value for value in kept)) or 1.0
    return [value / norm for value in kept]
