"""Prometheus metrics of the server (``llmp_`` names), recorded around the engine client.

Request timings (time to first token, inter-token latency, end-to-end) are
measured where the client sees them, by :class:`MeteredEngine`; queue and
cache figures come from the engine itself when ``/metrics`` is scraped.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger("llmp.server")
STATS_TIMEOUT_S = 2.0
# what the HTTP request being handled carried (set by the server's middleware): request records read it
current_http: ContextVar[Mapping[str, Any] | None] = ContextVar("llmp_current_http", default=None)
LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


class EngineStatsCollector:
    """Exposes the engine's own figures, fetched just before each scrape."""

    def __init__(self, model_name: str) -> None:
        self.labels = {"model_name": model_name}
        self.stats: dict[str, Any] = {}

    def collect(self) -> Iterator[Any]:
        s = self.stats
        for name, doc, key in (
            ("llmp_num_requests_running", "Requests in the running batch.", "num_running"),
            ("llmp_num_requests_waiting", "Requests waiting to be scheduled.", "num_waiting"),
            ("llmp_kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).", "kv_cache_usage"),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=list(self.labels))
            gauge.add_metric(list(self.labels.values()), float(s.get(key, 0)))
            yield gauge
        for name, doc, key in (
            ("llmp_prefix_cache_queries", "Blocks looked up in the prefix cache.", "prefix_cache_queries"),
            ("llmp_prefix_cache_hits", "Blocks found in the prefix cache.", "prefix_cache_hits"),
            ("llmp_num_preemptions", "Requests preempted to free KV-cache blocks.", "num_preemptions"),
        ):
            counter = CounterMetricFamily(name, doc, labels=list(self.labels))
            counter.add_metric(list(self.labels.values()), float(s.get(key, 0)))
            yield counter
        if "lora" in s:  # an engine serving LoRA adapters (--enable-lora)
            yield from self._lora(s["lora"])

    def _lora(self, lora: dict[str, Any]) -> Iterator[Any]:
        """Requests per adapter (vLLM's ``lora_requests_info``, and one gauge per adapter), and the
        adapters read from disk, copied into slots and evicted since start-up."""
        model = self.labels["model_name"]
        running, waiting = lora.get("running", {}), lora.get("waiting", {})
        info = GaugeMetricFamily(
            "llmp_lora_requests_info",
            "LoRA adapters of the running and waiting requests (comma-separated names); the value is the scrape time.",
            labels=["model_name", "max_lora", "running_lora_adapters", "waiting_lora_adapters"],
        )
        names = (",".join(sorted(running)), ",".join(sorted(waiting)))
        info.add_metric([model, str(lora.get("max_loras", 0)), *names], time.time())
        yield info
        adapters = sorted({*lora.get("loaded", ()), *running, *waiting})
        for name, doc, counts in (
            ("llmp_lora_num_requests_running", "Running requests per LoRA adapter.", running),
            ("llmp_lora_num_requests_waiting", "Waiting requests per LoRA adapter.", waiting),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["model_name", "lora_name"])
            for adapter in adapters:
                gauge.add_metric([model, adapter], float(counts.get(adapter, 0)))
            yield gauge
        for name, doc, key in (
            ("llmp_lora_adapter_loads", "LoRA adapters read from disk into the CPU cache.", "disk_loads"),
            ("llmp_lora_slot_loads", "LoRA adapters copied into an adapter slot (--max-loras).", "slot_loads"),
        ):
            counter = CounterMetricFamily(name, doc, labels=["model_name"])
            counter.add_metric([model], float(lora.get(key, 0)))
            yield counter
        evictions = CounterMetricFamily(
            "llmp_lora_evictions",
            "LoRA adapters evicted from the CPU cache (--max-cpu-loras) or from a slot (--max-loras).",
            labels=["model_name", "cache"],
        )
        evictions.add_metric([model, "cpu"], float(lora.get("cpu_evictions", 0)))
        evictions.add_metric([model, "slot"], float(lora.get("slot_evictions", 0)))
        yield evictions


@dataclass(slots=True)
class RequestRecord:
    """One engine request as the server saw it, handed to every :class:`RequestObserver`.

    ``kind`` is ``"generate"`` or ``"encode"``; ``params`` its ``SamplingParams`` or
    ``PoolingParams``; ``http`` what the HTTP request that made it carried (method, path, headers
    such as ``traceparent``), ``None`` outside one. Times are ``time.time()`` seconds. At the
    end, ``output`` is the last output (its ``metrics`` hold the engine's own timings, see
    ``RequestOutput``), ``error`` the exception that ended it, ``generated_tokens`` the count."""

    request_id: str
    kind: str
    prompt: Any
    params: Any
    http: Mapping[str, Any] | None
    lora: Any = None
    start_time: float = 0.0
    first_token_time: float | None = None
    end_time: float | None = None
    output: Any = None
    error: BaseException | None = None
    generated_tokens: int = 0
    finish_reason: str | None = None  # "stop", "length" ..., "abort" when the caller stopped reading


