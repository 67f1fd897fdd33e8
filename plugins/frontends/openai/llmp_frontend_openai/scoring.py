"""``POST /score`` and ``/v1/score`` (text pairs, 1:1, 1:N or N:N) and ``/rerank``, ``/v1/rerank``
and ``/v2/rerank`` (a query against documents, Jina- and Cohere-shaped): for models that score.

A cross-encoder (or LLM reranker) reads each pair as one prompt: one engine request per pair, task
``score``. An embedding model (bi-encoder) embeds each distinct text once and scores the cosine.
The pair checks and prompts are the front-end kit's (:mod:`llmp.scoring`), shared with ``LLM.score``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request

from llmp import LoRARequest, PoolingParams, Prompt
from llmp.frontend import (
    ScoreInputError,
    bad_request,
    cosine_scores,
    cross_encoder_prompts,
    rerank_order,
    text_prompt,
    until_disconnected,
    validate_score_input,
)
from llmp_frontend_openai import protocol as p
from llmp_frontend_openai.pooling import encode_all, list_response, prompt_tokens

if TYPE_CHECKING:
    from llmp_frontend_openai.frontend import OpenAIFrontend

# the names /score takes for each side of its pairs (vLLM's three spellings, and items for documents)
FIRST_SIDE = ("text_1", "queries", "data_1")
SECOND_SIDE = ("text_2", "documents", "items", "data_2")


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> None:
    async def create_score(body: p.ScoreRequest, request: Request) -> Any:
        lora = await fe.lora_for(body.model)
        (name_1, data_1), (name_2, data_2) = _side(body, FIRST_SIDE), _side(body, SECOND_SIDE)
        scores, tokens = await until_disconnected(
            request, score_pairs(fe, data_1, data_2, (name_1, name_2), body, lora=lora)
        )
        data = [{"index": i, "object": "score", "score": score} for i, score in enumerate(scores)]
        return list_response(fe.response_model(lora), fe.new_id(request, "score", body), data, tokens)

    async def create_rerank(body: p.RerankRequest, request: Request) -> Any:
        lora = await fe.lora_for(body.model)
        if body.max_chunks_per_doc is not None:
            raise bad_request(
                "max_chunks_per_doc is not supported: documents are not split into chunks "
                "(max_tokens_per_doc or truncate_prompt_tokens cut long ones)",
                "max_chunks_per_doc",
            )
        if body.relevant_spans:
            raise bad_request(
                "relevant_spans is not supported: each document gets one relevance score", "relevant_spans"
            )
        documents = [body.documents] if isinstance(body.documents, str) else body.documents
        texts = [_document_text(document, body.rank_fields, i) for i, document in enumerate(documents)]
        pairs = score_pairs(fe, body.query, texts, ("query", "documents"), body, lora=lora)
        scores, tokens = await until_disconnected(request, pairs)
        results = []
        for i in rerank_order(scores, body.top_n):
            result: dict[str, Any] = {"index": i}
            if body.return_documents is not False:  # as the client gave it; a string as Cohere's {"text"}
                document = documents[i]
                result["document"] = {"text": document} if isinstance(document, str) else document
            result["relevance_score"] = scores[i]
            results.append(result)
        return {
            "id": fe.new_id(request, "rerank", body),
            "model": fe.response_model(lora),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": results,
            # Cohere's meta: one search per query; every field its SDKs read here is optional
            "meta": {"billed_units": {"search_units": 1}, "tokens": {"input_tokens": tokens, "output_tokens": 0}},
        }

    for path in ("/score", "/v1/score"):
        router.add_api_route(path, create_score, methods=["POST"], summary="Score text pairs")
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        router.add_api_route(path, create_rerank, methods=["POST"], summary="Rerank documents against a query")


async def score_pairs(
    fe: OpenAIFrontend,
    data_1: str | Sequence[str],
    data_2: str | Sequence[str],
    names: tuple[str, str],
    body: p.ScoringFields,
    *,
    lora: LoRARequest | None = None,
) -> tuple[list[float], int]:
    """The score of each pair (in pair order) and the prompt tokens counted for usage; with
    ``max_tokens_per_query`` / ``max_tokens_per_doc`` each first / second text is first cut to its
    first tokens (vLLM's fields; Cohere's ``max_tokens_per_doc``)."""
    try:
        queries, documents = validate_score_input(data_1, data_2, names=names)
    except ScoreInputError as exc:
        raise bad_request(exc.message, exc.param) from None
    cap = fe.max_score_pairs
    if len(documents) > cap:
        raise bad_request(f"{names[1]} holds {len(documents)} items; this server takes at most {cap}", names[1])
    try:
        for name, side in (("max_tokens_per_query", "queries"), ("max_tokens_per_doc", "documents")):
            limit = getattr(body, name)
            if not limit:
                continue
            if limit >= fe.max_model_len:
                raise bad_request(f"{name} ({limit}) must be less than max_model_len ({fe.max_model_len})", name)
            if side == "queries":
                queries = await asyncio.to_thread(_cut_to_tokens, fe.tokenizer, queries, limit, name)
            else:
                documents = await asyncio.to_thread(_cut_to_tokens, fe.tokenizer, documents, limit, name)
        if fe.engine.info.get("score_mode") == "bi-encoder":
            return await _bi_encoder_scores(fe, queries, documents, names, body, lora)
        return await _cross_encoder_scores(fe, queries, documents, names, body, lora)
    except ScoreInputError as exc:
        raise bad_request(exc.message, exc.param) from None


async def _cross_encoder_scores(
    fe: OpenAIFrontend,
    queries: list[str],
    documents: list[str],
    names: tuple[str, str],
    body: p.ScoringFields,
    lora: LoRARequest | None,
) -> tuple[list[float], int]:
    use_sep_token = bool(fe.engine.info.get("use_sep_token", True))
    # an LLM reranker that only scores reads each pair through the server's --chat-template, when
    # given (vLLM's score template: messages "query" and "document"); a model that also chats keeps
    # its chat template for chat
    template = None if use_sep_token or "generate" in fe.supported_tasks else fe.options.chat_template
    variables, field = body.template_variables()
    if field is not None and template is None:
        raise bad_request(
            f"{field} applies only to an LLM reranker served with a score template (--chat-template)", field
        )

    def build() -> list[Prompt]:  # tokenized off the event loop, all pairs in one call
        return cross_encoder_prompts(
            fe.tokenizer,
            queries,
            documents,
            use_sep_token=use_sep_token,
            truncate_prompt_tokens=body.truncate_prompt_tokens,
            max_model_len=fe.max_model_len,
            param=names[1],
            chat_template=template,
            chat_template_kwargs=variables or None,
        )

    prompts = await asyncio.to_thread(build)
    params = PoolingParams(task="score", use_activation=body.activation_setting())
    outputs = await encode_all(fe, prompts, params, body.priority, "score", lora)
    return [output.outputs.score for output in outputs], prompt_tokens(prompts)


async def _bi_encoder_scores(
    fe: OpenAIFrontend,
    queries: list[str],
    documents: list[str],
    names: tuple[str, str],
    body: p.ScoringFields,
    lora: LoRARequest | None,
) -> tuple[list[float], int]:
    _, field = body.template_variables()
    if field is not None:
        raise bad_request(
            f"{field} applies only to an LLM reranker served with a score template (--chat-template)", field
        )
    activation = body.activation_param()
    if activation is not None:  # vLLM's rule: the embed task takes no activation
        raise bad_request(
            f"{activation} does not apply to this model: it scores by the cosine of embeddings", activation
        )
    where: dict[str, tuple[str, str]] = {}  # each distinct text, embedded once: where it first is, for errors
    for name, texts in zip(names, (queries, documents), strict=True):
        for i, text in enumerate(texts):
            where.setdefault(text, (f"the text at index {i} of {name}", name))

    def build() -> dict[str, Prompt]:
        return {
            text: text_prompt(
                fe.tokenizer,
                text,
                truncate_prompt_tokens=body.truncate_prompt_tokens,
                max_model_len=fe.max_model_len,
                what=what,
                param=param,
            )
            for text, (what, param) in where.items()
        }

    prompts = await asyncio.to_thread(build)
    outputs = await encode_all(fe, list(prompts.values()), PoolingParams(task="embed"), body.priority, "score", lora)
    vectors = {text: output.outputs.embedding for text, output in zip(prompts, outputs, strict=True)}
    scores = cosine_scores([vectors[q] for q in queries], [vectors[d] for d in documents])
    # usage as vLLM counts a bi-encoder pair: query, one pad token, document
    pad = 0 if getattr(fe.tokenizer, "pad_token_id", None) is None else 1
    tokens = sum(
        len(prompts[q].token_ids) + pad + len(prompts[d].token_ids) for q, d in zip(queries, documents, strict=True)
    )
    return scores, tokens


def _side(body: p.ScoreRequest, names: tuple[str, ...]) -> tuple[str, Any]:
    given = [name for name in names if getattr(body, name) is not None]
    if not given:
        raise bad_request(f"give the texts to score as {' or '.join(names)}", names[0])
    if len(given) > 1:
        raise bad_request(f"give one of {', '.join(names)}, not {' and '.join(given)}", given[1])
    return given[0], getattr(body, given[0])


def _cut_to_tokens(tokenizer: Any, texts: list[str], max_tokens: int, param: str) -> list[str]:
    """Each text cut to its first ``max_tokens`` tokens (special tokens aside), as ``param``
    (``max_tokens_per_doc``, ``max_tokens_per_query``) asks: up to the end of its last kept token, by
    the fast tokenizer's offsets, so the kept text is exactly the client's (no decoding round trip);
    one tokenizer call."""
    if not getattr(tokenizer, "is_fast", False):
        raise bad_request(f"{param} needs a fast tokenizer (its offsets), which this model lacks", param)
    spans = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return [
        text if len(offsets) <= max_tokens else text[: offsets[max_tokens - 1][1]]
        for text, offsets in zip(texts, spans, strict=True)
    ]


def _document_text(document: str | dict[str, Any], rank_fields: list[str] | None, index: int) -> str:
    """The text a document is ranked on: the string, or an object's ``text`` (or its ``rank_fields``
    joined by newlines)."""
    if isinstance(document, str):
        return document
    fields = rank_fields or ["text"]
    for name in fields:
        if name not in document:
            hint = "" if rank_fields else " (rank_fields names the fields to rank on)"
            raise bad_request(f"document {index} has no field {name!r}{hint}", "documents")
        if not isinstance(document[name], str):
            kind = "null" if document[name] is None else type(document[name]).__name__
            raise bad_request(f"document {index}'s field {name!r} must be a string, not {kind}", "documents")
    return "\n".join(document[name] for name in fields)
