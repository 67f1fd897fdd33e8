"""Hugging Face Text Generation Inference's generate API, a subset, under ``/tgi``.

TGI's clients take the server's URL as their base: ``huggingface_hub.InferenceClient(
"http://HOST:8000/tgi")``, ``text_generation.Client("http://HOST:8000/tgi")``, LangChain's
``HuggingFaceEndpoint(endpoint_url="http://HOST:8000/tgi")``. The routes:

- ``POST /tgi/generate`` ``{"inputs": "...", "parameters": {...}}`` answers
  ``{"generated_text": "..."}``, with ``details`` when ``parameters.details`` is true.
- ``POST /tgi/generate_stream`` answers server-sent events, one a token:
  ``{"index", "token": {"id", "text", "logprob", "special"}, "generated_text": null, "details": null}``;
  the last one carries ``generated_text`` (the whole text) and ``details``.
- ``POST /tgi``, TGI's ``/`` (where ``InferenceClient`` posts): ``"stream": true`` in the body
  streams as ``/generate_stream``, else it answers as ``/generate`` (in a one-element list).

``parameters``: ``max_new_tokens`` (default 100), ``do_sample``, ``temperature``, ``top_k``,
``top_p``, ``repetition_penalty``, ``frequency_penalty``, ``seed``, ``stop``, ``details`` and
``return_full_text``. As in TGI, generation is greedy unless ``do_sample`` is true or
``temperature`` (other than 1), ``top_k`` or ``top_p`` is set. The others TGI knows (``best_of``,
``typical_p``, ``truncate``, ``watermark``, ``top_n_tokens``, ``grammar``, ``adapter_id``,
``decoder_input_details``) are refused when set. ``details`` holds ``finish_reason``,
``generated_tokens``, ``seed`` and ``tokens`` (no ``prefill``: its list is empty).

Errors take TGI's shape, ``{"error": "...", "error_type": "..."}``: a bad request is a 422
``validation`` error (TGI's status), an overloaded server a 429 ``overloaded``; the API key's 401
is rendered so too (``error_paths``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from llmp import Prompt, SamplingParams
from llmp.api import LLMPError
from llmp.frontend import APIError, FrontendKit, SamplingRequest, engine_request_id, json_text, until_disconnected
from pydantic import BaseModel, Field

PREFIX = "/tgi"
DEFAULT_MAX_NEW_TOKENS = 100  # TGI's
# TGI's parameters this server does not act on: refused when set (False and None are unset)
UNSUPPORTED = ("best_of", "typical_p", "truncate", "watermark", "top_n_tokens", "grammar", "adapter_id")
UNSUPPORTED += ("decoder_input_details",)
ERROR_TYPES = {401: "authentication", 403: "authentication", 404: "not_found", 429: "overloaded"}


class Parameters(BaseModel):
    max_new_tokens: int | None = Field(default=None, ge=1)
    do_sample: bool = False
    temperature: float | None = Field(default=None, gt=0)
    top_k: int | None = Field(default=None, gt=0)
    top_p: float | None = Field(default=None, gt=0, lt=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = Field(default=None, ge=0)
    stop: list[str] | None = None
    details: bool = False
    return_full_text: bool | None = None
    best_of: int | None = None
    typical_p: float | None = None
    truncate: int | None = None
    watermark: bool = False
    top_n_tokens: int | None = None
    grammar: Any = None
    adapter_id: str | None = None
    decoder_input_details: bool = False


class GenerateRequest(BaseModel):
    inputs: str
    parameters: Parameters = Field(default_factory=Parameters)
    stream: bool = False  # read by POST /tgi only


def tgi_error(error: APIError) -> tuple[int, dict[str, Any]]:
    """``(status, body)`` of an error in TGI's shape."""
    if error.code == "overloaded":
        return 429, {"error": error.message, "error_type": "overloaded"}
    if error.status in (400, 413, 422):
        return 422, {"error": error.message, "error_type": "validation"}
    kind = ERROR_TYPES.get(error.status) or ("generation" if error.status >= 500 else "validation")
    return error.status, {"error": error.message, "error_type": kind}


