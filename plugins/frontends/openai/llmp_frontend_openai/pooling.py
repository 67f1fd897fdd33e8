"""``POST /pooling``: a model's raw pooled output for any of its pooling tasks; and what every
pooling route shares: the prompts of ``input`` or ``messages`` fitted to the context, and the
engine requests of many prompts, a window at a time."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import APIRouter, Request

from llmp import LoRARequest, PoolingOutput, PoolingParams, PoolingRequestOutput, Prompt
from llmp.frontend import bad_request, engine_request_id, until_disconnected
from llmp_frontend_openai import protocol as p

if TYPE_CHECKING:
    from llmp_frontend_openai.frontend import OpenAIFrontend

# the tasks /pooling runs; "score" needs a pair (/score) and "generate" is not pooling
POOLING_ROUTE_TASKS = ("embed", "classify", "token_embed", "token_classify")


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> None:
    supported = [task for task in POOLING_ROUTE_TASKS if task in fe.supported_tasks]

    async def create_pooling(body: p.PoolingRequest, request: Request) -> Any:
        lora = await fe.lora_for(body.model)
        if body.task is not None and body.task not in supported:
            raise bad_request(f"the model cannot do task {body.task!r}; it supports {', '.join(supported)}", "task")
        prompts = await request_prompts(fe, body)
        task = body.task or (fe.task if fe.task in POOLING_ROUTE_TASKS else None)
        if task in EMBED_TASKS:
            params = fe.pooling_params(task=body.task, normalize=embed_normalize(body), dimensions=body.dimensions)
        else:
            # the engine refuses these too, but with no field named
            unused = ("dimensions", "normalize") if task is not None else ()
            param = next((name for name in unused if getattr(body, name) is not None), None)
            if param is not None:
                raise bad_request(f"{param} applies to task embed or token_embed, not {task}", param)
            params = fe.pooling_params(
                task=body.task,
                normalize=body.normalize,
                dimensions=body.dimensions,
                use_activation=body.activation_setting(),
            )
        outputs = await until_disconnected(request, encode_all(fe, prompts, params, body.priority, "pool", lora))
        data = [
            {"index": i, "object": "pooling", "data": encode_floats(plain_values(o.outputs), *base64_format(body))}
            for i, o in enumerate(outputs)
        ]
        return list_response(fe.response_model(lora), fe.new_id(request, "pool", body), data, prompt_tokens(prompts))

    router.add_api_route("/pooling", create_pooling, methods=["POST"], summary="Raw pooled outputs")


# -- shared by the pooling routes -------------------------------------------------

EMBED_TASKS = ("embed", "token_embed")


def base64_format(body: p.EmbeddingRequest) -> tuple[str, str, str]:
    """The arguments of :func:`encode_floats` a request sets."""
    return body.encoding_format, body.embed_dtype, body.endianness


def embed_normalize(body: p.EmbeddingRequest) -> bool | None:
    """Whether to normalise an embedding: ``use_activation`` (vLLM's newer name of it on an embedding
    request), else ``normalize``; None: the model's default. The older names of ``use_activation``
    (``activation``, ``softmax``) are a classifier's, so a 400 here."""
    old = next((name for name in ("activation", "softmax") if getattr(body, name) is not None), None)
    if old is not None:
        raise bad_request(f"{old} applies to classification; an embedding takes use_activation or normalize", old)
    if body.use_activation is None:
        return body.normalize
    if body.normalize is not None and body.normalize != body.use_activation:
        raise bad_request("use_activation and normalize disagree (use_activation replaces normalize)", "use_activation")
    return body.use_activation


ENCODE_WINDOW = 64


def encode_window(fe: OpenAIFrontend) -> int:
    """How many of one HTTP request's prompts may be in the engine at once: ENCODE_WINDOW, and never
    more than the server admits at all (``--max-num-seqs`` plus ``--max-queue-len``), so that a long
    list alone always fits."""
    capacity = getattr(fe.engine, "capacity", None)  # the server's MeteredEngine; None: unbounded
    return ENCODE_WINDOW if capacity is None else max(1, min(ENCODE_WINDOW, capacity))


