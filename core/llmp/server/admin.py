"""The management routes of ``llmp serve --enable-admin-api``, as vLLM serves them (its dev-mode
routes): sleep and wake-up, the prefix cache, profiles and calls on every worker.

Mounted only with the flag (otherwise these paths are 404). The gate asks for ``--admin-api-key``
on them when it is set (the ordinary ``--api-key`` is then not enough), else for ``--api-key``
if any. They are not counted against ``--max-queue-len``: an operator can act on a full server.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Literal

from fastapi import APIRouter, FastAPI, Query
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from llmp.api import EngineDeadError, EngineSleepingError, LLMPError
from llmp.frontend.errors import APIError
from llmp.options import ServerOptions

log = logging.getLogger("llmp.server")

ADMIN_PATHS = frozenset(
    {
        "/sleep",
        "/wake_up",
        "/is_sleeping",
        "/pause",
        "/resume",
        "/is_paused",
        "/reset_prefix_cache",
        "/start_profile",
        "/stop_profile",
        "/collective_rpc",
    }
)


class CollectiveRPCBody(BaseModel):
    """``POST /collective_rpc``: a public method of every worker, with plain-data arguments."""

    model_config = ConfigDict(extra="forbid")

    method: str = Field(min_length=1)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    timeout: float | None = Field(None, gt=0)


def mount_admin(app: FastAPI, state: Any, http: ServerOptions, *, warn: bool = True) -> None:
    """Serve the management routes on ``app`` and tell the gate which key they take; ``warn``: say
    so (several API servers: their launcher says it once)."""
    from llmp.server.app import with_light_json

    state.admin_paths = ADMIN_PATHS
    if http.admin_api_key:
        state.admin_key_digests = [hashlib.sha256(http.admin_api_key.encode()).digest()]
    app.include_router(with_light_json(admin_router(state)))
    app.openapi_schema = None
    if warn:
        warn_admin_api(http)


def warn_admin_api(http: ServerOptions) -> None:
    log.warning(
        "the management routes are on (--enable-admin-api): %s and the front-ends' own (the OpenAI render "
        "routes), behind %s",
        ", ".join(sorted(ADMIN_PATHS)),
        "--admin-api-key" if http.admin_api_key else "--api-key" if http.api_key else "no key at all",
    )


def admin_router(state: Any) -> APIRouter:
    router = APIRouter(tags=["management"])

    def engine() -> Any:
        return state.engine

    @router.post("/sleep", summary="Free the compute device: level 1 offloads the weights, level 2 discards them")
    async def sleep(
        level: int = Query(1, ge=1, le=2, description="1: weights to host memory; 2: weights discarded"),
        mode: Literal["abort", "wait"] = Query("abort", description="requests in flight: abort, or wait for them"),
    ) -> Response:
        log.info("sleep: level %d, requests in flight: %s", level, mode)
        await _run(engine().sleep(level, mode))
        return Response(status_code=200)

    @router.post("/wake_up", summary="Bring back the weights and the KV cache (tags: weights, kv_cache)")
    async def wake_up(tags: list[Literal["weights", "kv_cache"]] | None = Query(None)) -> Response:
        log.info("wake up: %s", ", ".join(tags) if tags else "everything")
        await _run(engine().wake_up(tags or None))
        return Response(status_code=200)

    @router.get("/is_sleeping", summary="Whether the engine is asleep")
    async def is_sleeping() -> dict[str, bool]:
        return {"is_sleeping": await _run(engine().is_sleeping())}

    @router.post("/pause", summary="Stop generating until /resume; new requests wait (vLLM's)")
    async def pause(
        mode: Literal["abort", "wait", "keep"] = Query(
            "abort", description="requests in flight: abort them, wait for them, or keep them frozen until /resume"
        ),
        wait_for_inflight_requests: bool = Query(False, description="older vLLM's mode=wait"),
        clear_cache: bool | None = Query(
            None, description="forget the prefix cache once nothing runs (default true; not with keep)"
        ),
    ) -> dict[str, str]:
        mode = "wait" if wait_for_inflight_requests else mode
        await _run(engine().pause_generation(mode, clear_cache))
        log.info("generation paused: requests in flight: %s", mode)
        return {"status": "paused"}

    @router.post("/resume", summary="Generate again after /pause: the requests held go on")
    async def resume() -> dict[str, str]:
        await _run(engine().resume_generation())
        log.info("generation resumed")
        return {"status": "resumed"}

    @router.get("/is_paused", summary="Whether generation is paused")
    async def is_paused() -> dict[str, bool]:
        return {"is_paused": await _run(engine().is_paused())}

    @router.post("/reset_prefix_cache", summary="Forget the cached prompt blocks (409 while requests hold some)")
    async def reset_prefix_cache(
        reset_running_requests: bool = Query(False, description="not supported: must be false"),
        reset_external: bool = Query(False, description="not supported: llmp has no external KV cache"),
    ) -> Response:
        if reset_running_requests or reset_external:
            name = "reset_running_requests" if reset_running_requests else "reset_external"
            raise APIError(400, f"{name}=true is not supported: reset the prefix cache when no request runs")
        if not await _run(engine().reset_prefix_cache()):
            raise APIError(409, "the prefix cache was not reset: requests in flight hold blocks; retry when idle")
        log.info("prefix cache reset")
        return Response(status_code=200)

    @router.post("/start_profile", summary="Start the torch profiler on every worker (--profiler-dir)")
    async def start_profile() -> Response:
        await _run(engine().start_profile())
        log.info("profiler started")
        return Response(status_code=200)

    @router.post("/stop_profile", summary="Stop the profiler; the trace files written (Chrome-trace JSON)")
    async def stop_profile() -> dict[str, list[str]]:
        traces = await _run(engine().stop_profile())
        log.info("profiler stopped: %s", ", ".join(traces))
        return {"traces": traces}

    @router.post("/collective_rpc", summary="Call a public method of every worker; one result per rank")
    async def collective_rpc(body: CollectiveRPCBody) -> JSONResponse:
        results = await _run(engine().collective_rpc(body.method, body.timeout, body.args, body.kwargs))
        # vLLM's shape: a result that is not null, an object or a list is sent as its text
        return JSONResponse({"results": [r if r is None or isinstance(r, dict | list) else str(r) for r in results]})

    return router


async def _run(call: Any) -> Any:
    """An engine call, its failures as HTTP errors: a bad argument 400 and a sleeping or dead engine
    503 (the app's handler), an executor without ``collective_rpc`` 501, a call past its timeout 504,
    and a worker's failure (a model that no longer loads on wake-up ...) 500, logged."""
    try:
        return await call
    except NotImplementedError as exc:
        raise APIError(501, str(exc)) from None
    except TimeoutError as exc:
        raise APIError(504, str(exc)) from None
    except (EngineSleepingError, EngineDeadError, ValueError, LookupError):
        raise
    except LLMPError as exc:  # a worker failed (llmp.engine.worker.WorkerCallError): the server's fault
        log.error("management call failed: %s", exc)
        raise APIError(500, str(exc)) from None
