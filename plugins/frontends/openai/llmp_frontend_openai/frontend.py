"""The OpenAI front-end: routes, and the checks and conversions every route shares."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from llmp.sampling_params import SamplingParams
from llmp.server.app import request_id_of, until_disconnected
from llmp.server.errors import APIError, as_api_error, bad_request
from llmp_frontend_openai import protocol as p
from llmp_frontend_openai.logprobs import TokenBytes

DONE = "data: [DONE]\n\n"


def sse(payload: Mapping[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


MAX_STOP_LENGTH = 1024


def sse_error(exc: BaseException) -> str:
    """An in-band error event: after the headers went out, the status can only travel in the stream."""
    return sse(as_api_error(exc).body())


class OpenAIFrontend:
    """Thin translators between the OpenAI API and the engine client (see ``llmp.api.Frontend``)."""

    def __init__(self, engine: Any, options: Mapping[str, Any]) -> None:
        self.engine = engine
        self.options = options
        self.model_names: list[str] = list(options["served_model_names"])
        self.model_name = self.model_names[0]
        self.max_model_len: int = options["max_model_len"]
        self.vocab_size: int | None = engine.info.get("vocab_size")
        self.task = options.get("task", "generate")
        self.tokenizer = engine.get_tokenizer()
        self.control_texts = _control_texts(self.tokenizer)
        self.token_bytes = TokenBytes(self.tokenizer)
        self.defaults = _generation_defaults(options.get("model_root"), options.get("generation_config", "auto"))
        self.created = int(time.time())

    # -- routes ----------------------------------------------------------------

    def http_router(self) -> APIRouter:
        from llmp_frontend_openai import chat, completions, embeddings, responses

        router = APIRouter()
        router.add_api_route("/v1/models", self.list_models, methods=["GET"], summary="Served models")
        router.add_api_route("/tokenize", self.tokenize, methods=["POST"], summary="Prompt or chat to token ids")
        router.add_api_route("/detokenize", self.detokenize, methods=["POST"], summary="Token ids to text")
        if self.task == "generate":
            chat.add_routes(router, self)
            completions.add_routes(router, self)
            responses.add_routes(router, self)
        if self.task == "embed":
            embeddings.add_routes(router, self)
        return router

    async def serve(self) -> None:  # HTTP only: the shared server runs the routes
        return None

    async def list_models(self) -> dict[str, Any]:
        data = [{"id": name, "object": "model", "created": self.created, "owned_by": "llmp",
                 "root": self.options.get("model_root") or name, "parent": None, "max_model_len": self.max_model_len}
                for name in self.model_names]
        return {"object": "list", "data": data}

    async def tokenize(self, body: p.TokenizeRequest) -> dict[str, Any]:
        self.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("give either 'prompt' or 'messages'", "prompt")
        if body.messages is not None:
            _, ids = await self.chat_prompt(body.messages, body, tools=body.tools)
        else:
            add = True if body.add_special_tokens is None else body.add_special_tokens
            ids = await asyncio.to_thread(self.tokenizer.encode, body.prompt, add_special_tokens=add)
        strs = self.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs}

    async def detokenize(self, body: p.DetokenizeRequest) -> dict[str, Any]:
        self.check_model(body.model)
        self.check_token_ids(body.tokens, "tokens")
        return {"prompt": await asyncio.to_thread(self.tokenizer.decode, body.tokens)}

    # -- shared checks -----------------------------------------------------------

    def check_model(self, name: str | None) -> None:
        if name and name not in self.model_names:
            raise APIError(404, f"The model `{name}` does not exist.", param="model", type="NotFoundError")

    def check_token_ids(self, ids: Sequence[int], param: str) -> None:
        limit = self.vocab_size
        bad = next((t for t in ids if t < 0 or (limit is not None and t >= limit)), None)
        if bad is not None:
            raise bad_request(f"token id {bad} in {param} is out of vocabulary (size {limit})", param)

    def check_caps(self, n: int, logprobs: int | None, prompt_logprobs: int | None) -> None:
        cap = self.options.get("max_n", 128)
        if n > cap:
            raise bad_request(f"n must be at most {cap} (--max-n), got {n}", "n")
        limit = self.options.get("max_logprobs", 20)
        for name, value in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
            if value is not None and limit >= 0 and value > limit:
                raise bad_request(f"{name}={value} exceeds the server's limit of {limit} (--max-logprobs)", name)

    def check_stop(self, stop: str | list[str] | None) -> None:
        """Stop strings are searched in every new piece of text: their number and length are bounded."""
        strings = [stop] if isinstance(stop, str) else list(stop or [])
        cap = self.options.get("max_stop_sequences", 64)
        if len(strings) > cap:
            raise bad_request(f"at most {cap} stop strings are allowed (--max-stop-sequences), got {len(strings)}",
                              "stop")
        longest = max(map(len, strings), default=0)
        if longest > MAX_STOP_LENGTH:
            raise bad_request(f"a stop string may be at most {MAX_STOP_LENGTH} characters long, got {longest}", "stop")
        if any(s == "" for s in strings):
            raise bad_request("stop strings must not be empty", "stop")

    def resolve_max_tokens(self, requested: int | None, prompt_len: int) -> int:
        """``max_tokens`` checked against the context; unset, the rest of it."""
        limit = self.max_model_len
        if requested is not None and requested > limit:
            raise bad_request(f"max_tokens={requested} cannot be greater than max_model_len={limit}", "max_tokens")
        wanted = requested if requested is not None else 1
        if prompt_len + wanted > limit:
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + wanted} tokens ({prompt_len} in the input, {wanted} for the completion). "
                "Please reduce the length of the input or of max_tokens.", "input_tokens")
        default = self.defaults.get("max_new_tokens")
        if requested is None and default is not None:
            return min(default, limit - prompt_len)
        return requested if requested is not None else limit - prompt_len

    def check_unsupported(self, body: p.SamplingFields) -> None:
        fmt = (body.response_format or {}).get("type", "text")
        if fmt != "text" or body.structured_outputs:
            raise bad_request("structured outputs (response_format, structured_outputs) are not supported by this "
                              "server yet", "response_format")
        if body.stream_options is not None and body.stream_options.model_fields_set and not body.stream:
            raise bad_request("stream_options can only be set when stream is true", "stream_options")
        if body.stream and body.prompt_logprobs is not None:
            raise bad_request("prompt_logprobs is not available when streaming", "prompt_logprobs")

    def sampling_params(self, body: p.SamplingFields, max_tokens: int, logprobs: int | None) -> SamplingParams:
        n = body.n if body.n is not None else 1
        self.check_caps(n, logprobs, body.prompt_logprobs)
        self.check_stop(body.stop)
        try:
            logit_bias = {int(k): v for k, v in (body.logit_bias or {}).items()}
        except ValueError:
            raise bad_request("logit_bias keys must be token ids", "logit_bias") from None
        self.check_token_ids(list(logit_bias), "logit_bias")
        self.check_token_ids(body.allowed_token_ids or [], "allowed_token_ids")
        defaults = self.defaults
        temperature = _or(body.temperature, defaults.get("temperature", 1.0))
        if n > 1 and temperature == 0:
            raise bad_request("n > 1 needs sampling: with temperature 0 every choice would be the same", "n")
        try:
            return SamplingParams(
                n=n, temperature=temperature, top_p=_or(body.top_p, defaults.get("top_p", 1.0)),
                top_k=_or(body.top_k, defaults.get("top_k", 0)), min_p=_or(body.min_p, defaults.get("min_p", 0.0)),
                presence_penalty=_or(body.presence_penalty, 0.0), frequency_penalty=_or(body.frequency_penalty, 0.0),
                repetition_penalty=_or(body.repetition_penalty, defaults.get("repetition_penalty", 1.0)),
                seed=body.seed, max_tokens=max_tokens,
                min_tokens=body.min_tokens, stop=body.stop, stop_token_ids=body.stop_token_ids,
                ignore_eos=body.ignore_eos, include_stop_str_in_output=body.include_stop_str_in_output,
                logprobs=logprobs, prompt_logprobs=body.prompt_logprobs, logit_bias=logit_bias or None,
                allowed_token_ids=body.allowed_token_ids, skip_special_tokens=body.skip_special_tokens,
                spaces_between_special_tokens=body.spaces_between_special_tokens,
            )
        except ValueError as exc:
            match = re.match(r"[a-z_]+", str(exc))
            raise bad_request(str(exc), match.group(0) if match else None) from None

    # -- prompts -----------------------------------------------------------------

    async def chat_prompt(self, messages: Sequence[p.ChatMessage], body: Any,
                          tools: Any = None) -> tuple[str, list[int]]:
        """The rendered conversation and its token ids.

        Text in a message that spells a special token (``<|im_end|>``) stays text: it is
        tokenized as such, never as the control token, so a user cannot forge turns.
        """
        conversation = [_message_dict(m) for m in messages]
        text = await self._render(conversation, body, tools)
        add_special = bool(getattr(body, "add_special_tokens", False))
        literal = {i: m["content"] for i, m in enumerate(conversation) if self._spells_control(m["content"])}
        if not literal:
            return text, await self.encode(text, add_special)
        marked = [{**m, "content": _marker(i)} if i in literal else m for i, m in enumerate(conversation)]
        rendered = await self._render(marked, body, tools)
        return text, await asyncio.to_thread(self._encode_literal, rendered, literal, add_special)

    def _spells_control(self, content: str) -> bool:
        return any(token in content for token in self.control_texts)

    def _encode_literal(self, rendered: str, literal: dict[int, str], add_special: bool) -> list[int]:
        pieces = _MARKER.split(rendered)  # template text, message index, template text, ...
        if len(pieces) != 2 * len(literal) + 1:
            raise bad_request("a message spells a special token, and the chat template transforms message "
                              "content, so it cannot be kept literal", "messages")
        ids: list[int] = []
        for k, piece in enumerate(pieces):
            if k % 2:
                ids += self.tokenizer.encode(literal[int(piece)], add_special_tokens=False, split_special_tokens=True)
            elif piece:
                ids += self.tokenizer.encode(piece, add_special_tokens=add_special and k == 0)
        return ids

    async def _render(self, conversation: list[dict[str, Any]], body: Any, tools: Any) -> str:
        from llmp.chat_template import render_chat

        template = getattr(body, "chat_template", None)
        if template is not None and not self.options.get("trust_request_chat_template"):
            raise bad_request("Refused request with untrusted chat template: start the server with "
                              "--trust-request-chat-template to allow one", "chat_template")
        kwargs = getattr(body, "chat_template_kwargs", None)
        if kwargs and not self.options.get("trust_request_chat_template"):
            self._check_template_kwargs(kwargs, template)
        if getattr(body, "continue_final_message", False) and getattr(body, "add_generation_prompt", False):
            raise bad_request("continue_final_message and add_generation_prompt cannot both be true; "
                              "set add_generation_prompt to false", "continue_final_message")
        try:
            return await asyncio.to_thread(
                render_chat, self.tokenizer, conversation,
                chat_template=template or self.options.get("chat_template"),
                add_generation_prompt=getattr(body, "add_generation_prompt", True),
                continue_final_message=getattr(body, "continue_final_message", False),
                tools=tools, chat_template_kwargs=getattr(body, "chat_template_kwargs", None),
                model_name=f"the model {self.model_name}",
            )
        except APIError:
            raise
        except Exception as exc:  # template errors (jinja's, sandbox violations) are the request's fault
            raise bad_request(f"the chat template could not be applied: {type(exc).__name__}: {exc}",
                              "messages") from None

    def _check_template_kwargs(self, kwargs: Mapping[str, Any], template: str | None) -> None:
        """Only variables the chat template reads may be set (``enable_thinking``), so a request
        cannot reach transformers' own arguments (``tokenize``) or anything else."""
        from llmp.chat_template import template_variables

        known = template_variables(self.tokenizer, template or self.options.get("chat_template"))
        unknown = sorted(set(kwargs) - known)
        if unknown:
            allowed = ", ".join(sorted(known)) or "none"
            raise bad_request(f"chat_template_kwargs {', '.join(map(repr, unknown))} are not variables of the chat "
                              f"template (it reads: {allowed}); start the server with "
                              "--trust-request-chat-template to pass others", "chat_template_kwargs")

    async def prompt_inputs(self, value: Any, param: str, add_special_tokens: bool) -> list[tuple[str | None, list[int]]]:
        """Text and token ids of each prompt of a ``str | list[str] | list[int] | list[list[int]]`` field."""
        if isinstance(value, str) or (value and all(isinstance(t, int) for t in value)):
            value = [value]
        if not value:
            raise bad_request(f"{param} must not be empty", param)
        prompts = []
        for item in value:
            if isinstance(item, str):
                text, ids = item, await self.encode(item, add_special_tokens)
            else:
                self.check_token_ids(item, param)
                text, ids = None, list(item)
            if not ids or item == "":  # "" is empty even when the tokenizer adds BOS/CLS
                raise bad_request(f"{param} must not hold an empty string or list", param)
            prompts.append((text, ids))
        return prompts

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens=add_special_tokens)

    # -- responses ----------------------------------------------------------------

    def new_id(self, request: Request, prefix: str, body: Any = None) -> str:
        given = getattr(body, "request_id", None)
        return f"{prefix}-{given or request_id_of(request)}"

    async def respond(self, request: Request, stream: bool, make: Any) -> Any:
        """Run a handler's generation: a streamed response, or the JSON body once done (aborted on disconnect)."""
        if stream:
            return StreamingResponse(make(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return JSONResponse(await until_disconnected(request, make()))


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


_MARKER = re.compile("\ue000llmp(\\d+)\ue001")


def _marker(index: int) -> str:
    return f"\ue000llmp{index}\ue001"  # private-use characters: no text or template makes them


def _control_texts(tokenizer: Any) -> list[str]:
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    texts = {t.content for t in added.values() if getattr(t, "special", False)}
    texts.update(getattr(tokenizer, "all_special_tokens", []) or [])
    return sorted(t for t in texts if t)


GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")


def _generation_defaults(model_dir: str | None, source: str) -> dict[str, Any]:
    """Sampling defaults from the model's ``generation_config.json`` (``--generation-config auto``)."""
    if source != "auto" or not model_dir:
        return {}
    try:
        with open(f"{model_dir}/generation_config.json") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: config[k] for k in GENERATION_DEFAULTS if isinstance(config.get(k), int | float)}


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _message_dict(message: p.ChatMessage) -> dict[str, Any]:
    data = message.model_dump(exclude_none=True)
    content = data.get("content")
    if isinstance(content, list):
        data["content"] = "\n".join(_text_part(part) for part in content)
    elif content is None:
        data["content"] = ""
    return data


def _text_part(part: Mapping[str, Any]) -> str:
    kind = part.get("type")
    if kind in ("text", "input_text", "output_text"):
        return str(part.get("text", ""))
    raise bad_request(f"content parts of type {kind!r} are not supported: this model takes text", "messages")


def engine_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
