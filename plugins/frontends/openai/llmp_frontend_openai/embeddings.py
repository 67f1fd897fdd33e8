"""``POST /v1/embeddings``: one vector per input (models that embed)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request

from llmp.frontend import until_disconnected
from llmp_frontend_openai import protocol as p
from llmp_frontend_openai.pooling import (
    base64_format,
    embed_normalize,
    encode_all,
    encode_floats,
    prompt_tokens,
    request_prompts,
)

if TYPE_CHECKING:
    from llmp_frontend_openai.frontend import OpenAIFrontend


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> None:
    async def create_embedding(body: p.EmbeddingRequest, request: Request) -> Any:
        lora = await fe.lora_for(body.model)
        inputs = await request_prompts(fe, body)  # input or messages, with add_special_tokens
        params = fe.pooling_params(normalize=embed_normalize(body), dimensions=body.dimensions)
        outputs = await until_disconnected(request, encode_all(fe, inputs, params, body.priority, "embd", lora))
        data = [
            {"object": "embedding", "index": i, "embedding": encode_floats(o.outputs.embedding, *base64_format(body))}
            for i, o in enumerate(outputs)
        ]
        tokens = prompt_tokens(inputs)
        return {
            "id": fe.new_id(request, "embd", body),
            "object": "list",
            "created": int(time.time()),
            "data": data,
            "model": fe.response_model(lora),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    router.add_api_route("/v1/embeddings", create_embedding, methods=["POST"], summary="Create embeddings")
