"""The gRPC front-end: service ``llmp.v1.Llmp`` (``llmp.proto``) over the engine, on its own port.

It returns no HTTP router: ``serve`` runs a ``grpc.aio`` server until the launcher cancels it,
on the HTTP server's host at ``--grpc-port`` (``LLMP_GRPC_PORT``), behind the server's API keys
(``--api-key``, ``LLMP_API_KEY``): with any, every RPC but ``Health`` needs the metadata
``authorization: Bearer <key>``. A request message is bounded as an HTTP body is (``--max-request-body-bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import logging
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from llmp import Prompt, SamplingParams
from llmp.api import LLMPError
from llmp.frontend import APIError, FrontendKit, SamplingRequest, as_api_error, bad_request, engine_request_id
from llmp.options import FrontendOptions
from llmp_frontend_grpc import llmp_pb2 as pb
from llmp_frontend_grpc import llmp_pb2_grpc as pb_grpc

log = logging.getLogger("llmp.frontend.grpc")

STOP_GRACE_S = 1.0  # in-flight RPCs get this long once the server shuts down, with no --shutdown-timeout
# past the drain, the time a call the engine aborted at its end takes to send its last message
# (finish_reason abort, the text so far), before grpcio cancels what is left
ABORT_FLUSH_S = 2.0

STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


def status_code(status: int) -> grpc.StatusCode:
    """The gRPC code of an :class:`APIError`'s HTTP status (anything unlisted is INTERNAL)."""
    return STATUS_CODES.get(status, grpc.StatusCode.INTERNAL)


