"""``POST /v1/embeddings``: one vector per input (embedding models only)."""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request

from llmp import PoolingParams, Prompt
from llmp.frontend import bad_request, engine_request_id, until_disconnected
from llmp_frontend_openai import protocol as p

if TYPE_CHECKING:
    from llmp_frontend_openai.frontend import OpenAIFrontend


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> None:
    async def create_embedding(body: p.EmbeddingRequest, request: Request) -> Any:
        fe.check_model(body.model)
        inputs = await _inputs(fe, body)
        try:
            params = PoolingParams(normalize=body.normalize, dimensions=body.dimensions)
        except ValueError as exc:
            raise bad_request(str(exc), "dimensions") from None
        vectors = await until_disconnected(request, _embed_all(fe, inputs, params, body.priority))
        data = [
            {"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
            for i, v in enumerate(vectors)
        ]
        tokens = sum(len(prompt.token_ids) for prompt in inputs)
        return {
            "object": "list",
            "data": data,
            "model": fe.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    router.add_api_route("/v1/embeddings", create_embedding, methods=["POST"], summary="Create embeddings")


EMBED_WINDOW = 64


async def _inputs(fe: OpenAIFrontend, body: p.EmbeddingRequest) -> list[Prompt]:
    out = []
    for prompt in await fe.prompt_inputs(body.input, "input", True):
        ids = prompt.token_ids
        limit = body.truncate_prompt_tokens
        if limit is not None and limit > 0 and len(ids) > limit:
            ids = ids[-limit:]
        if len(ids) > fe.max_model_len:
            raise bad_request(
                f"an input is {len(ids)} tokens long; this model takes at most {fe.max_model_len}", "input"
            )
        out.append(Prompt(token_ids=ids))  # the ids alone: truncation may have cut the text
    return out


async def _embed_all(fe: OpenAIFrontend, inputs: list[Prompt], params: PoolingParams, priority: int) -> list:
    # a long list of inputs goes to the engine a window at a time, so it never holds more than
    # EMBED_WINDOW of one request's inputs (admission control counts engine requests)
    window = asyncio.Semaphore(EMBED_WINDOW)

    async def one(prompt: Prompt) -> list[float]:
        async with window:
            async for output in fe.engine.encode(prompt, params, engine_request_id("embd"), priority=priority):
                return output.outputs.embedding
        raise RuntimeError("the embedding request was aborted")

    tasks = [asyncio.ensure_future(one(prompt)) for prompt in inputs]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":  # little-endian float32, as OpenAI's
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector
