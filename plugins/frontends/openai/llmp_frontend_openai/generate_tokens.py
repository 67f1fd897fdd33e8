"""``POST /inference/v1/generate`` (vLLM's tokens-in, tokens-out route): a ``GenerateRequest``, the
object the render routes answer, run as it is: its ``token_ids`` are the prompt (no chat template,
no tokenizer), its ``sampling_params`` are ``SamplingParams`` fields under vLLM's names, and each
choice answers token ids, no text.

The sampling fields go through the kit's one path (the server's caps and checks; a field left out
takes the model's generation-config default, as on the other routes), each error naming
``sampling_params.FIELD``. ``detokenize`` (vLLM's) is taken, true or false: this route answers no
text either way. ``features`` (multimodal inputs) and ``kv_transfer_params`` are refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request

from llmp import Prompt, ReasoningMarkers, RequestOutputKind, SamplingParams, StructuredOutputsParams
from llmp.frontend import FrontendKit, SamplingRequest, bad_request, engine_request_id, request_id_of
from llmp_frontend_openai import protocol as p
from llmp_frontend_openai.logprobs import chat_logprobs, prompt_logprobs
from llmp_frontend_openai.wire import DONE, sse, sse_error, stream_usage, usage

if TYPE_CHECKING:
    from llmp_frontend_openai.frontend import OpenAIFrontend

# SamplingParams fields a GenerateRequest may set: all but the ones this route decides
SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingRequest)} - {"names"}
TAKEN = {"detokenize", "output_kind"}  # vLLM's / SamplingParams's, checked below


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> None:
    async def generate(body: p.GenerateRequest, request: Request) -> Any:
        return await TokenGeneration(fe, body, request).run()

    router.add_api_route(
        "/inference/v1/generate",
        generate,
        methods=["POST"],
        summary="Token ids in, token ids out: run a GenerateRequest (what the render routes answer)",
    )


class TokenGeneration:
    def __init__(self, fe: OpenAIFrontend, body: p.GenerateRequest, request: Request) -> None:
        self.fe, self.body, self.request = fe, body, request
        self.id = body.request_id or f"generate-tokens-{request_id_of(request)}"

    async def run(self) -> Any:
        fe, body = self.fe, self.body
        lora = await fe.lora_for(body.model)
        if body.features is not None:
            raise bad_request(
                "features (multimodal inputs) are not supported: llmp's models take token ids", "features"
            )
        if body.kv_transfer_params:
            raise bad_request("kv_transfer_params is not supported: llmp has no KV transfer", "kv_transfer_params")
        if body.stream_options is not None and body.stream_options.model_fields_set and not body.stream:
            raise bad_request("stream_options can only be set when stream is true", "stream_options")
        if not body.token_ids:
            raise bad_request("token_ids must hold at least one token", "token_ids")
        fe.check_token_ids(body.token_ids, "token_ids")
        prompt = fe.engine_prompt(Prompt(token_ids=list(body.token_ids)), cache_salt=body.cache_salt)
        self.params = await self.sampling_params()
        if body.stream and self.params.prompt_logprobs is not None:
            raise bad_request("prompt_logprobs is not available when streaming", "sampling_params.prompt_logprobs")
        self.prompt_len = len(body.token_ids)
        self.outputs = fe.engine.generate(
            prompt,
            self.params,
            engine_request_id("generate-tokens"),
            lora_request=lora,
            priority=body.priority,
            delta=body.stream,
        )
        return await fe.respond(self.request, body.stream, self.stream if body.stream else self.whole)

    async def sampling_params(self) -> SamplingParams:
        fe, given = self.fe, dict(self.body.sampling_params)
        names = {name: f"sampling_params.{name}" for name in SAMPLING_FIELDS}
        unknown = sorted(set(given) - SAMPLING_FIELDS - TAKEN - {"stop_strings"})
        if unknown:
            raise bad_request(f"unknown sampling parameter(s): {', '.join(unknown)}", f"sampling_params.{unknown[0]}")
        if given.pop("detokenize", True) not in (True, False):
            raise bad_request("detokenize must be true or false", "sampling_params.detokenize")
        kind = given.pop("output_kind", RequestOutputKind.CUMULATIVE)
        if kind not in (RequestOutputKind.CUMULATIVE, RequestOutputKind.CUMULATIVE.name):
            raise bad_request("output_kind is the route's to set (stream or not)", "sampling_params.output_kind")
        if "stop_strings" in given:  # SamplingParams's own list, as asdict writes it: the same as stop
            strings = given.pop("stop_strings")
            if given.setdefault("stop", strings) != strings:
                raise bad_request("give stop or stop_strings, not both", "sampling_params.stop_strings")
        constraint = given.pop("structured_outputs", None)
        markers = given.pop("reasoning_markers", None)
        try:
            constraint = None if constraint is None else StructuredOutputsParams(**constraint)
            markers = None if markers is None else ReasoningMarkers(**markers)
            request = SamplingRequest(**given, structured_outputs=constraint, reasoning_markers=markers, names=names)
        except (TypeError, ValueError) as exc:
            field = getattr(exc, "field", None)
            param = f"sampling_params.{field}" if field else "sampling_params"
            raise bad_request(f"sampling_params: {exc}", param) from None
        if request.thinking_token_budget is not None and markers is None:
            request = dataclasses.replace(
                request, reasoning_markers=fe.reasoning_markers(self.body.token_ids, names["thinking_token_budget"])
            )
        await fe.check_constraint(constraint, "sampling_params.structured_outputs")
        # the kit's one path (caps, checks, defaults); OpenAIFrontend's own takes a request body
        return FrontendKit.sampling_params(fe, request, len(self.body.token_ids))

    def _choice(self, seq: Any) -> dict[str, Any]:
        top = self.params.logprobs
        logprobs = None
        if top is not None and seq.logprobs is not None:
            logprobs = chat_logprobs(seq.token_ids, seq.logprobs, top, True, self.fe.token_bytes)
        return {
            "index": seq.index,
            "logprobs": logprobs,
            "finish_reason": seq.finish_reason,
            "token_ids": seq.token_ids,
        }

    async def whole(self) -> dict[str, Any]:
        final = None
        async for final in self.outputs:
            pass
        generated = sum(len(seq.token_ids) for seq in final.outputs)
        return {
            "request_id": self.id,
            "choices": [self._choice(seq) for seq in final.outputs],
            "prompt_logprobs": prompt_logprobs(final.prompt_logprobs)
            if self.params.prompt_logprobs is not None
            else None,
            "kv_transfer_params": None,
            "usage": usage(self.prompt_len, generated),
        }

    async def stream(self) -> AsyncIterator[str]:
        include_usage, continuous = stream_usage(self.body.stream_options, self.fe.options.enable_force_include_usage)
        generated = 0
        try:
            async for output in self.outputs:
                for seq in output.outputs:
                    if not (seq.token_ids or seq.finish_reason):
                        continue
                    generated += len(seq.token_ids)
                    counted = usage(self.prompt_len, generated) if continuous else None
                    yield sse({"request_id": self.id, "choices": [self._choice(seq)], "usage": counted})
            if include_usage:
                yield sse({"request_id": self.id, "choices": [], "usage": usage(self.prompt_len, generated)})
        except Exception as exc:  # after the headers: report in-band and end; [DONE] marks success only
            yield sse_error(exc)
            return
        yield DONE
