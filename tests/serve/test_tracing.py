"""``--otlp-traces-endpoint``: a real ``llmp serve`` exports one ``llm_request`` span per request, with
vLLM's attribute names and the queue, prefill and decode phases as children, to an OTLP collector
running in this test (gRPC, as vLLM's default); the HTTP exporter against an in-process receiver;
the start-up error without the packages."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import httpx
import openai
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from llmp.api import LLMPError
from llmp.outputs import CompletionOutput, RequestOutput
from llmp.server.metrics import RequestRecord
from llmp.testing import save_tiny_llama, serving

pytestmark = pytest.mark.slow

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
PHASES = ["llm_request.queue", "llm_request.prefill", "llm_request.decode"]


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace collector: keeps every span it is sent, with its resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Any]] = []
        self.lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (the gRPC method's name)
        with self.lock:
            for resource_spans in request.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend((resource, span) for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


def attributes(pairs: Any) -> dict[str, Any]:
    def value(v: Any) -> Any:
        kind = v.WhichOneof("value")
        if kind == "array_value":
            return [value(item) for item in v.array_value.values]
        return getattr(v, kind)

    return {kv.key: value(kv.value) for kv in pairs}


@pytest.fixture(scope="module")
def collector() -> Iterator[tuple[Collector, int]]:
    found = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(found, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield found, port
    server.stop(grace=None)


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, collector: tuple[Collector, int]) -> dict[str, Any]:
    """Two requests through a traced server, then its shutdown: the spans are exported only then
    (a minute between batches), so every span that arrives proves the flush at shutdown."""
    found, port = collector
    model_dir = tmp_path_factory.mktemp("tiny-llama-tracing")
    save_tiny_llama(model_dir, vocab_size=400)
    env = {"OTEL_BSP_SCHEDULE_DELAY": "60000", "OTEL_SERVICE_NAME": "llmp-under-test"}
    with serving(
        model_dir, "--dtype", "float32", "--otlp-traces-endpoint", f"http://127.0.0.1:{port}", env=env
    ) as server:
        client = openai.OpenAI(base_url=server.api_url, api_key="unused")
        chat = client.chat.completions.create(
            model=str(model_dir),
            messages=[{"role": "user", "content": "hello there, how are you"}],
            max_tokens=5,
            temperature=0.5,
            extra_body={"ignore_eos": True},
            extra_headers={"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"},
        )
        with httpx.stream(
            "POST",
            f"{server.api_url}/completions",
            json={"prompt": "one two three", "max_tokens": 3, "ignore_eos": True, "stream": True},
            timeout=60,
        ) as response:
            assert response.status_code == 200
            streamed = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert streamed[-1] == "data: [DONE]"
        time.sleep(0.5)
        assert not found.spans  # nothing before the batch delay: what follows came with the shutdown
        started = time.monotonic()
        assert server.stop() == 0
        stop_seconds = time.monotonic() - started
    return {"chat": chat, "spans": list(found.spans), "stop_seconds": stop_seconds, "log": server.log()}


def _requests(traced: dict[str, Any]) -> list[tuple[dict[str, Any], Any]]:
    return [(resource, span) for resource, span in traced["spans"] if span.name == "llm_request"]


def test_each_request_is_one_llm_request_span_flushed_at_shutdown(traced):
    requests = _requests(traced)
    assert len(requests) == 2, [span.name for _, span in traced["spans"]]
    assert len(traced["spans"]) == 2 + 2 * len(PHASES)
    assert traced["stop_seconds"] < 15, traced["log"]
    for resource, span in requests:
        assert resource["service.name"] == "llmp-under-test"  # OTEL_SERVICE_NAME
        assert span.kind == span.SPAN_KIND_SERVER
        assert span.end_time_unix_nano > span.start_time_unix_nano


def test_the_span_carries_vllm_attributes_equal_to_the_usage(traced):
    chat = traced["chat"]
    [span] = [
        span for _, span in _requests(traced) if attributes(span.attributes)["url.path"].endswith("/chat/completions")
    ]
    found = attributes(span.attributes)
    assert found["gen_ai.usage.prompt_tokens"] == chat.usage.prompt_tokens
    assert found["gen_ai.usage.completion_tokens"] == chat.usage.completion_tokens == 5
    assert found["gen_ai.request.max_tokens"] == 5
    assert found["gen_ai.request.temperature"] == 0.5
    assert found["gen_ai.request.n"] == 1
    assert found["gen_ai.request.id"].startswith("chatcmpl-")
    assert found["gen_ai.response.model"] == chat.model
    assert found["gen_ai.response.finish_reasons"] == ["length"]
    assert found["http.request.method"] == "POST"
    e2e = found["gen_ai.latency.e2e"]
    for name in ("time_to_first_token", "time_in_queue", "time_in_model_prefill", "time_in_model_decode"):
        assert 0 <= found[f"gen_ai.latency.{name}"] <= e2e, (name, found)
    inference = found["gen_ai.latency.time_in_model_inference"]
    assert inference == pytest.approx(
        found["gen_ai.latency.time_in_model_prefill"] + found["gen_ai.latency.time_in_model_decode"]
    )
    assert e2e == pytest.approx((span.end_time_unix_nano - span.start_time_unix_nano) / 1e9, abs=1e-3)


def test_the_client_traceparent_is_the_parent_and_a_request_without_one_starts_a_trace(traced):
    by_path = {attributes(span.attributes)["url.path"]: span for _, span in _requests(traced)}
    chat, completion = by_path["/v1/chat/completions"], by_path["/v1/completions"]
    assert chat.trace_id.hex() == TRACE_ID
    assert chat.parent_span_id.hex() == PARENT_SPAN_ID
    assert completion.trace_id.hex() != TRACE_ID
    assert not completion.parent_span_id  # a root span


def test_queue_prefill_and_decode_are_children_in_order_within_the_request(traced):
    spans = [span for _, span in traced["spans"]]
    for _, request in _requests(traced):
        children = sorted(
            (s for s in spans if s.parent_span_id == request.span_id and s.trace_id == request.trace_id),
            key=lambda s: s.start_time_unix_nano,
        )
        assert [child.name for child in children] == PHASES
        for before, after in zip(children, children[1:]):
            assert before.end_time_unix_nano == after.start_time_unix_nano  # scheduled, then first token
        assert children[0].start_time_unix_nano >= request.start_time_unix_nano
        assert children[-1].end_time_unix_nano <= request.end_time_unix_nano
        found = attributes(request.attributes)
        assert (children[0].end_time_unix_nano - children[0].start_time_unix_nano) / 1e9 == pytest.approx(
            found["gen_ai.latency.time_in_queue"], abs=1e-6
        )


# -- OTLP over HTTP, and the start-up checks -----------------------------------


class _Receiver(BaseHTTPRequestHandler):
    received: list[tuple[str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

    def log_message(self, *args: Any) -> None:
        pass


def test_otlp_over_http_posts_the_spans_to_v1_traces():
    from llmp.server.tracing import RequestTracer

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        tracer = RequestTracer(
            f"http://127.0.0.1:{receiver.server_address[1]}",
            "tiny",
            environ={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
        )
        now = time.time()
        output = RequestOutput(
            "cmpl-1",
            "hi",
            [1, 2, 3],
            [CompletionOutput(0, "ab", [4, 5], finish_reason="length")],
            finished=True,
            metrics={
                "arrival_time": now,
                "scheduled_time": now + 0.1,
                "first_token_time": now + 0.2,
                "last_token_time": now + 0.3,
                "finished_time": now + 0.3,
            },
        )
        record = RequestRecord("cmpl-1", "generate", "hi", None, None, start_time=now - 0.01, end_time=now + 0.31)
        record.output, record.generated_tokens, record.finish_reason = output, 2, "length"
        tracer.on_end(record)
        tracer.close()
    finally:
        receiver.shutdown()
    [(path, body)] = _Receiver.received
    assert path == "/v1/traces"
    request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
    spans = [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
    assert sorted(span.name for span in spans) == sorted(["llm_request", *PHASES])
    [span] = [span for span in spans if span.name == "llm_request"]
    found = attributes(span.attributes)
    assert found["gen_ai.usage.prompt_tokens"] == 3 and found["gen_ai.usage.completion_tokens"] == 2
    assert found["gen_ai.latency.time_in_queue"] == pytest.approx(0.1)
    assert found["gen_ai.response.model"] == "tiny"


def test_a_bad_protocol_or_a_non_http_url_is_refused():
    from llmp.server.tracing import check_tracing

    with pytest.raises(LLMPError, match="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='thrift' is not supported"):
        check_tracing("http://127.0.0.1:4317", {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"})
    with pytest.raises(LLMPError, match="needs an http:// or https:// URL"):
        check_tracing("127.0.0.1:4318", {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})
    check_tracing("127.0.0.1:4317", {})  # gRPC takes host:port


def test_without_the_packages_serve_stops_at_once_naming_them(tmp_path: Path):
    script = (
        "import sys\n"
        "class NoOpenTelemetry:\n"  # as if llmp[otel] were not (opentelemetry-api comes with fastapi)
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[:2] in (['opentelemetry', 'sdk'], ['opentelemetry', 'exporter']):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NoOpenTelemetry())\n"
        "from llmp.cli import main\n"
        f"sys.argv = ['llmp', 'serve', {str(tmp_path / 'no-model')!r}, '--otlp-traces-endpoint', 'http://127.0.0.1:1']\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("llmp: error:")]
    assert len(errors) == 1, done.stderr
    assert "--otlp-traces-endpoint needs the OpenTelemetry packages" in errors[0]
    assert "pip install 'llmp[otel]'" in errors[0]
