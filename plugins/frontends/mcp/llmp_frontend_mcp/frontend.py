"""The MCP front-end: one ``MCPServer`` (mcp 2.x SDK) whose tools run on the engine.

The same server object is served two ways:

* over streamable HTTP at ``/mcp`` on ``llmp serve`` (``http_router``), behind the
  shared server's gate, so ``--api-key``, body limits and admission apply to it;
* over stdio by ``llmp mcp MODEL`` (``llmp_frontend_mcp.cli``).

Tools: ``generate`` (text completion), ``chat`` (chat template, then completion) and
``tokenize``; ``generate`` and ``chat`` take an optional ``model``: a served name or a LoRA
adapter's (``--lora-modules``). Resources: ``llmp://models`` (every served name and adapter,
with ``max_model_len``) and ``llmp://models/{name}``. A failure of a tool (bad argument, context too long,
engine gone) is returned as a tool error (``isError`` with the message), never a crash.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from llmp import LoRARequest, Prompt
from llmp.frontend import APIError, FrontendKit, SamplingRequest, as_api_error, engine_request_id
from llmp.options import FrontendOptions

log = logging.getLogger("llmp.frontend.mcp")

MCP_PATH = "/mcp"
# a browser page on these may call /mcp whatever --allowed-origins says (MCP transports: validate Origin)
LOOPBACK_ORIGIN = re.compile(r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?", re.IGNORECASE)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Annotated[str, Field(description="system, user or assistant")]
    content: Annotated[str, Field(description="The message text")]


class Tokens(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


MaxTokens = Annotated[int | None, Field(ge=1, description="Most tokens to generate (default: the rest of the context)")]
Temperature = Annotated[
    float | None, Field(ge=0, le=2, description="Sampling temperature; 0 is greedy (default: the model's, else 1)")
]
TopP = Annotated[float | None, Field(gt=0, le=1, description="Nucleus sampling mass (default: the model's, else 1)")]
TopK = Annotated[
    int | None, Field(description="Sample among the k likeliest tokens; -1 or 0: all (default: the model's)")
]
Seed = Annotated[int | None, Field(description="Random seed: the same seed and arguments give the same text")]
Stop = Annotated[list[str] | str | None, Field(description="Stop strings, not included in the text")]
Model = Annotated[
    str | None,
    Field(description="A served model or LoRA adapter name (see the llmp://models resource); default: the model"),
]


class McpFrontend(FrontendKit):
    """Tools over the engine client (see ``llmp.api.Frontend``)."""

    error_paths = (MCP_PATH,)  # the gate's refusals on /mcp (401, 413, 503 ...) as JSON-RPC errors
    # one path for every message: only a tool call that runs the model is refused at capacity, as a tool error
    self_admitted_paths = (MCP_PATH,)

    @staticmethod
    def render_error(error: APIError) -> tuple[int, Any]:
        return error.status, _jsonrpc_error(error.status, error.message)

    def __init__(self, engine: Any, options: FrontendOptions) -> None:
        super().__init__(engine, options)
        self.server = self.build_server()
        self._manager: Any = None
        self._running: asyncio.Task | None = None
        self._started: asyncio.Future | None = None

    # -- the MCP server ------------------------------------------------------------

    def build_server(self) -> Any:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.resources.templates import ResourceSecurity

        tools = []
        if self.task == "generate":
            tools.append(
                _strict_tool(
                    self.generate,
                    name="generate",
                    structured_output=False,
                    description="Continue a text prompt with the model; returns the generated text.",
                )
            )
            tools.append(
                _strict_tool(
                    self.chat,
                    name="chat",
                    structured_output=False,
                    description="Answer a conversation (messages of role and content) with the model's "
                    "chat template; returns the assistant's reply.",
                )
            )
        tools.append(_strict_tool(self.tokenize, name="tokenize", description="The model's token ids of a text."))
        server = MCPServer(
            "llmp",
            version=_version(),
            instructions=f"An LLM inference server serving {', '.join(self.model_names)}: call `generate` to "
            "complete text, `chat` to answer a conversation, `tokenize` to see token ids.",
            log_level="WARNING",  # only a default: the server has configured logging already
            tools=tools,
        )
        server.resource(
            "llmp://models",
            name="models",
            mime_type="application/json",
            description="The served models: names and max_model_len.",
        )(self.models_resource)
        # names may be paths (the model directory): only compared with the served names, never opened
        server.resource(
            "llmp://models/{+name}",
            name="model",
            mime_type="application/json",
            description="One served model by name.",
            security=ResourceSecurity(exempt_params={"name"}),
        )(self.model_resource)
        return server

    # -- tools --------------------------------------------------------------------

    async def generate(
        self,
        prompt: Annotated[str, Field(description="The text to continue")],
        max_tokens: MaxTokens = None,
        temperature: Temperature = None,
        top_p: TopP = None,
        top_k: TopK = None,
        seed: Seed = None,
        stop: Stop = None,
        model: Model = None,
    ) -> str:
        async def run() -> str:
            lora = await self.lora_for(model)
            [record] = await self.prompt_inputs(prompt, "prompt", True)  # as /v1/completions
            sampling = SamplingRequest(
                max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=stop
            )
            return await self._complete(record, sampling, "mcp-gen", lora)

        return await _as_tool(run)

    async def chat(
        self,
        messages: Annotated[list[ChatMessage], Field(min_length=1, description="The conversation so far")],
        max_tokens: MaxTokens = None,
        temperature: Temperature = None,
        top_p: TopP = None,
        top_k: TopK = None,
        seed: Seed = None,
        stop: Stop = None,
        model: Model = None,
    ) -> str:
        async def run() -> str:
            lora = await self.lora_for(model)
            conversation = [m.model_dump() for m in messages]
            record = await self.conversation_prompt(conversation, None)  # as /v1/chat/completions
            sampling = SamplingRequest(
                max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=stop
            )
            return await self._complete(record, sampling, "mcp-chat", lora)

        return await _as_tool(run)

    async def tokenize(
        self,
        text: Annotated[str, Field(description="The text to tokenize")],
        add_special_tokens: Annotated[bool, Field(description="Add BOS and the like, as a prompt would")] = True,
    ) -> Tokens:
        async def run() -> Tokens:
            ids = await self.encode(text, add_special_tokens)
            return Tokens(tokens=ids, count=len(ids), max_model_len=self.max_model_len)

        return await _as_tool(run)

    async def _complete(self, prompt: Prompt, sampling: SamplingRequest, prefix: str, lora: LoRARequest | None) -> str:
        params = self.sampling_params(sampling, len(prompt.token_ids))
        final = None
        async for output in self.engine.generate(prompt, params, engine_request_id(prefix), lora_request=lora):
            final = output
        if final is None or not final.outputs:
            raise APIError(500, "the engine returned no output")
        return final.outputs[0].text

    # -- resources ----------------------------------------------------------------

    def _models(self) -> dict[str, dict[str, Any]]:
        """Each served name and LoRA adapter (with ``parent``, its base model) by name."""
        models = {}
        for card in self.model_cards():
            info = {
                "name": card["id"],
                "max_model_len": self.max_model_len,
                "task": self.task,
                "root": card["root"],
                "vocab_size": self.vocab_size,
            }
            if card.get("parent"):
                info["parent"] = card["parent"]
            models[card["id"]] = info
        return models

    def models_resource(self) -> str:
        return json.dumps({"models": list(self._models().values())})

    def model_resource(self, name: str) -> str:
        from mcp.server.mcpserver.exceptions import ResourceNotFoundError

        models = self._models()
        if name not in models:
            raise ResourceNotFoundError(f"the model {name!r} is not served here; served: {', '.join(models)}")
        return json.dumps(models[name])

    # -- streamable HTTP on the shared server -----------------------------------------

    def http_router(self) -> Any:
        from fastapi import APIRouter
        from mcp.server.transport_security import TransportSecuritySettings

        # stateless: every POST is a whole exchange, so no session outlives a request or a restart;
        # JSON responses rather than SSE streams (tools answer once). Host is the gate's job
        # (--allowed-hosts) and Origin handle_http's (with --allowed-origins, which the SDK's own
        # DNS-rebinding check does not know), so that check is off.
        # the gate has already bounded the body (--max-request-body-bytes): no second, smaller cap
        # (with no server in front, the SDK's own cap)
        body_cap = self.options.max_request_body_bytes
        self.server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            stateless_http=True,
            json_response=True,
            **({"max_request_body_size": body_cap} if body_cap is not None else {}),
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self._manager = self.server.session_manager
        router = APIRouter()
        # an ASGI callable (not a function) as endpoint: starlette hands it the raw scope/receive/send
        endpoint = _AsgiEndpoint(self.handle_http)
        # POST only: stateless, there is no session to DELETE, and a GET stream could never carry
        # anything but would hold a connection open; the spec lets a server answer GET with 405
        for path in (MCP_PATH, MCP_PATH + "/"):
            router.add_route(path, endpoint, methods=["POST"], include_in_schema=False)
        return router

    async def handle_http(self, scope: dict, receive: Callable, send: Callable) -> None:
        if not _origin_allowed(scope):  # a page of another site (DNS rebinding): MCP transports must refuse
            from starlette.responses import JSONResponse

            message = "the Origin header is not an allowed origin (--allowed-origins) nor a loopback one"
            return await JSONResponse(_jsonrpc_error(403, message), status_code=403)(scope, receive, send)
        await self._ensure_manager()
        await _cancelled_on_disconnect(self._manager.handle_request, scope, receive, send)

    async def _ensure_manager(self) -> None:
        """The session manager's ``run()`` context, entered once, on first use, in a task of its own."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            self._running = asyncio.create_task(self._run_manager(self._started), name="frontend-mcp-sessions")
        await asyncio.shield(self._started)

    async def _run_manager(self, started: asyncio.Future) -> None:
        try:
            async with self._manager.run():
                started.set_result(None)
                await asyncio.Event().wait()  # until the server's loop ends
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc if isinstance(exc, Exception) else RuntimeError("MCP sessions stopped"))
            raise

    async def serve(self) -> None:
        """HTTP only: the shared server runs the routes; should it run ``serve`` too, keep the sessions up."""
        if self._manager is not None:
            await self._ensure_manager()
            await asyncio.Event().wait()