class GrpcFrontend(FrontendKit):
    """Translates ``llmp.v1.Llmp`` calls into engine requests (see ``llmp.api.Frontend``)."""

    def __init__(self, engine: Any, options: FrontendOptions) -> None:
        super().__init__(engine, options)
        if options.host is None:
            raise LLMPError("the grpc front-end listens on the server's host: FrontendOptions.host must be set")
        self.port = options.grpc_port
        self.host = options.host
        self.key_digests = [hashlib.sha256(k.strip().encode()).digest() for k in options.api_keys if k.strip()]
        # --max-request-body-bytes bounds a request message as it bounds an HTTP body
        self.max_message_bytes = options.max_request_body_bytes
        self.grace_s = STOP_GRACE_S if options.shutdown_timeout is None else options.shutdown_timeout
        self.server: grpc.aio.Server | None = None

    def http_router(self) -> None:
        return None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"

    async def serve(self) -> None:
        """Serve until cancelled; then stop: new RPCs are refused, those in flight get the server's
        ``--shutdown-timeout`` (:data:`STOP_GRACE_S` without a server in front), after which the
        engine aborts them and they end with ``finish_reason`` abort, as HTTP requests do."""
        # without so_reuseport 0, a second server on the same port would bind too, silently
        options = [("grpc.so_reuseport", 0)]
        if self.max_message_bytes is not None:  # a larger request is RESOURCE_EXHAUSTED, from grpcio
            options.append(("grpc.max_receive_message_length", min(self.max_message_bytes, 2**31 - 1)))  # an int32
        server = grpc.aio.server(options=options)
        add_servicer(LlmpServicer(self), server)
        try:
            server.add_insecure_port(self.address)
        except RuntimeError as exc:
            log.error("the gRPC front-end cannot listen on %s: %s (choose a free --grpc-port)", self.address, exc)
            raise
        await server.start()
        self.server = server
        log.info(
            "gRPC front-end (llmp.v1.Llmp) listening on %s%s",
            self.address,
            " (API key required)" if self.key_digests else "",
        )
        try:
            await asyncio.Future()  # until cancelled: grpc's wait_for_termination, cancelled, would cut the drain
        finally:
            with contextlib.suppress(asyncio.CancelledError):
                await server.stop(self.grace_s + ABORT_FLUSH_S)

    # -- requests ----------------------------------------------------------------

    def authorized(self, metadata: Any) -> bool:
        """No keys configured, or ``authorization: Bearer <one of them>`` (compared in constant time)."""
        if not self.key_digests:
            return True
        header = next((v for k, v in (metadata or ()) if k.lower() == "authorization"), "")
        if isinstance(header, bytes):
            header = header.decode("latin-1")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(token.strip().encode()).digest()
        # compare against every key, so the time taken does not tell which one nearly matched
        return sum(hmac.compare_digest(digest, key) for key in self.key_digests) > 0

    async def prompt(self, request: Any) -> Prompt:
        """The engine's prompt of a ``GenerateRequest`` or ``TokenizeRequest``."""
        kind = request.WhichOneof("input")
        add = request.add_special_tokens if request.HasField("add_special_tokens") else None
        if kind == "text":
            [prompt] = await self.prompt_inputs(request.text, "text", True if add is None else add)
        elif kind == "token_ids":
            [prompt] = await self.prompt_inputs(list(request.token_ids.ids), "token_ids", False)
        elif kind == "chat":
            prompt = await self.chat_prompt(request.chat, bool(add))
        else:
            raise bad_request("give the prompt as one of text, token_ids or chat", "input")
        return prompt

    async def chat_prompt(self, chat: Any, add_special_tokens: bool) -> Prompt:
        if not chat.messages:
            raise bad_request("chat.messages must not be empty", "chat.messages")
        if any(not m.role for m in chat.messages):
            raise bad_request("every chat message needs a role", "chat.messages")
        conversation = [{"role": m.role, "content": m.content} for m in chat.messages]
        body = SimpleNamespace(add_generation_prompt=True, add_special_tokens=add_special_tokens)
        return await self.conversation_prompt(conversation, body)

    def generate_params(self, request: Any, prompt_len: int) -> SamplingParams:
        """A ``GenerateRequest``'s sampling parameters (the kit's one path; unset fields are ``None``)."""

        def given(name: str) -> Any:
            return getattr(request, name) if request.HasField(name) else None

        sampling = SamplingRequest(
            temperature=given("temperature"),
            top_p=given("top_p"),
            top_k=given("top_k"),
            seed=given("seed"),
            max_tokens=given("max_tokens"),
            stop=list(request.stop) or None,
            ignore_eos=request.ignore_eos,
        )
        return self.sampling_params(sampling, prompt_len)

    async def start(self, request: Any, delta: bool) -> tuple[AsyncIterator[Any], int, str]:
        """The checked request started in the engine: its outputs, the prompt's length and the model
        name the responses carry (a LoRA adapter's when ``model`` names one)."""
        if self.task != "generate":
            raise APIError(501, f"this server runs the {self.task!r} task: Generate is not available")
        lora = await self.lora_for(request.model or None)
        prompt = await self.prompt(request)
        params = self.generate_params(request, len(prompt.token_ids))
        outputs = self.engine.generate(prompt, params, engine_request_id("grpc"), lora_request=lora, delta=delta)
        return outputs, len(prompt.token_ids), self.response_model(lora)

    def response(self, seq: Any, model: str, prompt_tokens: int | None = None, completion_tokens: int = 0) -> Any:
        """A ``GenerateResponse`` of (a delta of) a sequence; with usage when ``prompt_tokens`` is given."""
        message = pb.GenerateResponse(
            text=seq.text, token_ids=seq.token_ids, finish_reason=seq.finish_reason or "", model=model
        )
        if seq.stop_reason is not None:
            message.stop_reason = str(seq.stop_reason)
        if prompt_tokens is not None:
            message.usage.CopyFrom(
                pb.Usage(
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                    total_tokens=prompt_tokens + completion_tokens,
                )
            )
        return message


# -- the service -------------------------------------------------------------------


