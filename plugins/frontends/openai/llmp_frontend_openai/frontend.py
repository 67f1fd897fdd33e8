"""The OpenAI front-end: routes, and the checks and conversions every route shares."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from llmp import BeamSearchParams, Prompt, SamplingParams, StructuredOutputsParams
from llmp.frontend import (
    APIError,
    FrontendKit,
    SamplingRequest,
    bad_request,
    request_id_of,
    until_disconnected,
)
from llmp.options import FrontendOptions
from llmp_frontend_openai import protocol as p

# vLLM's and OpenAI's request fields for what llmp does not do: each at its idle value, or a 400 (never ignored)
NOT_DONE: dict[str, tuple[Any, str]] = {
    "functions": (None, "give them as tools (the legacy functions field is not supported)"),
    "function_call": (None, "give it as tool_choice (the legacy function_call field is not supported)"),
    "audio": (None, "llmp answers in text only"),
    "conversation": (None, "llmp keeps no conversations; continue a stored response with previous_response_id"),
    "repetition_detection": (None, "llmp does not stop on detected repetition"),
    "kv_transfer_params": (None, "llmp has no disaggregated prefill"),
    "vllm_xargs": (None, "llmp has no per-request logits-processor arguments"),
    "prompt_embeds": (None, "this model takes token ids"),
    "ec_transfer_params": (None, "llmp has no encoder-cache transfer"),
    "logprob_token_ids": (None, "llmp returns the top logprobs (logprobs, top_logprobs), not those of given ids"),
    "watermarking": (False, "llmp does not watermark its output"),
    "stream_interval": (1, "llmp streams each step's tokens as they come"),
    "truncation_side": ("left", "truncate_prompt_tokens keeps the prompt's end (truncation_side left)"),
}


# sampling fields beam search has no place for: at their defaults, or a 400 (never ignored)
BEAM_SEARCH_IDLE = (
    "top_p",
    "top_k",
    "min_p",
    "typical_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "seed",
    "stop",
    "stop_token_ids",
    "bad_words",
    "allowed_token_ids",
    "min_tokens",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "thinking_token_budget",
)

# values of those fields that change nothing (clients send them always): beam search takes them
NEUTRAL = {
    "top_p": (1.0,),
    "top_k": (0, -1),
    "min_p": (0.0,),
    "typical_p": (1.0,),
    "frequency_penalty": (0.0,),
    "presence_penalty": (0.0,),
    "repetition_penalty": (1.0,),
    "min_tokens": (0,),
    "logprobs": (False,),
}

VOCABULARY_FILES = ("vocab_file", "merges_file")  # paths on the server's disk, left out of /tokenizer_info (as vLLM)
GUIDED = ("json", "regex", "choice", "grammar")  # guided_<name>: older vLLM's structured_outputs.<name>


class OpenAIFrontend(FrontendKit):
    """Thin translators between the OpenAI API and the engine client (see ``llmp.api.Frontend``)."""

    def __init__(self, engine: Any, options: FrontendOptions) -> None:
        super().__init__(engine, options)
        self.batches: Any = None  # the Files and Batch APIs' jobs (batches.BatchService), once routed

    # -- routes ----------------------------------------------------------------

    def http_router(self) -> APIRouter:
        from llmp_frontend_openai import (
            batches,
            chat,
            chat_batch,
            classify,
            cohere_embed,
            completions,
            embeddings,
            generate_tokens,
            lora,
            pooling,
            render,
            responses,
            scoring,
        )

        router = APIRouter()
        router.add_api_route("/v1/models", self.list_models, methods=["GET"], summary="Served models")
        router.add_api_route(
            "/v1/models/{model_id:path}", self.retrieve_model, methods=["GET"], summary="One served model or adapter"
        )
        router.add_api_route("/tokenize", self.tokenize, methods=["POST"], summary="Prompt or chat to token ids")
        router.add_api_route("/detokenize", self.detokenize, methods=["POST"], summary="Token ids to text")
        if self.options.enable_tokenizer_info_endpoint:
            router.add_api_route(
                "/tokenizer_info", self.tokenizer_info, methods=["GET"], summary="The tokenizer's configuration"
            )
        # each route only where the model can do its task (vLLM's rule): the others are 404s
        tasks = set(self.supported_tasks)
        if "generate" in tasks:
            chat.add_routes(router, self)
            chat_batch.add_routes(router, self)
            completions.add_routes(router, self)
            render.add_routes(router, self)
            generate_tokens.add_routes(router, self)
            responses.add_routes(router, self)
        if "embed" in tasks:
            embeddings.add_routes(router, self)
            cohere_embed.add_routes(router, self)
        if "score" in tasks:
            scoring.add_routes(router, self)
        if "classify" in tasks:
            classify.add_routes(router, self)
        if tasks.intersection(pooling.POOLING_ROUTE_TASKS):
            pooling.add_routes(router, self)
        if self.options.enable_lora_runtime_updates:
            lora.add_routes(router, self)
        self.batches = batches.add_routes(router, self)  # last: a batch line may name any route above
        return router

    # vLLM serves these beside generation; issue 28 puts them with the management routes
    admin_paths = ("/v1/chat/completions/render", "/v1/completions/render")

    @property
    def upload_paths(self) -> dict[str, tuple[int, str]]:
        """Paths the server's gate lets multipart bodies through, with their size limits and the 413's message."""
        from llmp_frontend_openai.batches import file_too_large, upload_limit

        return {"/v1/files": (upload_limit(self.options), file_too_large(self.options))}

    async def serve(self) -> None:
        """Run the batch jobs for the server's life (the shared server runs the HTTP routes)."""
        if self.batches is not None:
            await self.batches.serve()

    async def list_models(self) -> dict[str, Any]:
        """The served names, then the LoRA adapters (``parent``: their base model), as vLLM lists them."""
        return {"object": "list", "data": self.model_cards()}

    async def retrieve_model(self, model_id: str) -> dict[str, Any]:
        """OpenAI's ``GET /v1/models/{model}`` (the SDKs' ``models.retrieve``): its card from the list, else a 404."""
        card = next((card for card in self.model_cards() if card["id"] == model_id), None)
        if card is None:
            raise APIError(404, f"The model `{model_id}` does not exist.", param="model", type="NotFoundError")
        return card

    async def tokenize(self, body: p.TokenizeRequest) -> dict[str, Any]:
        self.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("give either 'prompt' or 'messages'", "prompt")
        if body.messages is not None:
            ids = (await self.chat_prompt(body.messages, body, tools=body.tools)).token_ids
        else:
            add = True if body.add_special_tokens is None else body.add_special_tokens
            ids = await asyncio.to_thread(self.tokenizer.encode, body.prompt, add_special_tokens=add)
        strs = self.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs}

    async def detokenize(self, body: p.DetokenizeRequest) -> dict[str, Any]:
        self.check_model(body.model)
        self.check_token_ids(body.tokens, "tokens")
        return {"prompt": await asyncio.to_thread(self.tokenizer.decode, body.tokens)}

    async def tokenizer_info(self) -> dict[str, Any]:
        """vLLM's ``GET /tokenizer_info``: the arguments the tokenizer was made with (less its vocabulary
        files' paths; added tokens as their text), its class, and the server's chat template where
        ``--chat-template`` set one."""
        # llmp's light tokenizer stands for transformers' one, whose class and arguments these are
        tokenizer = getattr(self.tokenizer, "transformers_tokenizer", self.tokenizer)
        info = {key: _plain(value) for key, value in tokenizer.init_kwargs.items() if key not in VOCABULARY_FILES}
        info["tokenizer_class"] = type(tokenizer).__name__
        if self.options.chat_template is not None:
            info["chat_template"] = self.options.chat_template
        return info

    # -- shared checks -----------------------------------------------------------

    def check_unsupported(self, body: p.SamplingFields) -> None:
        if body.stream_options is not None and body.stream_options.model_fields_set and not body.stream:
            raise bad_request("stream_options can only be set when stream is true", "stream_options")
        if body.stream and body.prompt_logprobs is not None:
            raise bad_request("prompt_logprobs is not available when streaming", "prompt_logprobs")
        for name, (idle, why) in NOT_DONE.items():
            value = getattr(body, name, idle)
            if value not in (idle, None) and value != {}:
                raise bad_request(f"{name} is not supported: {why}", name)
        modalities = getattr(body, "modalities", None)
        if modalities is not None and set(modalities) - {"text"}:
            raise bad_request(f"modalities {modalities!r}: llmp answers in text only", "modalities")

    def beam_search_width(self, body: p.SamplingFields) -> int | None:
        """With ``use_beam_search`` (vLLM's), the beam width (``n``), once the fields beam search has
        no place for are checked; None without it (then ``length_penalty`` must stay 1)."""
        if not body.use_beam_search:
            if body.length_penalty != 1.0:
                raise bad_request("length_penalty applies to beam search: set use_beam_search", "length_penalty")
            return None
        for name in BEAM_SEARCH_IDLE:
            value, default = getattr(body, name, None), type(body).model_fields.get(name)
            idle = [None, {}, [], *NEUTRAL.get(name, ()), *([default.default] if default is not None else [])]
            if value not in idle:
                raise bad_request(f"{name} does not apply to beam search (use_beam_search)", name)
        width = 1 if body.n is None else body.n
        if not 1 <= width <= self.options.max_n:
            raise bad_request(f"n (the beam width) must be between 1 and {self.options.max_n}, got {width}", "n")
        return width

    def beam_search_params(
        self, width: int, body: p.SamplingFields, params: SamplingParams, constraint: Any
    ) -> BeamSearchParams:
        """The beam search of a request whose sampling parameters (``n`` 1) are ``params``."""
        if constraint is not None:
            raise bad_request(
                "beam search cannot follow a constraint (response_format, structured_outputs, a required tool call)",
                "use_beam_search",
            )
        return BeamSearchParams(
            beam_width=width,
            max_tokens=params.max_tokens,
            ignore_eos=params.ignore_eos,
            temperature=params.temperature,
            length_penalty=body.length_penalty,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )

    def structured_outputs_of(
        self, body: p.SamplingFields, response_format: Mapping[str, Any] | None = None
    ) -> StructuredOutputsParams | None:
        """The request's constraint: ``response_format`` (the body's, or the one given: the Responses API's
        ``text.format``) or ``structured_outputs``, whose json, regex, choice and grammar older vLLM clients
        send as ``guided_json`` ... (taken as those)."""
        given_guided = {name: getattr(body, f"guided_{name}") for name in GUIDED}
        guided = {name: value for name, value in given_guided.items() if value is not None}
        if guided and body.structured_outputs:
            raise bad_request("give structured_outputs or the older guided_* fields, not both", "structured_outputs")
        given = response_format if response_format is not None else body.response_format
        return self.structured_outputs(given, guided or body.structured_outputs)

    def engine_prompts(
        self, prompts: list[Prompt], body: p.SamplingFields, truncate_prompt_tokens: int | None = None
    ) -> list[Prompt]:
        """The prompts as the engine runs them (``FrontendKit.engine_prompt``): salted with the body's
        ``cache_salt`` and cut to their last ``truncate_prompt_tokens`` tokens."""
        return [
            self.engine_prompt(prompt, truncate_prompt_tokens=truncate_prompt_tokens, cache_salt=body.cache_salt)
            for prompt in prompts
        ]

    async def chat_prompt(self, messages: Sequence[p.ChatMessage], body: Any, tools: Any = None) -> Prompt:
        """The engine's prompt of a chat: its rendered text and token ids (``FrontendKit.conversation_prompt``)."""
        return await self.conversation_prompt([_message_dict(m) for m in messages], body, tools)

    def sampling_params(
        self,
        body: p.SamplingFields,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int | None,
        logprobs: int | None,
        structured_outputs: StructuredOutputsParams | None = None,
        skip_special_tokens: bool | None = None,
        names: Mapping[str, str] | None = None,
    ) -> SamplingParams:
        """The engine's sampling parameters of a chat, completion or response request (the kit's one
        path); ``names`` maps a SamplingParams field to the request's own name for it."""
        budget = body.thinking_token_budget
        request = SamplingRequest.from_body(
            body,
            max_tokens=max_tokens,
            logprobs=logprobs,
            skip_special_tokens=body.skip_special_tokens if skip_special_tokens is None else skip_special_tokens,
            structured_outputs=structured_outputs,
            reasoning_markers=self.reasoning_markers(prompt_ids) if budget is not None else None,
            names=names or {},
        )
        return super().sampling_params(request, len(prompt_ids))

    # -- responses ----------------------------------------------------------------

    def new_id(self, request: Request, prefix: str, body: Any = None) -> str:
        """The response's id: the ``X-Request-Id`` header's, else the body's ``request_id``, else a new one
        (vLLM's order: the header wins)."""
        given = None if "x-request-id" in request.headers else getattr(body, "request_id", None)
        return f"{prefix}-{given or request_id_of(request)}"

    async def respond(self, request: Request, stream: bool, make: Any) -> Any:
        """Run a handler's generation: a streamed response, or the JSON body once done (aborted on disconnect)."""
        if stream:
            return StreamingResponse(
                make(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            )
        return JSONResponse(await until_disconnected(request, make()))


def _plain(value: Any) -> Any:
    """A tokenizer argument as JSON: an ``AddedToken`` as its text, the rest as it is (or its text)."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)


def _message_dict(message: p.ChatMessage) -> dict[str, Any]:
    data = message.model_dump(exclude_none=True)
    content = data.get("content")
    if isinstance(content, list):  # text parts, as the chat template takes them (--chat-template-content-format)
        data["content"] = [{"type": "text", "text": _text_part(part)} for part in content]
    if isinstance(data.get("tool_calls"), list):  # chat templates read the arguments as a mapping
        data["tool_calls"] = [_template_tool_call(call) for call in data["tool_calls"]]
    if "reasoning" not in data and isinstance(data.get("reasoning_content"), str):
        data["reasoning"] = data["reasoning_content"]
    return data


def _template_tool_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        raise bad_request("an assistant tool call's arguments must be JSON text", "messages") from None
    return {**call, "function": {**function, "arguments": arguments}}


def _text_part(part: Mapping[str, Any]) -> str:
    kind = part.get("type")
    if kind in ("text", "input_text", "output_text"):
        return str(part.get("text", ""))
    raise bad_request(f"content parts of type {kind!r} are not supported: this model takes text", "messages")
