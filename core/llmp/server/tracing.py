"""OpenTelemetry traces (``--otlp-traces-endpoint``): one span per engine request, as vLLM exports them.

The span is vLLM's ``llm_request`` (kind SERVER) with its ``gen_ai.*`` attributes, the child of
the W3C ``traceparent`` the HTTP request carried; its children ``llm_request.queue``,
``llm_request.prefill`` and ``llm_request.decode`` are cut from the engine's own timestamps
(``RequestOutput.metrics``). Spans leave through a batch processor's thread, so a slow or
unreachable collector costs requests nothing; a full queue drops spans, never requests.

The packages are the ``llmp[otel]`` extra: ``opentelemetry-sdk`` and the OTLP exporters, gRPC by
default, ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`` for HTTP (as vLLM).
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from llmp.api import LLMPError
from llmp.server.metrics import RequestRecord

log = logging.getLogger("llmp.server")
SPAN_NAME = "llm_request"  # vLLM's
PHASES = (  # child spans: (name, the engine timestamp it starts at, the one it ends at)
    ("llm_request.queue", "arrival_time", "scheduled_time"),
    ("llm_request.prefill", "scheduled_time", "first_token_time"),
    ("llm_request.decode", "first_token_time", "last_token_time"),
)
PROTOCOLS = ("grpc", "http/protobuf")
SHUTDOWN_FLUSH_S = 3.0  # at shutdown, what is queued gets this long to reach the collector
OTEL_MISSING = (
    "--otlp-traces-endpoint needs the OpenTelemetry packages (opentelemetry-sdk and "
    "opentelemetry-exporter-otlp): pip install 'llmp[otel]'"
)


class SpanAttributes:
    """vLLM's attribute names (``vllm.tracing.SpanAttributes``), from OpenTelemetry's gen-ai conventions."""

    GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
    GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
    GEN_AI_USAGE_NUM_SEQUENCES = "gen_ai.usage.num_sequences"
    GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
    GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
    GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
    GEN_AI_REQUEST_ID = "gen_ai.request.id"
    GEN_AI_REQUEST_N = "gen_ai.request.n"
    GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
    GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
    GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
    GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
    GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"
    GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"
    GEN_AI_LATENCY_TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode"
    GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE = "gen_ai.latency.time_in_model_inference"


def traces_protocol(environ: Mapping[str, str]) -> str:
    """The OTLP protocol: ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, else ``OTEL_EXPORTER_OTLP_PROTOCOL``, else gRPC."""
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    if protocol not in PROTOCOLS:
        raise LLMPError(
            f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL={protocol!r} is not supported: use {' or '.join(PROTOCOLS)}"
        )
    return protocol


def check_tracing(endpoint: str | None, environ: Mapping[str, str] = os.environ) -> None:
    """What stops ``--otlp-traces-endpoint`` before anything starts: the packages, the protocol, the URL."""
    if endpoint is None:
        return
    protocol = traces_protocol(environ)
    exporter = f"opentelemetry.exporter.otlp.proto.{'grpc' if protocol == 'grpc' else 'http'}.trace_exporter"
    for module in ("opentelemetry.sdk.trace", exporter):  # found, not imported: start-up stays quick
        if not _installed(module):
            raise LLMPError(f"{OTEL_MISSING} (no module {module})")
    if protocol == "http/protobuf" and urlsplit(endpoint).scheme not in ("http", "https"):
        raise LLMPError(f"--otlp-traces-endpoint {endpoint!r}: OTLP over HTTP needs an http:// or https:// URL")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


def http_traces_url(endpoint: str) -> str:
    """OTLP/HTTP's traces URL: the endpoint as given, or with ``/v1/traces`` when it has no path."""
    parts = urlsplit(endpoint)
    return endpoint if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/v1/traces"


