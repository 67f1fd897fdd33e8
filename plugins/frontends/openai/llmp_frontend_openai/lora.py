"""LoRA adapters loaded and unloaded at run time (mounted only with ``--enable-lora-runtime-updates``).

vLLM's two routes, with its bodies, plain-text successes and error texts:
``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``. And llmp's ``/v1/loras``:
``GET`` lists the served adapters, ``POST`` loads one (``pin`` keeps it in the CPU cache),
``DELETE /v1/loras/{name}`` unloads, ``POST /v1/loras/{name}/pin`` pins. None of these paths is
public: with ``--api-key`` they need the key. The work (validation, the engine's load, the name
table every front-end reads) is the front-end kit's (``load_adapter``, ``unload_adapter``,
``pin_adapter``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from llmp_frontend_openai import protocol as p

if TYPE_CHECKING:
    from llmp import LoRARequest
    from llmp_frontend_openai.frontend import OpenAIFrontend


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> None:
    async def load_lora_adapter(body: p.LoadLoRAAdapterRequest) -> PlainTextResponse:
        await fe.load_adapter(
            body.lora_name, body.lora_path, base_model_name=body.base_model_name, load_inplace=body.load_inplace
        )
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    async def unload_lora_adapter(body: p.UnloadLoRAAdapterRequest) -> PlainTextResponse:
        await fe.unload_adapter(body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    async def list_loras() -> dict[str, Any]:
        return {"object": "list", "data": [card(fe, lora) for lora in fe.lora_requests.values()]}

    async def create_lora(body: p.LoadLoRAAdapterRequest) -> dict[str, Any]:
        lora = await fe.load_adapter(
            body.lora_name,
            body.lora_path,
            base_model_name=body.base_model_name,
            load_inplace=body.load_inplace,
            pin=body.pin,
        )
        return card(fe, lora)

    async def delete_lora(name: str) -> dict[str, Any]:
        lora = await fe.unload_adapter(name)
        return {"id": lora.lora_name, "object": "lora", "deleted": True}

    async def pin_lora(name: str) -> dict[str, Any]:
        return card(fe, await fe.pin_adapter(name))

    router.add_api_route(
        "/v1/load_lora_adapter", load_lora_adapter, methods=["POST"], summary="Load a LoRA adapter (vLLM)"
    )
    router.add_api_route(
        "/v1/unload_lora_adapter", unload_lora_adapter, methods=["POST"], summary="Unload a LoRA adapter (vLLM)"
    )
    router.add_api_route("/v1/loras", list_loras, methods=["GET"], summary="Served LoRA adapters")
    router.add_api_route("/v1/loras", create_lora, methods=["POST"], summary="Load a LoRA adapter")
    router.add_api_route("/v1/loras/{name:path}", delete_lora, methods=["DELETE"], summary="Unload a LoRA adapter")
    router.add_api_route("/v1/loras/{name:path}/pin", pin_lora, methods=["POST"], summary="Pin a LoRA adapter")


def card(fe: OpenAIFrontend, lora: LoRARequest) -> dict[str, Any]:
    """One adapter of ``/v1/loras``: its name, engine id, directory, base model and whether it is pinned."""
    return {
        "id": lora.lora_name,
        "object": "lora",
        "lora_int_id": lora.lora_int_id,
        "root": lora.lora_path,
        "parent": lora.base_model_name or fe.model_name,
        "pinned": fe.is_pinned(lora),
    }
