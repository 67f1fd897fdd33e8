"""The request observers ``llmp serve`` runs, from its options: request logs and traces."""

from __future__ import annotations

import logging
from typing import Any

from llmp.options import ServerOptions
from llmp.server.metrics import RequestObserver

log = logging.getLogger("llmp.server")


def check_request_observers(options: ServerOptions) -> None:
    """Before anything starts: a missing OpenTelemetry package is one start-up error, not a late one."""
    from llmp.server.tracing import check_tracing

    check_tracing(options.otlp_traces_endpoint)


def request_observers(app: Any, options: ServerOptions, model_name: str) -> tuple[RequestObserver, ...]:
    """The observers ``MeteredEngine`` tells of each request; with ``--enable-log-requests`` the app
    also logs the requests refused before the engine (call before the app serves)."""
    observers: list[RequestObserver] = []
    if options.enable_log_requests:
        from llmp.server.request_log import RefusalLogMiddleware, RequestLogger

        app.add_middleware(RefusalLogMiddleware)  # outermost: it sees every answer and its X-Request-Id
        observers.append(RequestLogger(options.max_log_len))
        if not logging.getLogger("llmp.requests").isEnabledFor(logging.INFO):
            log.warning(
                "--enable-log-requests logs at level info, below --log-level %s: no request lines", options.log_level
            )
    elif options.max_log_len is not None:
        log.warning("--max-log-len has no effect without --enable-log-requests")
    if options.otlp_traces_endpoint is not None:
        from llmp.server.tracing import RequestTracer

        observers.append(RequestTracer(options.otlp_traces_endpoint, model_name))
    return tuple(observers)


def close_request_observers(observers: tuple[RequestObserver, ...]) -> None:
    """At shutdown: what they hold (queued spans) goes out. Blocks a few seconds at most."""
    for observer in observers:
        close = getattr(observer, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # shutting down regardless
                log.exception("closing the request observer %s failed", type(observer).__name__)