class RequestTracer:
    """The request observer of ``--otlp-traces-endpoint`` (see ``llmp.server.metrics.RequestObserver``)."""

    def __init__(self, endpoint: str, model_name: str, environ: Mapping[str, str] = os.environ) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from llmp import __version__

        check_tracing(endpoint, environ)
        if traces_protocol(environ) == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=endpoint)
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=http_traces_url(endpoint))
        # OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) wins over llmp's default name
        named = OTELResourceDetector().detect().attributes.get("service.name")
        resource = Resource.create({"service.version": __version__, **({} if named else {"service.name": "llmp"})})
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        # its thread exports; OTEL_BSP_* variables tune it (OTEL_BSP_SCHEDULE_DELAY: 5 s between exports)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("llmp.server", __version__)
        self.propagator = TraceContextTextMapPropagator()
        self.trace = trace
        self.model_name, self.endpoint = model_name, endpoint
        self.closed = False
        atexit.register(self.close)  # a server that exits without close() still flushes
        log.info("tracing: a span per request to %s (OTLP %s)", endpoint, traces_protocol(environ))

    def on_start(self, record: RequestRecord) -> None:
        """Nothing: the span is built when the request ends, from its timestamps (as vLLM does)."""

    def on_end(self, record: RequestRecord) -> None:
        trace = self.trace
        headers = (record.http or {}).get("headers") or {}
        parent = self.propagator.extract(carrier=headers) if "traceparent" in headers else None
        end = record.end_time or time.time()
        span = self.tracer.start_span(
            SPAN_NAME,
            context=parent,
            kind=trace.SpanKind.SERVER,
            start_time=_ns(record.start_time),
            attributes=self._attributes(record),
        )
        times = _engine_times(record.output)
        inside = trace.set_span_in_context(span)
        for name, begins, ends in PHASES:
            begin, finish = times.get(begins), times.get(ends)
            if begin is not None and finish is not None and finish >= begin:
                self.tracer.start_span(name, context=inside, start_time=_ns(begin)).end(end_time=_ns(finish))
        if record.error is not None:
            span.set_status(
                trace.Status(trace.StatusCode.ERROR, f"{type(record.error).__name__}: {record.error}"[:500])
            )
            span.set_attribute("error.type", type(record.error).__name__)
        span.end(end_time=_ns(max(end, record.start_time)))

    def _attributes(self, record: RequestRecord) -> dict[str, Any]:
        a = SpanAttributes
        output = record.output
        lora = getattr(record.lora, "lora_name", None)
        attributes: dict[str, Any] = {
            a.GEN_AI_REQUEST_ID: record.request_id,
            a.GEN_AI_RESPONSE_MODEL: lora or self.model_name,
            a.GEN_AI_USAGE_PROMPT_TOKENS: len(getattr(output, "prompt_token_ids", None) or ()),
            a.GEN_AI_USAGE_COMPLETION_TOKENS: record.generated_tokens,
        }
        if record.end_time is not None:
            attributes[a.GEN_AI_LATENCY_E2E] = record.end_time - record.start_time
        if record.first_token_time is not None:
            attributes[a.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN] = record.first_token_time - record.start_time
        if record.finish_reason is not None:
            attributes[a.GEN_AI_RESPONSE_FINISH_REASONS] = (record.finish_reason,)
        params = record.params
        if record.kind == "generate" and params is not None:
            for name, field in (
                (a.GEN_AI_REQUEST_TEMPERATURE, "temperature"),
                (a.GEN_AI_REQUEST_TOP_P, "top_p"),
                (a.GEN_AI_REQUEST_MAX_TOKENS, "max_tokens"),
                (a.GEN_AI_REQUEST_N, "n"),
            ):
                value = getattr(params, field, None)
                if value is not None:
                    attributes[name] = value
            if output is not None:
                attributes[a.GEN_AI_USAGE_NUM_SEQUENCES] = len(getattr(output, "outputs", None) or ())
        times = _engine_times(output)
        for name, begins, ends in (
            (a.GEN_AI_LATENCY_TIME_IN_QUEUE, "arrival_time", "scheduled_time"),
            (a.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL, "scheduled_time", "first_token_time"),
            (a.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE, "first_token_time", "last_token_time"),
            (a.GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE, "scheduled_time", "last_token_time"),
        ):
            if begins in times and ends in times:
                attributes[name] = times[ends] - times[begins]
        http = record.http or {}
        if http.get("method"):  # OpenTelemetry's HTTP names: where the request came in
            attributes["http.request.method"] = http["method"]
            attributes["url.path"] = http.get("path", "")
        return attributes

    def close(self) -> None:
        """Flush the queued spans (bounded: an unreachable collector does not hold the shutdown up)."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        # the SDK's shutdown waits out the exporter's retries (10 s and more): bounded here, in a daemon thread
        flushing = threading.Thread(target=self.provider.shutdown, name="llmp-trace-flush", daemon=True)
        flushing.start()
        flushing.join(SHUTDOWN_FLUSH_S)
        if flushing.is_alive():
            log.warning(
                "tracing: spans still unsent %g s into the shutdown (is the collector at %s up?): dropped",
                SHUTDOWN_FLUSH_S,
                self.endpoint,
            )


def _engine_times(output: Any) -> dict[str, float]:
    """The engine's timestamps of a request (``RequestOutput.metrics``), the numeric ones only."""
    metrics = getattr(output, "metrics", None)
    if not isinstance(metrics, Mapping):
        return {}
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
