"""Prometheus metrics of the server (``llmp_`` names), recorded around the engine client.

Time to first token, inter-token latency and end-to-end latency are measured where the client
sees them, by :class:`MeteredEngine`; queue, prefill and decode times come from the engine's own
timings on each finished output (``RequestOutput.metrics``); queue, cache and per-step figures
from the engine itself when ``/metrics`` is scraped. ``--metrics-names vllm`` also exposes every
metric of :data:`VLLM_NAMES` under vLLM's names, so its dashboards work unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from llmp.engine.step_stats import ITERATION_TOKEN_BUCKETS
from llmp.frontend.http import current_http

log = logging.getLogger("llmp.server")
STATS_TIMEOUT_S = 2.0
# vLLM's buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
# vLLM's 1-2-5 ladder up to the context length; fixed here (the registry exists before the model is loaded)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
N_BUCKETS = (1, 2, 5, 10, 20)
# label values made at 0 from the start (as vLLM does), so a rate() over them reads 0, not "no data"
FINISHED_REASONS = ("stop", "length", "abort")
REJECTED_REASONS = ("overloaded",)

# Each metric once, by its family name (a counter's without ``_total``), with its names in vLLM's
# ``vllm:`` namespace (``--metrics-names vllm``). Metrics vLLM has no name for are not listed.
VLLM_NAMES: dict[str, tuple[str, ...]] = {
    "llmp_num_requests_running": ("vllm:num_requests_running",),
    "llmp_num_requests_waiting": ("vllm:num_requests_waiting",),
    # gpu_cache_usage_perc: vLLM's name before 0.10, still read by its Grafana dashboard
    "llmp_kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "llmp_prefix_cache_queries": ("vllm:prefix_cache_queries",),
    "llmp_prefix_cache_hits": ("vllm:prefix_cache_hits",),
    "llmp_num_preemptions": ("vllm:num_preemptions",),
    "llmp_prompt_tokens": ("vllm:prompt_tokens",),
    "llmp_generation_tokens": ("vllm:generation_tokens",),
    "llmp_request_success": ("vllm:request_success",),
    "llmp_time_to_first_token_seconds": ("vllm:time_to_first_token_seconds",),
    # time_per_output_token_seconds: the same gaps under vLLM's name before 0.11 (its dashboard reads it)
    "llmp_inter_token_latency_seconds": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "llmp_request_time_per_output_token_seconds": ("vllm:request_time_per_output_token_seconds",),
    "llmp_e2e_request_latency_seconds": ("vllm:e2e_request_latency_seconds",),
    "llmp_request_queue_time_seconds": ("vllm:request_queue_time_seconds",),
    "llmp_request_inference_time_seconds": ("vllm:request_inference_time_seconds",),
    "llmp_request_prefill_time_seconds": ("vllm:request_prefill_time_seconds",),
    "llmp_request_decode_time_seconds": ("vllm:request_decode_time_seconds",),
    "llmp_request_prompt_tokens": ("vllm:request_prompt_tokens",),
    "llmp_request_generation_tokens": ("vllm:request_generation_tokens",),
    "llmp_request_params_n": ("vllm:request_params_n",),
    "llmp_request_params_max_tokens": ("vllm:request_params_max_tokens",),
    "llmp_request_max_num_generation_tokens": ("vllm:request_max_num_generation_tokens",),
    "llmp_iteration_tokens": ("vllm:iteration_tokens_total",),
    "llmp_lora_requests_info": ("vllm:lora_requests_info",),
}


class WithVllmNames:
    """A collector of ``source``'s metrics as they are, each followed by its copies under its
    :data:`VLLM_NAMES` (same samples, labels and values)."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            yield family
            for name in VLLM_NAMES.get(family.name, ()):
                alias = Metric(name, family.documentation, family.type, family.unit)
                alias.samples = [s._replace(name=name + s.name[len(family.name) :]) for s in family.samples]
                yield alias


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
            ("llmp_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", "prefix_cache_queries"),
            ("llmp_prefix_cache_hits", "Prompt tokens found in the prefix cache.", "prefix_cache_hits"),
            ("llmp_num_preemptions", "Requests preempted to free KV-cache blocks.", "num_preemptions"),
        ):
            counter = CounterMetricFamily(name, doc, labels=list(self.labels))
            counter.add_metric(list(self.labels.values()), float(s.get(key, 0)))
            yield counter
        yield self._iteration_tokens(s.get("iteration_tokens"))
        if "lora" in s:  # an engine serving LoRA adapters (--enable-lora)
            yield from self._lora(s["lora"])

    def _iteration_tokens(self, histogram: dict[str, Any] | None) -> HistogramMetricFamily:
        """The engine's histogram of tokens per step (all zero while the engine does not answer)."""
        bounds = histogram["buckets"] if histogram else ITERATION_TOKEN_BUCKETS
        counts = histogram["counts"] if histogram else [0] * (len(bounds) + 1)
        family = HistogramMetricFamily(
            "llmp_iteration_tokens",
            "Tokens per engine step: prompt tokens computed plus tokens sampled.",
            labels=list(self.labels),
        )
        cumulative, buckets = 0, []
        for bound, count in zip([*map(float, bounds), float("inf")], counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        family.add_metric(list(self.labels.values()), buckets, histogram["sum"] if histogram else 0)
        return family

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
    """The registry behind ``/metrics``; ``names="vllm"`` (``--metrics-names vllm``) exposes every
    metric under its vLLM names too."""

    def __init__(self, model_name: str, names: str = "llmp") -> None:
        # no *_created series (as vLLM): the multiprocess mode of several API servers cannot export
        # them, and the series a scrape shows must not depend on --api-server-count
        disable_created_metrics()
        self.registry = CollectorRegistry()
        self.label = {"model_name": model_name}
        self.engine = EngineStatsCollector(model_name)
        scraped = _multiprocess_registry() or self.registry
        scraped.register(self.engine)  # the engine's figures once, however many API servers
        self.exposed = WithVllmNames(scraped) if names == "vllm" else scraped
        histogram, counter = self._histogram, self._counter
        self.ttft = histogram("llmp_time_to_first_token_seconds", "Time to the first generated token.", TTFT_BUCKETS)
        self.itl = histogram(
            "llmp_inter_token_latency_seconds", "Time between generated tokens.", TOKEN_LATENCY_BUCKETS
        )
        self.tpot = histogram(
            "llmp_request_time_per_output_token_seconds",
            "A request's decode time per output token after the first.",
            TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = histogram(
            "llmp_e2e_request_latency_seconds", "Request latency, arrival to finish.", REQUEST_LATENCY_BUCKETS
        )
        self.queue_time = histogram(
            "llmp_request_queue_time_seconds", "Time in the engine's waiting queue.", REQUEST_LATENCY_BUCKETS
        )
        self.inference_time = histogram(
            "llmp_request_inference_time_seconds", "Time from first scheduled to last token.", REQUEST_LATENCY_BUCKETS
        )
        self.prefill_time = histogram(
            "llmp_request_prefill_time_seconds", "Time from first scheduled to first token.", REQUEST_LATENCY_BUCKETS
        )
        self.decode_time = histogram(
            "llmp_request_decode_time_seconds", "Time from first to last token.", REQUEST_LATENCY_BUCKETS
        )
        self.request_prompt_tokens = histogram(
            "llmp_request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS
        )
        self.request_generation_tokens = histogram(
            "llmp_request_generation_tokens", "Generated tokens per request.", TOKEN_BUCKETS
        )
        self.request_max_generation_tokens = histogram(
            "llmp_request_max_num_generation_tokens",
            "Most tokens generated by one of a request's n sequences.",
            TOKEN_BUCKETS,
        )
        self.params_n = histogram("llmp_request_params_n", "The n request parameter.", N_BUCKETS)
        self.params_max_tokens = histogram(
            "llmp_request_params_max_tokens", "The max_tokens request parameter, when set.", TOKEN_BUCKETS
        )
        self.prompt_tokens = counter("llmp_prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("llmp_generation_tokens", "Generated tokens.")
        self.success = counter("llmp_request_success", "Finished requests by finish reason.", "finished_reason")
        self.failures = counter("llmp_request_failure", "Requests that ended in an error.")
        self.rejected = counter(
            "llmp_requests_rejected", "Requests refused before reaching the engine, by reason.", "reason"
        )
        self.timeouts = counter("llmp_request_timeout", "Requests aborted by --request-timeout.")
        for reason in FINISHED_REASONS:
            self.success.labels(finished_reason=reason, **self.label)
        for reason in REJECTED_REASONS:
            self.rejected.labels(reason=reason, **self.label)

    def observe_params(self, params: Any) -> None:
        """vLLM's histograms of the request's ``n`` and ``max_tokens`` (when set)."""
        self.params_n.observe(getattr(params, "n", 1) or 1)
        if getattr(params, "max_tokens", None) is not None:
            self.params_max_tokens.observe(params.max_tokens)

    def observe_engine_times(self, times: Mapping[str, float], num_tokens: int) -> None:
        """Queue, inference, prefill and decode time from the engine's timings of a finished request
        (``RequestOutput.metrics``; ``num_tokens`` its longest sequence's); those it never reached
        (aborted while waiting) are left out."""
        arrival, scheduled = times.get("arrival_time"), times.get("scheduled_time")
        first, last = times.get("first_token_time"), times.get("last_token_time")
        if arrival is None or scheduled is None:
            return
        self.queue_time.observe(max(scheduled - arrival, 0.0))
        if first is None or last is None:
            return
        self.prefill_time.observe(max(first - scheduled, 0.0))
        self.decode_time.observe(max(last - first, 0.0))
        self.inference_time.observe(max(last - scheduled, 0.0))
        if num_tokens > 1:
            self.tpot.observe((last - first) / (num_tokens - 1))

    # every metric is made here, by these two: the one place that decides the registry
    def _histogram(self, name: str, doc: str, buckets: tuple) -> Any:
        return Histogram(name, doc, ["model_name"], buckets=buckets, registry=self.registry).labels(**self.label)

    def _counter(self, name: str, doc: str, *labels: str) -> Any:
        """Bound to the model name; with more ``labels``, the caller gives them (``.labels(...)``)."""
        counter = Counter(name, doc, ["model_name", *labels], registry=self.registry)
        return counter if labels else counter.labels(**self.label)

    async def render(self, engine: Any) -> bytes:
        try:
            # bounded like the readiness probe: a scrape must answer even while the engine hangs
            self.engine.stats = await engine.stats(timeout=STATS_TIMEOUT_S) if engine is not None else {}
        except Exception:  # a dead engine still gets its request counters scraped
            self.engine.stats = {}
        return generate_latest(self.exposed)


def _multiprocess_registry() -> CollectorRegistry | None:
    """With several API-server processes (``--api-server-count``), each writes its counters and
    histograms to files in ``PROMETHEUS_MULTIPROC_DIR`` (set before prometheus_client is imported)
    and a scrape sums every process's: this registry. None in a single process."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    return registry


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

    def check_capacity(self, count: int, param: str | None = None, what: str = "prompts") -> None:
        """Refuse, before any of them starts, a request that needs ``count`` engine requests
        (a list of prompts, or ``what`` else runs at once): 400 if it can never fit, the overload
        status if it cannot fit now."""
        from llmp.frontend.errors import APIError

        if self.capacity is None:
            return
        if count > self.capacity:
            raise APIError(
                400,
                f"{count} {what} in one request exceed the {self.capacity} requests the server "
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
                longest = max(seen.values(), default=0)  # of the n sequences
                m.request_max_generation_tokens.observe(longest)
                m.e2e.observe(time.perf_counter() - arrival)
                m.observe_params(record.params)
                m.observe_engine_times(output.metrics, longest)
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
