"""Cohere's ``POST /v2/embed`` and ``/v1/embed`` (the cohere SDKs' ``embed``), as vLLM serves
``/v2/embed``: the texts embedded as ``/v1/embeddings`` embeds them, answered in Cohere's shapes.

``input_type`` selects the model's own prompt (sentence-transformers' ``prompts`` in
``config_sentence_transformers.json``: the key itself, or ``query`` for ``search_query`` and
``document``/``passage`` for ``search_document``; without one, its ``default_prompt_name``, as
sentence-transformers). A model with no prompts embeds the texts as given and says so in
``meta.warnings`` (the SDK requires ``input_type``, so a 400 would refuse every SDK call); a model
with prompts but none for the type is a 400 naming those it has, as is a type Cohere does not have.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request

from llmp import Prompt
from llmp.frontend import bad_request, special_tokens_around, until_disconnected
from llmp_frontend_openai import protocol as p
from llmp_frontend_openai.pooling import encode_all, prompt_tokens

if TYPE_CHECKING:
    from llmp_frontend_openai.frontend import OpenAIFrontend

# Cohere's embedding types llmp computes from the float vector; int8/uint8 are Cohere's own
# calibrated quantisations of its models, which a local model has no calibration for
EMBEDDING_TYPES = ("float", "binary", "ubinary", "base64")
INPUT_TYPES = ("search_document", "search_query", "classification", "clustering", "image")  # Cohere's
PROMPT_ALIASES = {"search_query": ("query",), "search_document": ("document", "passage", "corpus")}  # ST names


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> None:
    prompts = ModelPrompts.read(fe.options.model_root)

    async def embed(body: p.CohereEmbedRequest, request: Request, version: int) -> dict[str, Any]:
        lora = await fe.lora_for(body.model)
        types = _embedding_types(body.embedding_types, version)
        texts, param = _texts(body)
        prefix, warnings = prompts.prefix(body.input_type)
        limit = _token_limit(fe, body)
        given = await fe.prompt_inputs([prefix + text for text in texts], param, True)
        prefix_ids = await fe.encode(prefix, False) if prefix else []
        inputs = [await _fit(fe, prompt, limit, body.truncate, prefix_ids, param) for prompt in given]
        params = fe.pooling_params("output_dimension", dimensions=body.output_dimension)
        outputs = await until_disconnected(request, encode_all(fe, inputs, params, body.priority, "embd", lora))
        vectors = [list(o.outputs.embedding) for o in outputs]
        tokens = prompt_tokens(inputs)
        meta: dict[str, Any] = {
            "api_version": {"version": str(version)},
            "billed_units": {"input_tokens": tokens},
            "tokens": {"input_tokens": tokens},
        }
        if warnings:
            meta["warnings"] = warnings
        response: dict[str, Any] = {"id": fe.new_id(request, "embd"), "texts": texts, "meta": meta}
        if types is None:  # v1 without embedding_types: the float vectors themselves
            return {**response, "response_type": "embeddings_floats", "embeddings": vectors}
        embeddings = {name: typed_embeddings(vectors, name) for name in types}
        return {**response, "response_type": "embeddings_by_type", "embeddings": embeddings}

    async def embed_v2(body: p.CohereEmbedRequest, request: Request) -> Any:
        return await embed(body, request, 2)

    async def embed_v1(body: p.CohereEmbedRequest, request: Request) -> Any:
        return await embed(body, request, 1)

    router.add_api_route("/v2/embed", embed_v2, methods=["POST"], summary="Embed texts (Cohere v2)")
    router.add_api_route("/v1/embed", embed_v1, methods=["POST"], summary="Embed texts (Cohere v1)")


@dataclass(frozen=True)
class ModelPrompts:
    """The model's sentence-transformers prompts (``config_sentence_transformers.json``) by name, and
    the one it applies when none is named (``default_prompt_name``)."""

    prompts: dict[str, str]
    default: str | None = None

    @classmethod
    def read(cls, model_root: str) -> ModelPrompts:
        path = Path(model_root) / "config_sentence_transformers.json" if model_root else None
        try:
            config = json.loads(path.read_text()) if path is not None and path.is_file() else {}
            prompts = config.get("prompts") or {}
            prompts = {name: text for name, text in prompts.items() if isinstance(text, str)}
        except (OSError, ValueError, AttributeError):
            return cls({})
        default = config.get("default_prompt_name")
        return cls(prompts, default if default in prompts else None)

    def prefix(self, input_type: str | None) -> tuple[str, list[str]]:
        """The text put before each input for ``input_type``, and the warnings the response carries."""
        if input_type is None:
            return (self.prompts[self.default] if self.default else ""), []
        if input_type in self.prompts:  # the model's own name for it
            return self.prompts[input_type], []
        if input_type == "image":
            raise bad_request("input_type 'image' needs a model that embeds images; this one embeds text", "input_type")
        if input_type not in INPUT_TYPES:
            own = f" or one of the model's prompts ({', '.join(sorted(self.prompts))})" if self.prompts else ""
            raise bad_request(
                f"input_type must be one of {', '.join(INPUT_TYPES)}{own}, got {input_type!r}", "input_type"
            )
        if not self.prompts:
            return "", [f"input_type {input_type!r} not applied: the model defines no prompts; texts embedded as given"]
        for name in PROMPT_ALIASES.get(input_type, ()):
            if name in self.prompts:
                return self.prompts[name], []
        names = ", ".join(sorted(self.prompts))
        raise bad_request(
            f"input_type {input_type!r} has no prompt in this model; its prompts are: {names}", "input_type"
        )


def _embedding_types(types: list[str] | None, version: int) -> list[str] | None:
    if types is None:
        return None if version == 1 else ["float"]
    if not types:
        raise bad_request("embedding_types must not be empty", "embedding_types")
    for name in types:
        if name not in EMBEDDING_TYPES:
            raise bad_request(
                f"embedding type {name!r} is not supported; llmp returns {', '.join(EMBEDDING_TYPES)}",
                "embedding_types",
            )
    return list(dict.fromkeys(types))


def _texts(body: p.CohereEmbedRequest) -> tuple[list[str], str]:
    """The texts to embed and the field they came in: ``texts``, or each of ``inputs`` with its
    text parts joined by newlines."""
    if body.images is not None:
        raise bad_request("this model embeds text; images are not supported", "images")
    if (body.texts is None) == (body.inputs is None):
        raise bad_request("give either 'texts' or 'inputs'", "texts")
    if body.texts is not None:
        return body.texts, "texts"
    texts = []
    for item in body.inputs or []:
        if any(part.type != "text" or part.text is None for part in item.content):
            raise bad_request("this model embeds text; every content part must be {'type': 'text'}", "inputs")
        texts.append("\n".join(part.text or "" for part in item.content))
    return texts, "inputs"


def _token_limit(fe: OpenAIFrontend, body: p.CohereEmbedRequest) -> int:
    if body.max_tokens is not None and body.max_tokens > fe.max_model_len:
        raise bad_request(
            f"max_tokens ({body.max_tokens}) must be <= the model's context length ({fe.max_model_len})", "max_tokens"
        )
    return body.max_tokens or fe.max_model_len


async def _fit(
    fe: OpenAIFrontend, prompt: Prompt, limit: int, truncate: str, prefix_ids: list[int], param: str
) -> Prompt:
    """A text's engine prompt cut to ``limit`` tokens: ``END`` cuts the text's end, ``START`` its
    start, keeping the tokenizer's special tokens (as its own truncation does) and the model's prompt
    (``prefix_ids``, before the text); ``NONE`` refuses a longer one."""
    ids = list(prompt.token_ids)
    if len(ids) <= limit:
        return Prompt(token_ids=ids)
    if truncate == "NONE":
        raise bad_request(
            f"an input is {len(ids)} tokens long, over the limit of {limit} (truncate NONE); "
            "set truncate to END or START to cut it",
            param,
        )
    plain = await fe.encode(prompt.text or "", False)
    head, tail = special_tokens_around(ids, plain)
    kept_prefix = prefix_ids if plain[: len(prefix_ids)] == prefix_ids else []
    room = limit - len(head) - len(tail) - len(kept_prefix)
    if room < 1:
        raise bad_request(
            f"max_tokens {limit} leaves no room for the text after the {len(head) + len(tail)} special tokens"
            + (f" and the {len(kept_prefix)} tokens of the model's prompt" if kept_prefix else ""),
            "max_tokens",
        )
    text = plain[len(kept_prefix) :]
    kept = text[:room] if truncate == "END" else text[len(text) - room :]
    return Prompt(token_ids=head + kept_prefix + kept + tail)


def typed_embeddings(vectors: list[list[float]], name: str) -> list[Any]:
    """The vectors as Cohere's embedding type ``name``: ``binary``/``ubinary`` one bit per
    dimension (1 where positive), 8 to a byte, first dimension the highest bit, the last byte
    padded with zero bits, as signed (minus 128) or unsigned integers, as sentence-transformers
    quantises; ``base64`` the little-endian float32 bytes."""
    if name == "float":
        return vectors
    if name == "base64":
        return [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() for v in vectors]
    offset = 128 if name == "binary" else 0
    return [[_byte(v[i : i + 8]) - offset for i in range(0, len(v), 8)] for v in vectors]


def _byte(values: list[float]) -> int:
    return sum(1 << (7 - bit) for bit, value in enumerate(values) if value > 0)
