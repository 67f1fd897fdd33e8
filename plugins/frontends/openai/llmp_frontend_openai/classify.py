"""``POST /classify`` and ``/v1/classify``: class probabilities and the label of each input
(models with a classification head)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request

from llmp import PoolingParams
from llmp.frontend import until_disconnected
from llmp_frontend_openai import protocol as p
from llmp_frontend_openai.pooling import encode_all, list_response, prompt_tokens, request_prompts

if TYPE_CHECKING:
    from llmp_frontend_openai.frontend import OpenAIFrontend


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> None:
    labels = {int(k): v for k, v in (fe.engine.info.get("id2label") or {}).items()}  # the config's id2label

    async def create_classify(body: p.ClassificationRequest, request: Request) -> Any:
        lora = await fe.lora_for(body.model)
        prompts = await request_prompts(fe, body)
        params = PoolingParams(task="classify", use_activation=body.activation_setting())
        outputs = await until_disconnected(request, encode_all(fe, prompts, params, body.priority, "classify", lora))
        data = []
        for i, output in enumerate(outputs):
            probs = output.outputs.probs
            best = max(range(len(probs)), key=probs.__getitem__)
            data.append({"index": i, "label": labels.get(best), "probs": probs, "num_classes": len(probs)})
        return list_response(
            fe.response_model(lora), fe.new_id(request, "classify", body), data, prompt_tokens(prompts)
        )

    for path in ("/classify", "/v1/classify"):
        router.add_api_route(path, create_classify, methods=["POST"], summary="Classify texts")
