"""The ASGI app: shared middleware and routes, then the front-ends' routes once the engine is ready."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import hmac
import json
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmp import __version__
from llmp.api import EngineDeadError, EngineSleepingError, LLMPError
from llmp.frontend.errors import APIError, as_api_error, error_body, validation_message
from llmp.frontend.http import current_http

log = logging.getLogger("llmp.server")

PROBE_PATHS = frozenset({"/health", "/ready", "/live", "/ping", "/version", "/metrics", "/load"})
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
MAX_HEADERS = 100
OPEN_PATHS = PROBE_PATHS | {"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class ServerState:
    """What the middleware and the probes read: the phase, and the engine once it is up."""

    def __init__(self) -> None:
        self.phase = "starting"  # starting -> loading -> warming_up -> ready -> draining | dead
        self.engine: Any = None
        self.started = time.monotonic()
        self.error: str | None = None
        self.in_flight = 0  # model requests admitted and not yet answered
        self._probe: asyncio.Future | None = None
        # (path prefix, renderer): front-ends whose protocol has its own error shape
        self.error_renderers: list[tuple[str, Callable[[APIError], tuple[int, Any]]]] = []
        # paths the front-ends serve without the API key (static pages): exact, or a prefix ending in "/"
        # ("/" itself is exact: a prefix of every path)
        self.public_paths: list[str] = []
        self.any_body_type_paths: list[str] = []  # path prefixes whose POST bodies are JSON whatever the type says
        self.upload_paths: dict[str, int | tuple[int, str]] = {}  # multipart/form-data paths: size limit[, 413 message]
        self.admin_paths: frozenset[str] = frozenset()  # the management routes (server.admin), when mounted
        # path prefixes whose front-end admits its own model requests (MCP: one path for every message)
        self.self_admitted_paths: list[str] = []
        self.admin_key_digests: list[bytes] = []  # --admin-api-key: then the only key the admin paths take

    def reads_any_body_type(self, path: str, headers: Mapping[str, str]) -> bool:
        """A body under one of ``any_body_type_paths`` is read as JSON whatever its Content-Type, unless a
        browser sent it (an ``Origin`` header): a page must not post to the API cross-site without a preflight."""
        return "origin" not in headers and any(path.startswith(p) for p in self.any_body_type_paths)

    def is_public(self, path: str) -> bool:
        return path in OPEN_PATHS or any(
            path == p or (p != "/" and p.endswith("/") and path.startswith(p)) for p in self.public_paths
        )

    def render_error(self, path: str, error: APIError) -> tuple[int, Any]:
        """``(status, body)`` of an error on ``path``: in the shape of the front-end owning the path,
        else OpenAI's ``{"error": {...}}``."""
        for prefix, render in self.error_renderers:
            if path.startswith(prefix):
                return render(error)
        return error.status, error.body()

    async def probe_engine(self, timeout: float) -> None:
        """Ping the engine within ``timeout``; concurrent probes share one ping, so a hung
        engine does not collect a queue of them."""
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self.engine.check_health())
        try:
            await asyncio.wait_for(asyncio.shield(self._probe), timeout)
        except TimeoutError:
            raise TimeoutError(f"the engine did not answer a ping within {timeout:g} s") from None

    @property
    def ready(self) -> bool:
        return self.phase == "ready"


def route_path(scope: Mapping[str, Any]) -> str:
    """The path the routes see: behind ``--root-path`` both ``/llm/v1/...`` and ``/v1/...`` work."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root) :] or "/" if root and path.startswith(root) else path


async def send_json(send: Callable, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
    payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()  # as JSONResponse renders
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


class BodyTooLarge(Exception):
    pass


def _upload_limit(declared: int | tuple[int, str]) -> tuple[int, str | None]:
    """A front-end's ``upload_paths`` value: the byte limit, or the limit and the 413's message
    (naming the option that sets it)."""
    return declared if isinstance(declared, tuple) else (declared, None)


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What the gate refuses before any route runs (the values of ``ServerOptions``: see ``launch.gate_limits``)."""

    max_body_bytes: int
    max_json_depth: int = 64
    max_in_flight: int | None = None  # model requests at once (running + queued); None = no bound
    overload_status: int  # 503, or 429 for clients that only back off on that
    allowed_hosts: frozenset[str] | None = None  # Host header names accepted; None = any