async def _fail(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    error = as_api_error(exc)
    if error.status == 500 and not isinstance(exc, APIError):  # a bug: the client only sees INTERNAL
        log.exception("gRPC request failed", exc_info=exc)
    await context.abort(status_code(error.status), error.message)


class Undecodable:
    """A request whose bytes are not the method's message: the handler answers INVALID_ARGUMENT
    (grpcio's own deserialisation failure is UNKNOWN, a server error to the client)."""

    def __init__(self, message: str, error: Exception) -> None:
        self.detail = f"the request is not a valid {message} message: {error}"


def _parser(message_class: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except DecodeError as exc:
            return Undecodable(message_class.DESCRIPTOR.full_name, exc)

    return parse


def add_servicer(servicer: LlmpServicer, server: grpc.aio.Server) -> None:
    """``add_LlmpServicer_to_server`` of the generated code, with requests that do not decode
    passed to the handler as :class:`Undecodable`."""
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["Llmp"].methods:
        request_class = getattr(pb, method.input_type.name)
        response_class = getattr(pb, method.output_type.name)
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=_parser(request_class),
            response_serializer=response_class.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("llmp.v1.Llmp", handlers),))
    server.add_registered_method_handlers("llmp.v1.Llmp", handlers)


async def _check_call(fe: GrpcFrontend, request: Any, context: grpc.aio.ServicerContext, public: bool) -> None:
    """Abort a call without a valid API key (unless the RPC is public), then one whose request did not decode."""
    if not public and not fe.authorized(context.invocation_metadata()):
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED, "invalid or missing API key (metadata 'authorization: Bearer <key>')"
        )
    if isinstance(request, Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.detail)


def _unary(public: bool = False) -> Callable:
    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        async def handler(self: LlmpServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
            await _check_call(self.fe, request, context, public)
            try:
                return await method(self, request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # noqa: BLE001  (every failure becomes a status code)
                await _fail(context, exc)

        return handler

    return wrap


class LlmpServicer(pb_grpc.LlmpServicer):
    """The RPCs; every one maps :class:`APIError` to its status code, with the message as details."""

    def __init__(self, frontend: GrpcFrontend) -> None:
        self.fe = frontend

    @_unary()
    async def Generate(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        outputs, prompt_tokens, model = await self.fe.start(request, delta=False)
        final = None
        async with contextlib.aclosing(outputs):  # cancelled (client gone, deadline): the engine aborts it
            async for final in outputs:
                pass
        if final is None:
            raise APIError(503, "the request was aborted before it produced output")
        seq = final.outputs[0]
        return self.fe.response(seq, model, prompt_tokens, len(seq.token_ids))

    async def GenerateStream(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await _check_call(self.fe, request, context, public=False)
        try:
            outputs, prompt_tokens, model = await self.fe.start(request, delta=True)
            generated = 0
            async with contextlib.aclosing(outputs):  # cancelled (client gone, deadline): the engine aborts it
                async for output in outputs:
                    seq = output.outputs[0]
                    generated += len(seq.token_ids)
                    if seq.finish_reason:
                        yield self.fe.response(seq, model, prompt_tokens, generated)
                        return
                    if seq.text or seq.token_ids:
                        yield self.fe.response(seq, model)
            raise APIError(503, "the request was aborted before it finished")
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001  (every failure becomes a status code)
            await _fail(context, exc)

    @_unary()
    async def Tokenize(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        fe = self.fe
        fe.check_model(request.model or None)
        kind = request.WhichOneof("input")
        add = request.add_special_tokens if request.HasField("add_special_tokens") else None
        if kind == "chat":
            ids = (await fe.chat_prompt(request.chat, bool(add))).token_ids
        else:  # text, "" included
            ids = await fe.encode(request.text, True if add is None else add)
        return pb.TokenizeResponse(token_ids=ids, count=len(ids), max_model_len=fe.max_model_len)

    @_unary()
    async def ListModels(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """The served names, then the LoRA adapters (``root``: the adapter's directory)."""
        fe = self.fe
        return pb.ListModelsResponse(
            models=[
                pb.Model(id=card["id"], root=card["root"], max_model_len=card["max_model_len"] or fe.max_model_len)
                for card in fe.model_cards()
            ]
        )

    @_unary(public=True)
    async def Health(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            await self.fe.engine.check_health()
        except Exception as exc:  # noqa: BLE001  (any failure means not serving)
            raise APIError(503, f"the engine is not healthy: {exc}") from None
        return pb.HealthResponse(status=pb.HealthResponse.SERVING)