class TGIFrontend(FrontendKit):
    """Built by ``llmp serve`` once the engine is ready (see ``llmp.api.Frontend``)."""

    error_paths = (PREFIX,)  # every error on these paths, the gate's included, in TGI's shape

    def render_error(self, error: APIError) -> tuple[int, dict[str, Any]]:
        return tgi_error(error)

    def http_router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route(PREFIX, self.compat, methods=["POST"], summary="Generate, whole or streamed")
        router.add_api_route(f"{PREFIX}/generate", self.generate, methods=["POST"], summary="Generate")
        router.add_api_route(f"{PREFIX}/generate_stream", self.generate_stream, methods=["POST"], summary="Stream")
        return router

    async def serve(self) -> None:
        return None  # HTTP only: the shared server runs the routes

    async def compat(self, body: GenerateRequest, request: Request) -> Any:
        if body.stream:
            return await self.generate_stream(body)
        return [await self.generate(body, request)]

    async def generate(self, body: GenerateRequest, request: Request) -> dict[str, Any]:
        prompt, params = await self.prepare(body)
        return await until_disconnected(request, self.whole(body, prompt, params))

    async def generate_stream(self, body: GenerateRequest) -> StreamingResponse:
        prompt, params = await self.prepare(body)  # refused here, before the stream starts
        # the engine's work runs inside the response: cancelled with it when the client leaves
        return StreamingResponse(self.stream(body, prompt, params), media_type="text/event-stream")

    async def prepare(self, body: GenerateRequest) -> tuple[Prompt, SamplingParams]:
        p = body.parameters
        for name in UNSUPPORTED:
            if getattr(p, name) not in (None, False):
                raise APIError(422, f"parameters.{name} is not supported by this server", param=f"parameters.{name}")
        [prompt] = await self.prompt_inputs(body.inputs, "inputs", add_special_tokens=True)
        sampling = p.do_sample or p.temperature not in (None, 1.0) or p.top_k is not None or p.top_p is not None
        room = max(1, (self.max_model_len or DEFAULT_MAX_NEW_TOKENS) - len(prompt.token_ids))
        request = SamplingRequest(
            temperature=(p.temperature or 1.0) if sampling else 0.0,
            top_k=p.top_k if sampling else None,
            top_p=p.top_p if sampling else None,
            seed=p.seed,
            repetition_penalty=p.repetition_penalty,
            frequency_penalty=p.frequency_penalty,
            max_tokens=p.max_new_tokens or min(DEFAULT_MAX_NEW_TOKENS, room),
            stop=p.stop,
            logprobs=0,  # each sampled token's own: the stream's tokens and the details carry it
            names={name: f"parameters.{name}" for name in ("temperature", "top_k", "top_p", "seed", "stop")}
            | {"max_tokens": "parameters.max_new_tokens", "repetition_penalty": "parameters.repetition_penalty"},
        )
        return prompt, self.sampling_params(request, len(prompt.token_ids))  # a 4xx for a prompt beyond the context

    async def whole(self, body: GenerateRequest, prompt: Prompt, params: SamplingParams) -> dict[str, Any]:
        final = None
        async for final in self.engine.generate(prompt, params, engine_request_id("tgi")):
            pass
        sequence = final.outputs[0]
        answer: dict[str, Any] = {"generated_text": self.full_text(body, sequence.text)}
        if body.parameters.details:
            answer["details"] = {
                "finish_reason": finish_reason(sequence),
                "generated_tokens": len(sequence.token_ids),
                "seed": body.parameters.seed,
                "prefill": [],
                "tokens": [self.token(token_id, sequence, index) for index, token_id in enumerate(sequence.token_ids)],
            }
        return answer

    async def stream(self, body: GenerateRequest, prompt: Prompt, params: SamplingParams) -> AsyncIterator[str]:
        text, generated, last = "", 0, None
        try:
            async for output in self.engine.generate(prompt, params, engine_request_id("tgi"), delta=True):
                sequence = output.outputs[0]
                text += sequence.text
                for index, token_id in enumerate(sequence.token_ids):
                    if last is not None:  # one behind: the last token's event carries the whole text
                        yield event(last)
                    piece = sequence.text if index == len(sequence.token_ids) - 1 else ""
                    generated += 1
                    last = {"index": generated, "token": self.token(token_id, sequence, index, piece)}
                    last |= {"generated_text": None, "details": None}
                if sequence.finish_reason is not None and last is not None:
                    last["generated_text"] = self.full_text(body, text)
                    last["details"] = {
                        "finish_reason": finish_reason(sequence),
                        "generated_tokens": generated,
                        "input_length": len(prompt.token_ids),
                        "seed": body.parameters.seed,
                    }
        except LLMPError as error:  # the engine failed mid-stream: TGI's error event
            yield event({"error": str(error), "error_type": "generation"})
            return
        if last is not None:
            yield event(last)

    def token(self, token_id: int, sequence: Any, index: int, text: str | None = None) -> dict[str, Any]:
        """A generated token as TGI describes it: ``text`` is its piece of the streamed text (which
        adds up to the whole), else (``details``) the token's own text."""
        logprob = sequence.logprobs[index].get(token_id) if sequence.logprobs else None
        if text is None:
            text = logprob.decoded_token if logprob is not None and logprob.decoded_token else ""
        return {
            "id": token_id,
            "text": text,
            "logprob": logprob.logprob if logprob is not None else 0.0,
            "special": token_id in self.tokenizer.all_special_ids,
        }

    def full_text(self, body: GenerateRequest, text: str) -> str:
        return body.inputs + text if body.parameters.return_full_text else text


def finish_reason(sequence: Any) -> str:
    """TGI's name of why a sequence ended: ``length``, ``stop_sequence`` or ``eos_token``."""
    if sequence.finish_reason == "length":
        return "length"
    if isinstance(sequence.stop_reason, str):
        return "stop_sequence"
    return "eos_token"


def event(payload: dict[str, Any]) -> str:
    return f"data:{json_text(payload)}\n\n"
