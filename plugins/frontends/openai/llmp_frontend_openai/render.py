"""``POST /v1/chat/completions/render`` and ``POST /v1/completions/render`` (vLLM's render routes).

They take the body of the generating route and run its own preparation (``ChatCompletion.prepare``,
``Completion.prepare``: model check, chat template, tokens, sampling checks), so a bad field is the
same error; then they answer what the engine would be given, as vLLM's ``GenerateRequest``, and
send the engine nothing. A chat is one object, a completion a list (one per prompt). ``prompt``
(the rendered text) is an addition to vLLM's shape; ``features`` (multimodal inputs) and
``kv_transfer_params`` are always null here.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request

from llmp import SamplingParams
from llmp_frontend_openai import protocol as p
from llmp_frontend_openai.chat import ChatCompletion
from llmp_frontend_openai.completions import Completion

if TYPE_CHECKING:
    from llmp_frontend_openai.frontend import OpenAIFrontend


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> None:
    async def render_chat_completion(body: p.ChatCompletionRequest, request: Request) -> dict[str, Any]:
        chat = ChatCompletion(fe, body, request)
        prompt = await chat.prepare()
        return generate_request(chat.id, prompt.text, prompt.token_ids, chat.params, body)

    async def render_completion(body: p.CompletionRequest, request: Request) -> list[dict[str, Any]]:
        completion = Completion(fe, body, request)
        await completion.prepare()
        count = len(completion.prompts)
        return [
            generate_request(
                completion.id if count == 1 else f"{completion.id}-{index}",
                *completion.prompt_text(index),
                completion.params[index],
                body,
            )
            for index in range(count)
        ]

    router.add_api_route(
        "/v1/chat/completions/render",
        render_chat_completion,
        methods=["POST"],
        summary="Render a chat completion request: its prompt, token ids and sampling parameters, nothing generated",
    )
    router.add_api_route(
        "/v1/completions/render",
        render_completion,
        methods=["POST"],
        summary="Render a completion request: each prompt's token ids and sampling parameters, nothing generated",
    )


def generate_request(
    request_id: str, text: str | None, token_ids: list[int], params: SamplingParams, body: p.SamplingFields
) -> dict[str, Any]:
    """vLLM's ``GenerateRequest`` of one prompt, with the rendered ``prompt`` text beside its token ids."""
    return {
        "request_id": request_id,
        "prompt": text,
        "token_ids": list(token_ids),
        "features": None,
        "sampling_params": sampling_dict(params),
        "model": body.model,
        "stream": bool(body.stream),
        "stream_options": body.stream_options.model_dump() if body.stream and body.stream_options else None,
        "cache_salt": body.cache_salt,
        "priority": body.priority,
        "kv_transfer_params": None,
    }


def sampling_dict(params: SamplingParams) -> dict[str, Any]:
    """Every field of ``SamplingParams`` as JSON, with ``stop`` as the list the engine matches."""
    data = dataclasses.asdict(params)
    data["stop"] = data.pop("stop_strings")
    return data
