"""Running ``llmp serve``: bind, answer probes at once, load the engine, mount the front-ends, serve."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import inspect
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from llmp.api import LLMPError
from llmp.engine.core_proc import WARM_UP_REQUEST_ID
from llmp.engine.engine_process import EngineProcess
from llmp.frontend.lora import check_module_names, load_lora_modules
from llmp.frontend.startup import frontend_options, read_chat_template, served_model_names
from llmp.lora import LoRAModulePath, parse_lora_module
from llmp.options import FrontendOptions, ServerOptions
from llmp.server.app import (
    LOOPBACK_HOSTS,
    Limits,
    ServerState,
    add_user_middleware,
    build_app,
    load_middleware,
    with_light_json,
)
from llmp.server.metrics import MeteredEngine, ServerMetrics
from llmp.server.observers import check_request_observers, close_request_observers, request_observers
from llmp.server.settings import ServeSettings

log = logging.getLogger("llmp.server")
ENGINE_WATCH_S = 0.5
SHUTDOWN_GRACE_S = 3.0
FRONTEND_BIND_S = 0.2  # a front-end with its own port binds it as its serve() starts: a busy port fails by then


def run(settings: ServeSettings, engine_process: EngineProcess | None = None) -> int:
    """Serve until interrupted; the exit status (0 after a clean shutdown, an interrupt included). The engine
    runs in ``engine_process`` when given (started by the caller, not yet given its arguments)."""
    started = time.monotonic()
    logging.basicConfig(level=settings.server.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    # until the server handles the signals itself (while the model resolves, the engine spawns),
    # SIGTERM stops start-up as Ctrl-C does: quietly, status 0
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _start_and_serve(settings, started, engine_process)
    except KeyboardInterrupt:
        log.info("interrupted")
        return 0


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _start_and_serve(settings: ServeSettings, started: float, engine_process: EngineProcess | None) -> int:
    from llmp.model_files.resolve import resolve_model

    try:  # what the options alone cannot tell (they were checked when parsed): before anything starts
        _check_ports(settings)
        _check_tls(settings)
        check_request_observers(settings.server)
        for path in settings.server.middleware:  # importable, and a middleware: before the model loads
            load_middleware(path)
        frontends = _frontend_specs(settings.server.frontend)
        chat_template = read_chat_template(settings.frontend.chat_template)
        lora_modules = [parse_lora_module(value) for value in settings.server.lora_modules]
        check_module_names(lora_modules, served_model_names(settings.server.served_model_name, settings.engine.model))
        settings = with_vllm_lora_variables(settings, os.environ)
        # the model, resolved once (a GGUF file converted) before the port is bound; the engine takes the record
        model = resolve_model(settings.engine)
        if settings.server.api_server_count > 1:
            from llmp.server.api_servers import check_api_servers

            check_api_servers(settings)
        http = settings.server
        sock = _bind_unix(http.uds) if http.uds else _bind(http.host, http.port)
    except (ValueError, TypeError, LLMPError) as exc:
        _error(exc)
        return 2
    if settings.server.api_server_count > 1:
        return _serve_api_servers(settings, model, sock, frontends, started, engine_process)
    return serve_one(
        settings, model, sock, frontends, chat_template, lora_modules, started, engine_process=engine_process
    )


def _serve_api_servers(
    settings: ServeSettings,
    model: Any,
    sock: socket.socket,
    frontends: list[tuple[str, Any]],
    started: float,
    engine_process: EngineProcess | None,
) -> int:
    """``--api-server-count`` processes (``llmp.server.api_servers``), started as one server starts."""
    from llmp.server.api_servers import LaunchSteps, serve_api_servers

    http = settings.server
    if http.enable_admin_api:  # once here, not once per API server
        from llmp.server.admin import warn_admin_api

        warn_admin_api(http)
    name = served_model_names(http.served_model_name, settings.engine.model)[0]
    steps = LaunchSteps(
        warm_up=_warm_up,
        print_ready=lambda seconds: _print_ready(http, sock.getsockname(), name, seconds, frontends),
        error=_error,
        drain_s=http.shutdown_timeout + SHUTDOWN_GRACE_S,
    )
    return serve_api_servers(settings, model, sock, steps, started, engine_process)


def serve_one(
    settings: ServeSettings,
    model: Any,
    sock: socket.socket,
    frontends: list[tuple[str, Any]],
    chat_template: str | None,
    lora_modules: list[LoRAModulePath],
    started: float,
    replica: Any = None,
    engine_process: EngineProcess | None = None,
) -> int:
    """One API server on ``sock``: the only one, with its own engine; or, with ``replica`` (an
    ``api_servers.Replica``), one of ``--api-server-count``, attached to its launcher's engine. The engine
    runs in ``engine_process`` when given."""
    # Start-up time is mostly imports: the engine process started first (`llmp serve` starts it before
    # this process imports the web stack and resolves the model), and this process loads the tokenizer
    # while the engine loads the model. An engine process started here is spawned before any other
    # thread runs (a vfork beside a running thread can fail with EFAULT).
    from llmp.async_llm import AsyncLLM

    attach = None if replica is None else replica.attachment
    try:
        starting = AsyncLLM(
            model,
            engine_mode="process",
            wait=False,
            attach=attach,
            engine_process=engine_process,
            **settings.engine.keywords(),
        )
    except (ValueError, TypeError, LLMPError) as exc:
        _error(exc)
        return 2
    starter = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="llmp-start")
    engine = starter.submit(_wait_ready, starting)
    tokenizer = starter.submit(_load_tokenizer, model.tokenizer)
    starter.shutdown(wait=False)
    try:
        classes = [(name, spec.load()) for name, spec in frontends]
    except LLMPError as exc:  # the engine process, already starting, exits with this one
        _error(exc)
        return 2
    return asyncio.run(
        _serve(settings, classes, chat_template, lora_modules, sock, engine, tokenizer, started, replica)
    )


def with_vllm_lora_variables(settings: ServeSettings, environ: Mapping[str, str]) -> ServeSettings:
    """vLLM's variables as aliases of llmp's options, when those are not set:
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` (``--enable-lora-runtime-updates``; with ``--enable-lora``
    only) and ``VLLM_LORA_RESOLVER_CACHE_DIR`` (``--lora-resolver-dir``)."""
    frontend = settings.frontend
    allow = environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").strip().lower() in ("1", "true")
    if allow and not frontend.enable_lora_runtime_updates:
        if settings.engine.enable_lora:
            frontend = dataclasses.replace(frontend, enable_lora_runtime_updates=True)
        else:
            log.warning("VLLM_ALLOW_RUNTIME_LORA_UPDATING is set, but LoRA is off (--enable-lora): ignored")
    cache_dir = environ.get("VLLM_LORA_RESOLVER_CACHE_DIR", "").strip()
    if cache_dir and frontend.lora_resolver_dir is None:
        frontend = dataclasses.replace(frontend, lora_resolver_dir=cache_dir)
    if frontend.lora_resolver_dir is not None and not frontend.enable_lora_runtime_updates:
        log.warning("the LoRA resolver directory is not used without --enable-lora-runtime-updates")
    if frontend.enable_lora_runtime_updates:
        log.warning(
            "LoRA adapters can be loaded at run time (--enable-lora-runtime-updates): any client "
            "(with the API key) can make the server read adapters from its disk"
        )
    return dataclasses.replace(settings, frontend=frontend)


def _check_ports(settings: ServeSettings) -> None:
    """The gRPC front-end listens on its own port: not the HTTP one (it would fail only once loaded)."""
    http_port, grpc_port = settings.server.port, settings.frontend.grpc_port
    if "grpc" in settings.server.frontend and http_port == grpc_port != 0:
        raise LLMPError(f"--port and --grpc-port are both {http_port}: give the gRPC front-end another --grpc-port")


def _check_tls(settings: ServeSettings) -> None:
    """The TLS options, and their files loaded as uvicorn will load them: a missing, unreadable or
    mismatched file is one line now, not a traceback from every API server later."""
    import ssl

    http = settings.server
    files = {"--ssl-certfile": http.ssl_certfile, "--ssl-keyfile": http.ssl_keyfile}
    files["--ssl-ca-certs"] = http.ssl_ca_certs
    if http.ssl_certfile is None:
        given = [flag for flag, path in files.items() if path]
        given += [f"--ssl-cert-reqs {http.ssl_cert_reqs}"] if http.ssl_cert_reqs else []
        if given:
            raise LLMPError(f"{given[0]} needs --ssl-certfile (the server's certificate)")
        return
    if http.ssl_cert_reqs and http.ssl_ca_certs is None:
        raise LLMPError(f"--ssl-cert-reqs {http.ssl_cert_reqs} checks client certificates: give --ssl-ca-certs")
    if "grpc" in http.frontend:
        raise LLMPError("the grpc front-end's own port (--grpc-port) does not serve TLS: leave out --frontend grpc")
    for flag, path in files.items():
        if path is not None:
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise LLMPError(f"{flag} {path}: {exc.strerror}") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    pair = http.ssl_certfile + (f" and {http.ssl_keyfile}" if http.ssl_keyfile else "")
    try:
        # an encrypted key would make every API server ask for its pass phrase (or fail): refused now
        context.load_cert_chain(http.ssl_certfile, http.ssl_keyfile, password=_no_pass_phrase)
    except _EncryptedKey:
        raise LLMPError(
            f"cannot use {pair} as the TLS certificate and key: the key is encrypted with a pass phrase, "
            "and encrypted keys are not supported (decrypt it: openssl pkey -in KEY -out PLAIN.key)"
        ) from None
    except ssl.SSLError as exc:
        why = "the key does not match the certificate" if exc.reason == "KEY_VALUES_MISMATCH" else "not PEM files"
        raise LLMPError(f"cannot use {pair} as the TLS certificate and key: {why} ({exc.reason or exc})") from None
    except OSError as exc:
        raise LLMPError(f"cannot use {pair} as the TLS certificate and key: {exc.strerror or exc}") from None
    if http.ssl_ca_certs is not None:
        try:
            context.load_verify_locations(http.ssl_ca_certs)
        except ssl.SSLError as exc:
            raise LLMPError(f"--ssl-ca-certs {http.ssl_ca_certs}: no CA certificates ({exc.reason or exc})") from None


class _EncryptedKey(Exception):
    """The TLS key asked for a pass phrase."""


def _no_pass_phrase() -> bytes:
    raise _EncryptedKey


def tls_options(http: ServerOptions) -> dict[str, Any]:
    """uvicorn's TLS settings (none without --ssl-certfile)."""
    if http.ssl_certfile is None:
        return {}
    return {
        "ssl_certfile": http.ssl_certfile,
        "ssl_keyfile": http.ssl_keyfile,
        "ssl_ca_certs": http.ssl_ca_certs,
        "ssl_cert_reqs": http.ssl_cert_reqs,
    }


def _error(exc: BaseException) -> None:
    """One ``llmp: error:`` line, as every command reports what stops it."""
    print(f"llmp: error: {exc}", file=sys.stderr, flush=True)


def _wait_ready(engine: Any) -> Any:
    engine.wait_ready()
    return engine


def _load_tokenizer(path: str) -> Any:
    from llmp.engine.process_settings import release_freed_memory
    from llmp.model_files.tokenizer import load_tokenizer

    started = time.monotonic()
    tokenizer = load_tokenizer(path, light=False)  # its chat templates are transformers'
    release_freed_memory()  # reading tokenizer.json leaves about as much freed as the tokenizer keeps
    log.debug("tokenizer loaded in %.2f s (in a thread)", time.monotonic() - started)
    return tokenizer


def _frontend_specs(names: tuple[str, ...]) -> list[tuple[str, Any]]:
    """The front-ends to mount, in order: each named one after those it ``requires`` (mounted too)."""
    from llmp import plugins, registry

    plugins.load_plugins()
    specs: dict[str, Any] = {}

    def add(name: str, wanted_by: tuple[str, ...] = ()) -> None:
        if name in specs:
            return
        if name in wanted_by:
            raise LLMPError(f"front-ends require each other in a cycle: {' -> '.join((*wanted_by, name))}")
        spec = registry.get_component("frontend", name)
        for required in spec.requires:
            add(required, (*wanted_by, name))
        specs[name] = spec

    for name in names:
        add(name)
    return list(specs.items())


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise LLMPError(f"cannot listen on {host}:{port}: {exc.strerror} (choose another --port or --host)") from None
    sock.set_inheritable(True)
    return sock


def _bind_unix(path: str) -> socket.socket:
    """A Unix domain socket at ``path`` (vLLM's ``--uds``): a stale socket file (nobody listening)
    is replaced; a live one, or a path that is not a socket, is refused. The file goes at exit."""
    import atexit
    import stat

    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise LLMPError(f"cannot listen on --uds {path}: it exists and is not a socket")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            if probe.connect_ex(path) == 0:
                raise LLMPError(f"cannot listen on --uds {path}: a server is listening there")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise LLMPError(f"cannot listen on --uds {path}: {exc.strerror}") from None
    owner = os.getpid()  # API-server processes inherit the socket: the launcher alone removes the file
    atexit.register(lambda: os.getpid() == owner and os.path.exists(path) and os.unlink(path))
    sock.set_inheritable(True)
    return sock


async def _serve(
    settings: ServeSettings,
    frontends: list[tuple[str, type]],
    chat_template: str | None,
    lora_modules: list[LoRAModulePath],
    sock: socket.socket,
    starting: concurrent.futures.Future,
    tokenizer: concurrent.futures.Future,
    started: float,
    replica: Any = None,
) -> int:
    import uvicorn

    state = ServerState()
    state.started = started
    state.error_renderers = early_error_renderers(frontends)  # the gate's refusals while the model loads
    http = settings.server
    served_names = served_model_names(http.served_model_name, settings.engine.model)
    metrics = ServerMetrics(served_names[0], http.metrics_names)
    app = build_app(
        state,
        api_keys=list(http.api_key),
        allowed_origins=list(http.allowed_origins),
        allow_credentials=http.allow_credentials,
        limits=gate_limits(settings),
        root_path=http.root_path,
        docs=not http.disable_fastapi_docs,
        metrics=metrics,
        health_timeout=http.health_check_timeout,
    )
    observers = request_observers(app, http, served_names[0])  # request logs, traces
    add_user_middleware(app, http.middleware)
    if http.enable_admin_api:  # /sleep, /wake_up, /collective_rpc ...: 404 without the flag
        from llmp.server.admin import mount_admin

        mount_admin(app, state, http, warn=replica is None)  # several API servers: their launcher warned once
    config = uvicorn.Config(
        app,
        log_level=http.log_level.lower(),
        access_log=not http.disable_access_log,
        # in-flight requests are aborted at --shutdown-timeout; the grace lets their last chunks out
        timeout_graceful_shutdown=http.shutdown_timeout + SHUTDOWN_GRACE_S,
        lifespan="off",
        http=_header_timeout_protocol(http.header_timeout),
        **tls_options(http),
    )
    _redact_access_log()
    server = _server_class()(config, state, http.shutdown_timeout)
    bound = sock.getsockname()  # the bound port (--port 0 takes any free one), read before uvicorn owns it
    # (a restarted API server of several accepts connections only once ready: the others take them meanwhile)
    serving = replica.start_serving(server, sock) if replica else asyncio.create_task(server.serve(sockets=[sock]))
    log.debug("HTTP server starting after %.2f s", time.monotonic() - started)
    loaded = None
    try:
        state.phase = "loading"
        loaded = await _load_engine(settings, starting, server, serving)
        if loaded is None:  # interrupted while loading
            return await _finish(serving, 0)
        log.debug("engine ready after %.2f s", time.monotonic() - started)
        try:
            loaded.set_tokenizer(await asyncio.wrap_future(tokenizer))
        except Exception as exc:
            raise LLMPError(f"cannot load the tokenizer: {type(exc).__name__}: {exc}") from None
        log.debug("tokenizer ready after %.2f s", time.monotonic() - started)
        state.phase = "warming_up"
        if replica is None:  # several API servers: their launcher warmed the engine up once
            log.info("warming up: one request through the whole path")
            if not await _unless_stopped(_warm_up(loaded), server, serving):
                return await _finish(serving, 0)
        log.debug("warmed up after %.2f s", time.monotonic() - started)
        if lora_modules and not await _unless_stopped(
            load_lora_modules(loaded, lora_modules, served_names), server, serving
        ):
            return await _finish(serving, 0)
        limits = gate_limits(settings)
        engine = MeteredEngine(
            loaded,
            metrics,
            request_timeout=http.request_timeout,
            capacity=limits.max_in_flight,
            overload_status=http.overload_status,
            observers=observers,
        )
        options = frontend_options(
            settings.frontend,
            loaded.info,
            served_names,
            chat_template=chat_template,  # the template text, read from a --chat-template file
            # front-ends with their own port listen on the same host, behind the same keys
            host=http.host,
            api_keys=tuple(http.api_key),
            max_request_body_bytes=http.max_request_body_bytes,
            shutdown_timeout=http.shutdown_timeout,
        )
        tasks, own_servers = _mount(app, state, engine, frontends, options)
        server.own_servers = own_servers  # a signal starts their drain beside the HTTP server's
        for task in tasks:
            task.add_done_callback(lambda done: _frontend_stopped(done, state, server))
        state.engine = engine
        # ready means every front-end listens: the HTTP ones on this server, which already does (a serve()
        # that fails before its first await has failed after one turn of the loop; a later failure, such as
        # the OpenAI batch jobs' unreadable --batch-dir, stops the server with status 1 after "ready"); one
        # with a server of its own (gRPC) binds its port as its serve() starts: a busy port fails by then
        await asyncio.sleep(0)
        if own_servers:
            await asyncio.wait(own_servers, timeout=FRONTEND_BIND_S)
        failed = any(task.done() and not task.cancelled() and task.exception() for task in tasks)
        if state.phase == "warming_up" and not failed and not _stopping(server, serving) and replica is None:
            state.phase = "ready"
            _print_ready(http, bound, served_names[0], time.monotonic() - state.started, frontends)
        elif state.phase == "warming_up" and not failed and replica is not None:
            # one of several API servers: ready when its launcher says all are (the launcher prints it)
            if not await _unless_stopped(replica.ready(), server, serving):
                return await _finish(serving, 0)
            state.phase = "ready"
            serving = replica.serving_now(server, sock, serving)
        watcher = asyncio.create_task(_watch_engine(state, server))
        await serving
        watcher.cancel()
        for task in tasks:
            if not task.cancelling():  # once: a second cancel would cut a drain the signal started
                task.cancel()
        # the engine goes only once the front-ends have stopped: those with a server of their own drain
        # their requests in flight (the abort timer ends any still running at --shutdown-timeout)
        if tasks:
            await asyncio.wait(tasks, timeout=http.shutdown_timeout + SHUTDOWN_GRACE_S)
        return 1 if state.phase == "dead" else 0
    except LLMPError as exc:
        state.phase, state.error = "dead", str(exc)
        _error(exc)
        server.should_exit = True
        return await _finish(serving, 1)
    finally:
        if loaded is not None:
            await asyncio.to_thread(loaded.shutdown)
        await asyncio.to_thread(close_request_observers, observers)


def _redact_access_log() -> None:
    """No secret query parameter (``?api_key=...``) in uvicorn's access log (configured by its Config)."""
    from llmp.server.request_log import AccessLogRedaction

    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, AccessLogRedaction) for f in access.filters):
        access.addFilter(AccessLogRedaction())


def _stopping(server: Any, serving: asyncio.Task) -> bool:
    """A signal came (or the HTTP server stopped): start-up must go no further."""
    return server.should_exit or serving.done()


async def _unless_stopped(work: Any, server: Any, serving: asyncio.Task) -> bool:
    """Run ``work`` (a coroutine) unless the server stops first (a signal): then cancel it, False."""
    task = asyncio.ensure_future(work)
    while not task.done() and not _stopping(server, serving):
        await asyncio.wait({task, serving}, timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
        await asyncio.wait({task})
        return False
    task.result()  # its error, if any
    return not _stopping(server, serving)


async def _finish(serving: asyncio.Task, status: int) -> int:
    try:
        await serving
    except (Exception, SystemExit):
        status = status or 1
    return status


async def _load_engine(
    settings: ServeSettings, starting: concurrent.futures.Future, server: Any, serving: asyncio.Task
) -> Any:
    """Wait for the engine while the HTTP server answers probes. The engine process reports its own
    phases and bars on this terminal (see llmp.progress): no spinner here to garble them."""
    loading = asyncio.wrap_future(starting)
    while not loading.done():
        await asyncio.wait({loading, serving}, timeout=0.2, return_when=asyncio.FIRST_COMPLETED)
        if serving.done() or server.should_exit:
            break
    if _stopping(server, serving):  # the server stopped first (Ctrl-C): the engine must not outlive it
        try:
            engine = await loading
        except Exception:
            return None
        await asyncio.to_thread(engine.shutdown)
        return None
    try:
        engine = loading.result()
    except (LLMPError, ValueError, TypeError, OSError) as exc:
        raise LLMPError(f"cannot start the engine: {exc}") from None
    return engine


async def _warm_up(engine: Any) -> None:
    """One tiny request through the whole path, so the first client does not pay for first-call
    allocations, and readiness means a request has actually succeeded."""
    from llmp import Prompt, SamplingParams

    prompt = Prompt(token_ids=[0])
    try:
        if engine.info.get("task", "generate") != "generate":  # a pooling model: its primary pooling task
            async for _ in engine.encode(prompt, request_id=WARM_UP_REQUEST_ID):
                pass
        else:
            params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
            async for _ in engine.generate(prompt, params, request_id=WARM_UP_REQUEST_ID):
                pass
    except Exception as exc:
        raise LLMPError(f"the warm-up request failed: {type(exc).__name__}: {exc}") from None


def gate_limits(settings: ServeSettings) -> Limits:
    """What the gate refuses, from the serve settings."""
    http = settings.server
    in_flight = None if http.max_queue_len is None else settings.engine.max_num_seqs + http.max_queue_len
    hosts = [h.lower() for h in http.allowed_hosts] or (sorted(LOOPBACK_HOSTS) if _is_loopback(http.host) else None)
    return Limits(
        max_body_bytes=http.max_request_body_bytes,
        max_in_flight=in_flight,
        overload_status=http.overload_status,
        allowed_hosts=frozenset(hosts) if hosts else None,
    )


def _is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _header_timeout_protocol(timeout: float) -> type:
    """uvicorn's h11 protocol with a deadline on request headers (against slowloris): a connection
    whose request line and headers are not complete ``timeout`` seconds after it opened, or after its
    last response, is closed. uvicorn times idle keep-alive connections, not slow headers."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutProtocol(H11Protocol):
        header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a request's headers are complete
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()  # the next request on this connection gets the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            if timeout > 0 and not self.transport.is_closing():
                self.header_timer = self.loop.call_later(timeout, self._headers_too_slow)

        def _disarm(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def _headers_too_slow(self) -> None:
            self.header_timer = None
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                log.info("closing a connection whose request headers took over %g s", timeout)
                self.transport.close()

    return HeaderTimeoutProtocol


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, with signals handled on the loop. The first SIGTERM or SIGINT drains:
        readiness fails, new requests get 503, requests in flight get ``shutdown_timeout`` seconds
        and are then aborted; the second aborts them at once. Serving then returns (uvicorn would
        re-raise the signal after serving, killing the process before the engine stops)."""

        def __init__(self, config: Any, state: ServerState, shutdown_timeout: float) -> None:
            super().__init__(config)
            self.llmp_state = state
            self.shutdown_timeout = shutdown_timeout
            self.abort_timer: asyncio.TimerHandle | None = None
            self.own_servers: list[asyncio.Task] = []  # front-ends serving on a port of their own (gRPC)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.handle_exit, sig, None)
            try:
                yield
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)

        def handle_exit(self, sig: int, frame: Any) -> None:
            state = self.llmp_state
            if state.phase == "draining":  # the second signal: stop what is in flight now
                self._abort_in_flight()
            elif state.phase in ("ready", "warming_up"):
                state.phase = "draining"  # probes and new requests get 503 at once
                self.abort_timer = asyncio.get_running_loop().call_later(self.shutdown_timeout, self._abort_in_flight)
                asyncio.ensure_future(self._abort_if_paused())
                for task in self.own_servers:  # they refuse new requests and drain theirs (shutdown_timeout)
                    task.cancel()
            super().handle_exit(sig, frame)

        async def _abort_if_paused(self) -> None:
            """A paused engine (``/pause``) finishes nothing it holds: no use waiting for it."""
            engine = self.llmp_state.engine
            try:
                if engine is not None and engine.is_running and await engine.is_paused():
                    log.info("shutting down while generation is paused: the requests it holds are aborted")
                    self._abort_in_flight()
            except Exception as exc:  # the drain goes on as it would have
                log.debug("could not ask the engine whether it is paused: %s", exc)

        def _abort_in_flight(self) -> None:
            if self.abort_timer is not None:
                self.abort_timer.cancel()
            engine = self.llmp_state.engine
            if engine is not None and engine.is_running:
                asyncio.ensure_future(engine.abort_all())

    return Server


def _mount(
    app: Any, state: ServerState, engine: MeteredEngine, frontends: list[tuple[str, type]], options: FrontendOptions
) -> tuple[list[asyncio.Task], list[asyncio.Task]]:
    """Build and mount the front-ends: the tasks of their ``serve()``, and those of the front-ends with a server
    of their own (no HTTP router)."""
    tasks, own_servers = [], []
    built = [(name, _build_frontend(name, cls, engine, options)) for name, cls in frontends]
    state.error_renderers = []  # the built front-ends' own, in place of their classes' (early_error_renderers)
    # "/" belongs to one front-end: the highest root_priority (a web page over a banner), then the first listed
    root_owner = max(built, key=lambda item: getattr(item[1], "root_priority", 0), default=(None, None))[1]
    routers: dict[str, Any] = {}
    for name, frontend in built:
        try:
            routers[name] = frontend.http_router()
        except Exception as exc:
            raise _frontend_failed(name, "building its routes", exc) from exc

    def routed_by_others(name: str) -> set[str]:
        others = [r for other, r in routers.items() if other != name and r is not None]
        return {path for router in others for route in router.routes if (path := getattr(route, "path", None))}

    for name, frontend in built:
        for prefix in getattr(frontend, "error_paths", ()):  # errors on its paths take its protocol's shape
            state.error_renderers.append((prefix, frontend.render_error))
        state.public_paths.extend(getattr(frontend, "public_paths", ()))
        state.any_body_type_paths.extend(getattr(frontend, "any_body_type_paths", ()))
        state.self_admitted_paths.extend(getattr(frontend, "self_admitted_paths", ()))
        state.upload_paths.update(getattr(frontend, "upload_paths", {}))  # multipart uploads (/v1/files)
        admin_paths = frozenset(getattr(frontend, "admin_paths", ()))
        if state.admin_paths:  # --enable-admin-api: a front-end's management routes take the admin key too
            state.admin_paths = state.admin_paths | admin_paths
        router = routers[name]
        if router is not None:
            dropped = admin_paths if not state.admin_paths else frozenset()
            if frontend is not root_owner:
                dropped |= {"/"}
            # a fallback path another front-end routes is that one's (Anthropic's /v1/models beside OpenAI's)
            dropped |= {path for path in getattr(frontend, "fallback_paths", ()) if path in routed_by_others(name)}
            router.routes[:] = [route for route in router.routes if getattr(route, "path", None) not in dropped]
            # tagged with the front-end's name: /docs groups its routes, and the conformance kit finds them
            app.include_router(with_light_json(router), tags=[name])
        tasks.append(asyncio.create_task(frontend.serve(), name=f"frontend-{name}"))
        if router is None:
            own_servers.append(tasks[-1])
    app.openapi_schema = None  # the docs must list the routes mounted just now
    return tasks, own_servers


def early_error_renderers(frontends: list[tuple[str, type]]) -> list[tuple[str, Any]]:
    """The error renderers of front-ends not built yet (the server refuses requests while the model
    loads, before any front-end exists): a class's ``render_error`` where it is a static method."""
    return [
        (prefix, cls.render_error)
        for _, cls in frontends
        if isinstance(inspect.getattr_static(cls, "render_error", None), staticmethod)
        for prefix in getattr(cls, "error_paths", ())
    ]


def _build_frontend(name: str, cls: type, engine: MeteredEngine, options: FrontendOptions) -> Any:
    try:
        return cls(engine, options)
    except Exception as exc:
        raise _frontend_failed(name, "starting", exc) from exc


def _frontend_failed(name: str, during: str, exc: Exception) -> LLMPError:
    """A front-end plugin that raises as the server mounts it: one line naming it and its plugin."""
    from llmp import registry

    try:
        owner = f" (plugin {registry.get_component('frontend', name).plugin})"
    except LLMPError:
        owner = ""
    return LLMPError(f"front-end {name!r}{owner} failed while {during}: {type(exc).__name__}: {exc}")


def _frontend_stopped(task: asyncio.Task, state: ServerState, server: Any) -> None:
    """A front-end whose own server failed (a busy gRPC port) takes the whole server down, status 1."""
    if task.cancelled() or task.exception() is None:
        return
    state.phase, state.error = "dead", f"{task.get_name()} failed: {task.exception()}"
    log.error("%s; shutting the server down", state.error)
    server.should_exit = True


async def _watch_engine(state: ServerState, server: Any) -> None:
    """A dead engine takes the server down with a non-zero status, so a supervisor restarts it."""
    while True:
        await asyncio.sleep(ENGINE_WATCH_S)
        if not state.engine.is_running and state.phase == "ready":
            state.phase, state.error = "dead", str(state.engine.errored or "the engine stopped")
            log.error("the engine died (%s); shutting the server down", state.error)
            server.should_exit = True
            return


def _print_ready(
    http: ServerOptions, bound: Any, model_name: str, seconds: float, frontends: list[tuple[str, type]]
) -> None:
    """The ready line, with the address bound (``bound``: the socket's name, a path for ``--uds``)."""
    scheme = "https" if http.ssl_certfile else "http"
    if http.uds:  # a client names the socket and any host: curl --unix-socket PATH http://localhost/...
        url = f"{scheme}://localhost{http.root_path}"
        where = f"unix:{bound} ({url})"
    else:
        host = http.host if http.host not in ("0.0.0.0", "::") else "127.0.0.1"
        url = where = f"{scheme}://{host}:{bound[1]}{http.root_path}"  # the bound port: --port 0 takes any free one
    names = ", ".join(name for name, _ in frontends)
    if http.api_server_count > 1:
        names += f"; {http.api_server_count} API servers"
    print(
        f"llmp: ready in {seconds:.1f} s: serving {model_name} at {where} ({names}; docs at {url}/docs)",
        file=sys.stderr,
        flush=True,
    )