async def _cancelled_on_disconnect(app: Callable, scope: dict, receive: Callable, send: Callable) -> None:
    """Run the ASGI ``app``, cancelled if the client disconnects first: the SDK reads the body, then
    waits for the tool's answer without listening to the client, and a generation whose client has
    gone would run to its end (on streamable HTTP a disconnect cancels the request)."""
    body_read, gone = asyncio.Event(), asyncio.Event()

    async def app_receive() -> dict:
        if body_read.is_set():  # after the body, only the client's departure can come (the watcher's)
            await gone.wait()
            return {"type": "http.disconnect"}
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
        elif not message.get("more_body", False):
            body_read.set()
        return message

    async def watch() -> None:
        await body_read.wait()
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    task = asyncio.ensure_future(app(scope, app_receive, send))
    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():  # the client left: its tool call (and the engine's request) is cancelled
        task.cancel()
        await asyncio.wait({task})
        return
    task.result()


class _AsgiEndpoint:
    """Wraps a coroutine function so starlette's ``Route`` treats it as an ASGI app."""

    def __init__(self, handler: Callable[[dict, Callable, Callable], Awaitable[None]]) -> None:
        self.handler = handler

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        await self.handler(scope, receive, send)


async def _as_tool(run: Callable[[], Awaitable[Any]]) -> Any:
    """Run a tool's work; any failure becomes a ``ToolError`` carrying the client-facing message."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return await run()
    except ToolError:
        raise
    except Exception as exc:
        error = as_api_error(exc)
        if error.status >= 500 and error.code != "overloaded":  # a refusal at capacity is no failure
            log.exception("MCP tool failed")
        raise ToolError(error.message) from None


def _strict_tool(fn: Callable, **kwargs: Any) -> Any:
    """``fn`` as an MCP ``Tool`` whose arguments are checked as its schema says: an unknown argument
    (a typo, an unsupported sampling field) or a value of the wrong type is a tool error, where the
    SDK's lax model would drop or coerce it; the schema says ``additionalProperties: false``."""
    from mcp.server.mcpserver.tools import Tool

    tool = Tool.from_function(fn, **kwargs)
    lax = tool.fn_metadata.arg_model
    config = ConfigDict(**lax.model_config, extra="forbid", strict=True)
    strict = type(lax.__name__, (lax,), {"model_config": config, "__module__": lax.__module__})
    tool.fn_metadata.arg_model = strict
    tool.parameters = strict.model_json_schema(by_alias=True)
    return tool


def _jsonrpc_error(status: int, message: str) -> dict[str, Any]:
    """A JSON-RPC error of no request (id null), as the SDK answers HTTP-level failures."""
    from mcp.types import INTERNAL_ERROR, INVALID_REQUEST

    code = INTERNAL_ERROR if status >= 500 else INVALID_REQUEST
    return {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}


def _origin_allowed(scope: dict) -> bool:
    """No ``Origin`` (not a browser), a loopback one, or one of the server's ``--allowed-origins``
    (read from its CORS middleware: the front-end options do not carry them)."""
    origin = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"origin"), None)
    if origin is None or LOOPBACK_ORIGIN.fullmatch(origin):
        return True
    from starlette.middleware.cors import CORSMiddleware

    app = scope.get("app")
    allowed = [
        o for m in getattr(app, "user_middleware", ()) if m.cls is CORSMiddleware for o in m.kwargs["allow_origins"]
    ]
    return "*" in allowed or origin in allowed


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llmp-frontend-mcp")
    except PackageNotFoundError:
        return "0"