class GateMiddleware:
    """Checks made before any route runs, cheapest first: readiness, Host, API key, content
    type, body size and depth, then admission (a bounded number of model requests in flight).

    A pure ASGI middleware, so streamed responses pass through untouched.
    """

    def __init__(
        self,
        app: Any,
        state: ServerState,
        api_keys: list[str],
        limits: Limits,
        on_rejected: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.app = app
        self.state = state
        self.key_digests = [hashlib.sha256(k.encode()).digest() for k in api_keys]
        self.limits = limits
        self.max_body_bytes = limits.max_body_bytes
        self.on_rejected = on_rejected

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = route_path(scope), scope["method"]
        if len(scope["headers"]) > MAX_HEADERS:
            return await self._refuse(
                send,
                path,
                APIError(
                    431, f"a request may carry at most {MAX_HEADERS} headers, this one has {len(scope['headers'])}"
                ),
            )
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if (
            self.limits.allowed_hosts is not None
            and _host_name(headers.get("host", "")) not in self.limits.allowed_hosts
        ):
            # a page on another site resolving its name to 127.0.0.1 (DNS rebinding) sends its own Host
            return await self._refuse(
                send,
                path,
                APIError(400, f"Host header {headers.get('host', '')!r} is not accepted by a server bound to loopback"),
            )
        if path not in PROBE_PATHS and not self.state.ready and method != "OPTIONS":
            message = {
                "loading": "the model is still loading",
                "starting": "the server is starting",
                "warming_up": "the model is warming up",
                "draining": "the server is shutting down",
            }.get(self.state.phase, "the engine is not running")
            return await self._refuse(send, path, APIError(503, message, headers={"Retry-After": "1"}))
        admin = path in self.state.admin_paths
        keys = self.state.admin_key_digests if admin and self.state.admin_key_digests else self.key_digests
        if (
            keys
            and method != "OPTIONS"
            and (admin or not self.state.is_public(path))
            and not self._authorized(headers, keys)
        ):
            which = "admin API key (--admin-api-key)" if keys is self.state.admin_key_digests else "API key"
            return await self._refuse(
                send,
                path,
                APIError(
                    401,
                    f"invalid or missing {which}: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                ),
            )
        if method in BODY_METHODS:
            content_type = headers.get("content-type", "application/json").split(";")[0].strip().lower()
            if content_type == "multipart/form-data" and path in self.state.upload_paths:
                return await self._upload(scope, receive, send, path, headers)
            if content_type != "application/json" and self.state.reads_any_body_type(path, headers):
                scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
                scope["headers"].append((b"content-type", b"application/json"))
            elif content_type != "application/json":
                return await self._refuse(
                    send,
                    path,
                    APIError(400, f"Unsupported Media Type: {content_type!r}; only 'application/json' is allowed"),
                )
            length = headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
                return await self._refuse(send, path, self._too_large())
            try:  # read here, so going over the limit is a 413 and deep nesting a 400, not a parse error
                body, receive = await self._buffered(receive)
            except BodyTooLarge:
                return await self._refuse(send, path, self._too_large())
            if body is not None and await _depth_exceeds(body, self.limits.max_json_depth):
                return await self._refuse(
                    send,
                    path,
                    APIError(400, f"the JSON body is nested deeper than {self.limits.max_json_depth} levels"),
                )
        self_admitted = any(path.startswith(p) for p in self.state.self_admitted_paths)
        if method == "POST" and path not in OPEN_PATHS and not admin and not self_admitted:  # a model request
            limit = self.limits.max_in_flight
            if limit is not None and self.state.in_flight >= limit:
                return await self._overloaded(send, path)
            self.state.in_flight += 1
            try:
                return await self.app(scope, receive, send)
            finally:
                self.state.in_flight -= 1
        await self.app(scope, receive, send)

    async def _upload(self, scope: dict, receive: Callable, send: Callable, path: str, headers: Mapping) -> None:
        """A file upload (a front-end's ``upload_paths``): read up to its own limit, no JSON checks."""
        limit, message = _upload_limit(self.state.upload_paths[path])
        too_large = APIError(413, message or f"the upload exceeds the limit of {limit} bytes for {path}")
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await self._refuse(send, path, too_large)
        try:
            _, receive = await self._buffered(receive, limit)
        except BodyTooLarge:
            return await self._refuse(send, path, too_large)
        await self.app(scope, receive, send)

    async def _overloaded(self, send: Callable, path: str) -> None:
        self.on_rejected("overloaded")
        message = (
            f"the server is at capacity ({self.limits.max_in_flight} requests in flight: "
            "--max-num-seqs plus --max-queue-len); retry after a moment"
        )
        await self._refuse(
            send, path, APIError(self.limits.overload_status, message, code="overloaded", headers={"Retry-After": "1"})
        )

    async def _refuse(self, send: Callable, path: str, error: APIError) -> None:
        status, body = self.state.render_error(path, error)
        await send_json(send, status, body, error.headers)

    def _authorized(self, headers: Mapping[str, str], keys: list[bytes]) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            token = token.strip()
        elif "x-api-key" in headers:  # Anthropic's clients send the key in their own header
            token = headers["x-api-key"].strip()
        else:
            return False
        digest = hashlib.sha256(token.encode()).digest()
        # compare against every key, so the time taken does not tell which one nearly matched
        return sum(hmac.compare_digest(digest, key) for key in keys) > 0

    def _too_large(self) -> APIError:
        return APIError(
            413, f"the request body exceeds the limit of {self.max_body_bytes} bytes (--max-request-body-bytes)"
        )

    async def _buffered(self, receive: Callable, limit: int | None = None) -> tuple[bytes | None, Callable]:
        """The whole body, read up to the limit, and a ``receive`` that replays it as one message."""
        limit = self.max_body_bytes if limit is None else limit
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None, _replay([message], receive)  # the client left while sending
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                raise BodyTooLarge
            if not message.get("more_body", False):
                body = b"".join(chunks)
                return body, _replay([{"type": "http.request", "body": body, "more_body": False}], receive)


_JSON_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


async def _depth_exceeds(body: bytes, limit: int) -> bool:
    # a large body is scanned off the event loop, so streams and probes keep flowing meanwhile
    if len(body) < 64 << 10:
        return json_depth_exceeds(body, limit)
    return await asyncio.to_thread(json_depth_exceeds, body, limit)


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """Whether brackets outside strings nest deeper than ``limit`` (the parser would recurse that deep).

    C-speed throughout (a regex to drop strings, ``bytes.translate``, a numpy running sum): a
    2 MB body of small arrays takes milliseconds, not the event loop's attention for a second.
    """
    if body.count(b"[") + body.count(b"{") <= limit:  # cannot nest deeper than it has brackets
        return False
    import numpy as np

    brackets = np.frombuffer(_JSON_STRINGS.sub(b"", body).translate(None, _NOT_BRACKETS), dtype=np.uint8)
    steps = np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1)
    return bool(np.cumsum(steps).max(initial=0) > limit)


class LightJSONRequest(Request):
    """Parses a JSON body with the cyclic garbage collector paused: a body of many small arrays or
    objects otherwise triggers collection after collection while it is built, and the parse (on
    the event loop, holding the GIL) stalls every other connection several times longer."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            paused = gc.isenabled()
            gc.disable()
            try:
                self._json = json.loads(body)
            finally:
                if paused:
                    gc.enable()
        return self._json


class LightJSONRoute(APIRoute):
    """A FastAPI route that hands its handler a :class:`LightJSONRequest`."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def light_json_handler(request: Request) -> Response:
            return await handler(LightJSONRequest(request.scope, request.receive, request._send))

        return light_json_handler


def with_light_json(router: APIRouter) -> APIRouter:
    """``router`` with its plain API routes made :class:`LightJSONRoute` (include_router rebuilds them)."""
    for route in router.routes:
        if type(route) is APIRoute:
            route.__class__ = LightJSONRoute
    return router


def _host_name(host: str) -> str:
    """``Host`` without its port, lower-cased, as host names compare (``[::1]:8000`` -> ``::1``)."""
    host = host.lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _replay(messages: list[dict], receive: Callable) -> Callable:
    pending = list(messages)

    async def replay() -> dict:
        return pending.pop(0) if pending else await receive()

    return replay


class RequestIdMiddleware:
    """Every response carries ``X-Request-Id``: the client's, or a new 32-hex id; also as ``request-id``,
    the header Anthropic's SDKs read (``_request_id``)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"x-request-id"), "")
        request_id = given[:128] if given.isprintable() and given.strip() else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        current_http.set(
            {
                "method": scope.get("method", ""),
                "path": scope.get("path", ""),
                "request_id": request_id,
                "client": scope.get("client"),
                # header names lower-cased; the API key is never kept
                "headers": {
                    k.decode("latin-1").lower(): v.decode("latin-1")
                    for k, v in scope["headers"]
                    if k.lower() not in (b"authorization", b"x-api-key", b"cookie")
                },
            }
        )

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                value = request_id.encode("latin-1")
                message["headers"] = [*message["headers"], (b"x-request-id", value), (b"request-id", value)]
            await send(message)

        await self.app(scope, receive, send_with_id)


def build_app(
    state: ServerState,
    *,
    api_keys: list[str],
    allowed_origins: list[str],
    allow_credentials: bool,
    limits: Limits,
    root_path: str,
    docs: bool,
    metrics: Any,
    health_timeout: float,
) -> FastAPI:
    app = FastAPI(
        title="llmp",
        version=__version__,
        root_path=root_path,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    app.state.llmp = state
    _add_exception_handlers(app, state)
    _add_probe_routes(app, state, metrics, health_timeout)
    app.add_middleware(
        GateMiddleware,
        state=state,
        api_keys=api_keys,
        limits=limits,
        on_rejected=lambda reason: metrics.rejected.labels(reason=reason, **metrics.label).inc(),
    )
    if allowed_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=allowed_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            allow_credentials=allow_credentials and "*" not in allowed_origins,
            expose_headers=["X-Request-Id", "request-id"],
        )
    app.add_middleware(RequestIdMiddleware)
    return app


def load_middleware(path: str) -> Any:
    """The object ``--middleware`` names (``module.attribute``, or ``module:attribute``): a class, or an
    async function; a ``ValueError`` saying what is wrong otherwise."""
    import importlib
    import inspect

    module_name, _, attribute = path.replace(":", ".").rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"--middleware {path}: give it as module.attribute")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--middleware {path}: cannot import it: {type(exc).__name__}: {exc}") from None
    if not (inspect.isclass(found) or inspect.iscoroutinefunction(found)):
        raise ValueError(f"--middleware {path}: must be a middleware class or an async function, got {found!r}")
    return found


def add_user_middleware(app: FastAPI, paths: Sequence[str]) -> None:
    """vLLM's ``--middleware``: each object wraps the app, the last given outermost; a class is added with
    ``add_middleware``, an async function ``(request, call_next)`` as an HTTP middleware."""
    import inspect

    for path in paths:
        found = load_middleware(path)
        if inspect.isclass(found):
            app.add_middleware(found)
        else:
            app.middleware("http")(found)


def _add_exception_handlers(app: FastAPI, state: ServerState) -> None:
    def respond(request: Request, error: APIError) -> JSONResponse:
        status, body = state.render_error(route_path(request.scope), error)
        return JSONResponse(body, status_code=status, headers=error.headers)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return respond(request, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(exc.errors()))
        return respond(request, APIError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = {404: "not_found_error", 405: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
        return respond(
            request,
            APIError(exc.status_code, str(exc.detail), type=type_, headers=dict(getattr(exc, "headers", None) or {})),
        )

    @app.exception_handler(ValueError)
    @app.exception_handler(TypeError)
    @app.exception_handler(EngineDeadError)
    @app.exception_handler(EngineSleepingError)  # its own handler: Starlette re-raises what only Exception's catches
    @app.exception_handler(LLMPError)  # llmp's typed errors (an adapter gone from disk: a 404), likewise
    @app.exception_handler(Exception)
    async def request_failed(request: Request, exc: Exception) -> JSONResponse:
        error = as_api_error(exc)
        if error.status >= 500 and not isinstance(exc, EngineDeadError | EngineSleepingError):
            log.error("unhandled error in a request handler", exc_info=exc)
        return respond(request, error)


def _add_probe_routes(app: FastAPI, state: ServerState, metrics: Any, health_timeout: float) -> None:
    @app.get("/ready", summary="200 once the model is loaded, warmed up and the engine answers a ping; 503 otherwise")
    @app.get("/health", summary="Same as /ready")
    @app.api_route("/ping", methods=["GET", "POST"], include_in_schema=False)  # SageMaker's, as vLLM answers it
    async def ready() -> Response:
        if not state.ready:
            body = error_body(
                f"not ready: {state.phase}" + (f" ({state.error})" if state.error else ""),
                "service_unavailable_error",
                code=503,
            )
            return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
        try:
            await state.probe_engine(health_timeout)
        except Exception as exc:
            return JSONResponse(
                error_body(f"the engine is not healthy: {exc}", "service_unavailable_error", code=503),
                status_code=503,
                headers={"Retry-After": "1"},
            )
        return Response(status_code=200)

    @app.get("/live", summary="200 while the HTTP server runs (no engine call)")
    async def live() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/load", summary="The requests being answered now (vLLM's server load, for load balancers)")
    async def load() -> dict[str, int]:
        return {"server_load": state.in_flight}

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        body = await metrics.render(state.engine)
        return Response(body, media_type=CONTENT_TYPE_LATEST)