class RequestObserver(Protocol):
    """Told when each engine request starts and ends (request logs, traces). Called on the event
    loop: must not block; an observer's exception is logged and never fails the request."""

    def on_start(self, record: RequestRecord) -> None: ...

    def on_end(self, record: RequestRecord) -> None: ...


class ServerMetrics:
    """The registry behind ``/metrics``."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.label = {"model_name": model_name}
        self.engine = EngineStatsCollector(model_name)
        self.registry.register(self.engine)

        def histogram(name: str, doc: str, buckets: tuple) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry).labels(**self.label)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=self.registry).labels(**self.label)

        self.ttft = histogram("llmp_time_to_first_token_seconds", "Time to the first generated token.", LATENCY_BUCKETS)
        self.itl = histogram("llmp_inter_token_latency_seconds", "Time between generated tokens.", LATENCY_BUCKETS)
        self.e2e = histogram("llmp_e2e_request_latency_seconds", "Request latency, arrival to finish.", LATENCY_BUCKETS)
        self.request_prompt_tokens = histogram(
            "llmp_request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS
        )
        self.request_generation_tokens = histogram(
            "llmp_request_generation_tokens", "Generated tokens per request.", TOKEN_BUCKETS
        )
        self.prompt_tokens = counter("llmp_prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("llmp_generation_tokens", "Generated tokens.")
        self.success = Counter(
            "llmp_request_success",
            "Finished requests by finish reason.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self.failures = Counter(
            "llmp_request_failure", "Requests that ended in an error.", labels, registry=self.registry
        ).labels(**self.label)
        self.rejected = Counter(
            "llmp_requests_rejected",
            "Requests refused before reaching the engine, by reason.",
            ["model_name", "reason"],
            registry=self.registry,
        )
        self.timeouts = counter("llmp_request_timeout", "Requests aborted by --request-timeout.")

    async def render(self, engine: Any) -> bytes:
        try:
            # bounded like the readiness probe: a scrape must answer even while the engine hangs
            self.engine.stats = await engine.stats(timeout=STATS_TIMEOUT_S) if engine is not None else {}
        except Exception:  # a dead engine still gets its request counters scraped
            self.engine.stats = {}
        return generate_latest(self.registry)


async def _before_deadline(outputs: AsyncIterator[Any], timeout: float | None, on_timeout: Any) -> AsyncIterator[Any]:
    """``outputs`` until ``timeout`` seconds have passed; then the request is aborted (closing the
    engine's stream frees its KV blocks) and ``RequestTimeoutError`` raised."""
    if timeout is None:
        async for output in outputs:
            yield output
        return
    from llmp.frontend.errors import RequestTimeoutError

    deadline = time.monotonic() + timeout
    iterator = outputs.__aiter__()
    try:
        while True:
            try:
                output = await asyncio.wait_for(iterator.__anext__(), max(deadline - time.monotonic(), 0))
            except StopAsyncIteration:
                return
            except TimeoutError:
                on_timeout()
                raise RequestTimeoutError(timeout) from None
            yield output
    finally:
        await iterator.aclose()


class MeteredEngine:
    """The engine client front-ends get: ``AsyncLLM`` with every request measured, bounded in
    time (``request_timeout``) and in number: beyond ``capacity`` engine requests in flight
    (one HTTP request may make many: a list of prompts, a background response), a new one is
    refused with ``overload_status`` before it reaches the engine."""

    def __init__(
        self,
        engine: Any,
        metrics: ServerMetrics,
        *,
        request_timeout: float | None,
        capacity: int | None,
        overload_status: int,
        observers: tuple[RequestObserver, ...] = (),
    ) -> None:
        self._engine = engine
        self.observers = observers
        self.metrics = metrics
        self.request_timeout = request_timeout
        self.capacity, self.overload_status = capacity, overload_status
        self.in_flight = 0

    def check_capacity(self, count: int, param: str | None = None) -> None:
        """Refuse, before any of them starts, a request that needs ``count`` engine requests
        (a list of prompts): 400 if it can never fit, the overload status if it cannot fit now."""
        from llmp.frontend.errors import APIError

        if self.capacity is None:
            return
        if count > self.capacity:
            raise APIError(
                400,
                f"{count} prompts in one request exceed the {self.capacity} requests the server "
                "takes at once (--max-num-seqs plus --max-queue-len); send fewer",
                param=param,
            )
        if self.in_flight + count > self.capacity:
            self.metrics.rejected.labels(reason="overloaded", **self.metrics.label).inc()
            raise APIError(
                self.overload_status,
                f"the server is at capacity ({self.capacity} engine requests in "
                "flight: --max-num-seqs plus --max-queue-len); retry after a moment",
                code="overloaded",
                headers={"Retry-After": "1"},
            )

    def _admit(self) -> None:
        self.check_capacity(1)
        self.in_flight += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(
        self, prompt: Any, params: Any = None, request_id: str | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        request_id = request_id or uuid.uuid4().hex
        # the engine checks the request now (a refusal is a 400 before any stream starts); it runs when iterated
        outputs = self._engine.generate(prompt, params, request_id, **kwargs)
        record = RequestRecord(request_id, "generate", prompt, params, current_http.get(), kwargs.get("lora_request"))
        return self._metered_generate(outputs, kwargs.get("delta", False), record)

    def _tell(self, event: str, record: RequestRecord) -> None:
        for observer in self.observers:
            try:
                getattr(observer, event)(record)
            except Exception:  # a log or a trace must never fail the request
                log.exception("request observer %s failed in %s", type(observer).__name__, event)

    async def _metered_generate(
        self, outputs: AsyncIterator[Any], delta: bool, record: RequestRecord
    ) -> AsyncIterator[Any]:
        m = self.metrics
        self._admit()
        record.start_time = time.time()
        self._tell("on_start", record)
        arrival = last = time.perf_counter()
        seen: dict[int, int] = {}  # tokens so far per sequence index
        output = None
        failed = False
        try:
            async for output in _before_deadline(outputs, self.request_timeout, m.timeouts.inc):
                new = 0
                for seq in output.outputs:
                    count = len(seq.token_ids) + (seen.get(seq.index, 0) if delta else 0)
                    new += count - seen.get(seq.index, 0)
                    seen[seq.index] = count
                if new:
                    now = time.perf_counter()
                    if last == arrival:
                        record.first_token_time = time.time()
                        m.ttft.observe(now - arrival)
                    else:
                        m.itl.observe(now - last)
                    last = now
                yield output
        except Exception as exc:
            m.failures.inc()
            failed = True
            record.error = exc
            raise
        finally:
            self.in_flight -= 1
            generated = sum(seen.values())
            record.end_time, record.output, record.generated_tokens = time.time(), output, generated
            m.generation_tokens.inc(generated)
            if output is not None and output.finished:
                prompt_len = len(output.prompt_token_ids)
                m.prompt_tokens.inc(prompt_len)
                m.request_prompt_tokens.observe(prompt_len)
                m.request_generation_tokens.observe(generated)
                m.e2e.observe(time.perf_counter() - arrival)
                reason = output.outputs[0].finish_reason if output.outputs else None
                record.finish_reason = reason or "abort"
                m.success.labels(finished_reason=record.finish_reason, **m.label).inc()
            elif not failed:  # the caller stopped reading (perhaps before any output): the engine aborts it
                record.finish_reason = "abort"
                m.success.labels(finished_reason="abort", **m.label).inc()
            self._tell("on_end", record)

    def encode(
        self, prompt: Any, pooling_params: Any = None, request_id: str | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        request_id = request_id or uuid.uuid4().hex
        outputs = self._engine.encode(prompt, pooling_params, request_id, **kwargs)  # checked now, as generate
        record = RequestRecord(
            request_id, "encode", prompt, pooling_params, current_http.get(), kwargs.get("lora_request")
        )
        return self._metered_encode(outputs, record)

    async def _metered_encode(self, outputs: AsyncIterator[Any], record: RequestRecord) -> AsyncIterator[Any]:
        m = self.metrics
        self._admit()
        arrival = time.perf_counter()
        record.start_time = time.time()
        self._tell("on_start", record)
        try:
            async for output in _before_deadline(outputs, self.request_timeout, m.timeouts.inc):
                record.output, record.finish_reason = output, "stop"
                m.prompt_tokens.inc(len(output.prompt_token_ids))
                m.request_prompt_tokens.observe(len(output.prompt_token_ids))
                m.e2e.observe(time.perf_counter() - arrival)
                m.success.labels(finished_reason="stop", **m.label).inc()
                yield output
        except Exception as exc:
            m.failures.inc()
            record.error = exc
            raise
        finally:
            self.in_flight -= 1
            record.end_time = time.time()
            if record.output is None and record.error is None:
                record.finish_reason = "abort"
            self._tell("on_end", record)