async def encode_all(
    fe: OpenAIFrontend,
    prompts: Sequence[Prompt],
    params: PoolingParams,
    priority: int,
    prefix: str,
    lora: LoRARequest | None = None,
) -> list[PoolingRequestOutput]:
    """One engine request per prompt (on the LoRA adapter ``lora``, if any), in prompt order. A long
    list goes to the engine a window at a time (:func:`encode_window`), each request closed before
    the next takes its place, as admission control counts engine requests; a server too busy for
    the first window refuses the request before any starts. Cancelling aborts every one in flight."""
    size = min(encode_window(fe), len(prompts))
    if hasattr(fe.engine, "check_capacity"):
        fe.engine.check_capacity(size)
    window = asyncio.Semaphore(size)

    async def one(prompt: Prompt) -> PoolingRequestOutput:
        async with window:
            outputs = fe.engine.encode(prompt, params, engine_request_id(prefix), lora_request=lora, priority=priority)
            async with contextlib.aclosing(outputs):  # its admission released now, not when collected
                async for output in outputs:
                    return output
        raise RuntimeError("the pooling request was aborted")

    tasks = [asyncio.ensure_future(one(prompt)) for prompt in prompts]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


# the fields that shape how ``messages`` are rendered, with their defaults: they do nothing to ``input``
CHAT_FIELDS = {
    "add_generation_prompt": False,
    "continue_final_message": False,
    "chat_template": None,
    "chat_template_kwargs": None,
}


async def request_prompts(fe: OpenAIFrontend, body: p.ClassificationRequest) -> list[Prompt]:
    """The prompts of a request's ``input`` (texts or token ids) or ``messages`` (one chat, rendered
    by the chat template), fitted to the context by ``truncate_prompt_tokens``."""
    if (body.input is None) == (body.messages is None):
        raise bad_request("give either 'input' or 'messages'", "input")
    if body.input is not None:
        for name, default in CHAT_FIELDS.items():
            if getattr(body, name) not in (default, {}):
                raise bad_request(f"{name} applies to 'messages', not to 'input'", name)
    if body.messages is not None:
        return fit_prompts(fe, [await fe.chat_prompt(body.messages, body)], body.truncate_prompt_tokens, "messages")
    add_special = True if body.add_special_tokens is None else body.add_special_tokens
    prompts = await fe.prompt_inputs(body.input, "input", add_special)
    return fit_prompts(fe, prompts, body.truncate_prompt_tokens, "input")


def fit_prompts(fe: OpenAIFrontend, prompts: list[Prompt], truncate: int | None, param: str) -> list[Prompt]:
    """Each prompt's token ids, cut to the last ``truncate`` (-1: the context length; a text's
    special tokens kept, ``FrontendKit.last_tokens``) and checked against the context length."""
    limit = fe.truncation_limit(truncate)
    out = []
    for prompt in prompts:
        ids = prompt.token_ids if limit is None else fe.last_tokens(prompt, limit)
        if len(ids) > fe.max_model_len:
            raise bad_request(f"an input is {len(ids)} tokens long; this model takes at most {fe.max_model_len}", param)
        out.append(Prompt(token_ids=ids))  # the ids alone: truncation may have cut the text
    return out


def prompt_tokens(prompts: Sequence[Prompt]) -> int:
    return sum(len(prompt.token_ids) for prompt in prompts)


def list_response(model: str, response_id: str, data: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    """vLLM's response of /pooling, /score and /classify (``model``: the name it echoes); every token
    counted is a prompt token."""
    return {
        "id": response_id,
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": {
            "prompt_tokens": tokens,
            "total_tokens": tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        },
    }


def plain_values(output: Any) -> Any:
    """A pooled output's numbers as plain lists: a ``PoolingOutput``'s ``data`` is a tensor (as
    vLLM's), which the server neither needs nor serialises."""
    return output.values if isinstance(output, PoolingOutput) else output.data


# vLLM's embed_dtype: the torch dtype of the bytes, and the integer dtype of its width they are read as
EMBED_DTYPES = {
    "float16": ("float16", "int16"),
    "bfloat16": ("bfloat16", "int16"),
    "fp8_e4m3": ("float8_e4m3fn", "uint8"),
    "fp8_e5m2": ("float8_e5m2", "uint8"),
}


def encode_floats(values: Any, encoding_format: str, embed_dtype: str = "float32", endianness: str = "native") -> Any:
    """A vector (or rows of them) as JSON floats, or with ``base64`` as the bytes of ``embed_dtype``
    (float32, as OpenAI encodes embeddings, by default) in ``endianness`` (the server's by default),
    rows one after another, as vLLM encodes them."""
    if encoding_format != "base64":
        return values
    flat = [x for row in values for x in row] if values and isinstance(values[0], list) else list(values)
    if embed_dtype == "float32":
        raw = np.asarray(flat, dtype=np.float32)
    else:
        import torch  # numpy has no bfloat16 or fp8; torch is imported only where it is needed

        dtype, view = (getattr(torch, name) for name in EMBED_DTYPES[embed_dtype])
        raw = torch.tensor(flat, dtype=torch.float32).to(dtype).view(view).numpy()
    if endianness not in ("native", sys.byteorder):
        raw = raw.byteswap()
    return base64.b64encode(raw.tobytes()).decode()
