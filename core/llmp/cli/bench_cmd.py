"""``llmp bench``: benchmarks. ``llmp bench serve`` load-tests any OpenAI-compatible server;
``llmp bench throughput`` and ``llmp bench latency`` (in ``bench_offline``) run the engine in-process.

Requests stream; each one's TTFT, inter-token gaps and end-to-end latency are
timed on arrival of its chunks, and token counts come from the server's usage
chunk. Failed requests are counted, never fatal. httpx, asyncio and rich are
imported inside functions: this module is imported whenever the CLI lists
commands.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import typer

from llmp.cli.bench_offline import latency, throughput
from llmp.cli.bench_report import ReportOptions, emit_report, percentile
from llmp.cli.options import options_command, usage_error
from llmp.cli.sse import DEFAULT_URL, ServerError
from llmp.options import option

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")  # what bench serve sends: streamed text generation

app = typer.Typer(no_args_is_help=True)  # its help is the CommandSpec's (llmp/builtins/commands.py)

# Common English words: most are one token in real tokenizers, so N words are about N tokens.
WORDS = tuple(
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part over new sound take only little work know place year live me back give most very "
    "after thing our just name good sentence man think say great where help through much before line right "
    "too mean old any same tell boy follow came want show also around form three small set put end does "
    "another well large must big even such because turn here why ask went men read need land different home "
    "us move try kind hand picture again change off play spell air away animal house point page letter mother "
    "answer found study still learn should world high every near add food between own below country plant".split()
)


METRICS = {
    "ttft": "Time to first token",
    "tpot": "Time per output token (excl. 1st)",
    "itl": "Inter-token latency",
    "e2el": "End-to-end latency",
}
SLO_METRICS = ("ttft", "tpot", "e2el")  # per request (an inter-token gap is not a request's)


def _metrics(value: str) -> str | None:
    unknown = [name for name in (n.strip() for n in value.split(",")) if name not in METRICS]
    return f"takes {', '.join(METRICS)}; not {', '.join(map(repr, unknown))}" if unknown else None


def _percentiles(value: str) -> str | None:
    try:
        values = [float(item) for item in value.split(",")]
    except ValueError:
        return f"must be numbers separated by commas, got {value!r}"
    return None if all(0 < q <= 100 for q in values) else f"must be above 0 and at most 100, got {value!r}"


def _slo(value: str) -> str | None:
    name, _, ms = value.partition(":")
    try:
        bound = float(ms)
    except ValueError:
        bound = -1
    if name not in SLO_METRICS or not bound > 0:
        return f"must be METRIC:MS with METRIC one of {', '.join(SLO_METRICS)} and MS above 0, got {value!r}"
    return None


@dataclass(frozen=True, kw_only=True)
class BenchServeSettings:
    # --base-url: vLLM's name for it, accepted too
    url: str = option(
        DEFAULT_URL, "The server: http://HOST:PORT, with or without /v1.", short="--base-url", metavar="URL"
    )
    endpoint: str = option(ENDPOINTS[0], f"{' or '.join(ENDPOINTS)} (the /v1 optional), under --url.")
    model: str | None = option(None, "Model to ask (default: the first of GET URL/v1/models).", metavar="NAME")
    api_key: str | None = option(
        None, "Sent as 'Authorization: Bearer KEY'; LLMP_API_KEY comes before OPENAI_API_KEY.", metavar="KEY"
    )
    dataset: Literal["random", "prefix"] = option(
        "random", "random: random words; prefix: one shared prefix, then random words."
    )
    num_prompts: int = option(100, "Requests to send.", ge=1)
    input_len: int = option(128, "Random words per prompt (about as many tokens).", ge=1)
    output_len: int = option(64, "max_tokens of each request (EOS is ignored).", ge=1)
    prefix_len: int = option(128, "prefix dataset: words of the prefix all prompts share.", ge=0)
    request_rate: float = option(math.inf, "Requests per second, Poisson arrivals; inf sends all at once.", gt=0)
    max_concurrency: int | None = option(None, "Most requests in flight at once.", ge=1)
    seed: int = option(0, "Seed of the prompts and the arrival times.")
    # vLLM's names and defaults, but for e2el, which llmp has always reported
    percentile_metrics: str = option(
        ",".join(METRICS), "Metrics reported: ttft, tpot, itl, e2el, comma-separated.", metavar="LIST", check=_metrics
    )
    metric_percentiles: str = option(
        "99", "Percentiles of each metric, comma-separated (25,50,99.9).", metavar="LIST", check=_percentiles
    )
    goodput: tuple[str, ...] = option(
        (),
        "A service-level objective METRIC:MS (ttft, tpot or e2el; repeatable): request_goodput counts the "
        "requests that meet every one.",
        metavar="SLO",
        check=_slo,
    )

    @property
    def metrics(self) -> list[str]:
        return [name.strip() for name in self.percentile_metrics.split(",")]

    @property
    def percentiles(self) -> list[float]:
        return [float(value) for value in self.metric_percentiles.split(",")]

    @property
    def slos(self) -> dict[str, float]:
        """The goodput objectives in seconds, by metric."""
        return {name: float(ms) / 1000 for name, ms in (slo.split(":") for slo in self.goodput)}


@app.command("serve")
@options_command
def serve(load: BenchServeSettings, output: ReportOptions) -> None:
    """Load-test an OpenAI-compatible server (llmp, vLLM, ...) and report throughput and latencies."""
    import asyncio

    check_before_run(load, output)
    try:
        report = asyncio.run(run_benchmark(load))
    except UnservedModel as exc:  # a usage error, found before any load is sent
        raise usage_error(str(exc)) from None
    except ServerError as exc:
        print(f"llmp: error: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        print("llmp: interrupted", file=sys.stderr)
        raise typer.Exit(130) from None
    emit_report(report, output, print_table)
    if report["failed"]:
        raise typer.Exit(1)  # a load test with failures must not pass for a clean one in scripts


def check_before_run(load: BenchServeSettings, output: ReportOptions) -> None:
    """Usage errors (status 2) that the options' declarations cannot tell, before anything is sent:
    a URL that names no server, an endpoint bench serve does not send, a result file it could not write."""
    from llmp.cli.sse import api_url

    try:
        api_url(load.url)
    except ServerError as exc:
        raise usage_error(str(exc)) from None
    if api_path(load.endpoint) is None:
        raise usage_error(
            f"--endpoint {load.endpoint!r} is not one bench serve sends; "
            f"it sends {' or '.join(ENDPOINTS)} (the /v1 optional)"
        )
    if output.save_result is not None and (problem := unwritable(output.save_result)):
        raise usage_error(f"--save-result {output.save_result}: {problem}")


def unwritable(path: Path) -> str | None:
    """Why ``path`` could not be written, or None: checked before a run, so a typo does not cost the run."""
    import os

    folder = path.parent
    if path.is_dir():
        return "is a directory"
    if not folder.is_dir():
        return f"the directory {folder} does not exist"
    if not os.access(path if path.exists() else folder, os.W_OK):
        return f"cannot write {'the file' if path.exists() else f'in {folder}'} (permission denied)"
    return None


class UnservedModel(ServerError):
    """``--model`` names a model the server does not list: a usage error, found before any load is sent."""


app.command("throughput")(throughput)  # after serve: the group lists its commands in this order
app.command("latency")(latency)


# -- the requests -----------------------------------------------------------------


@dataclass
class RequestResult:
    """What one streamed request measured; times in seconds."""

    ok: bool = False
    error: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)


def make_prompts(settings: BenchServeSettings) -> list[str]:
    """Seeded random-word prompts; with the prefix dataset all share one prefix of ``prefix_len`` words."""
    import random

    rng = random.Random(settings.seed)

    def words(n: int) -> str:
        return " ".join(rng.choices(WORDS, k=n))

    prefix = words(settings.prefix_len) + " " if settings.dataset == "prefix" and settings.prefix_len else ""
    return [prefix + words(settings.input_len) for _ in range(settings.num_prompts)]


def api_path(endpoint: str) -> str | None:
    """``--endpoint``'s route under the API base (``/completions`` or ``/chat/completions``), with or
    without ``/v1`` and slashes; None for a route bench serve does not send."""
    path = "/" + endpoint.strip().strip("/")
    if path == "/v1" or path.startswith("/v1/"):
        path = path[3:]
    return path if "/v1" + path in ENDPOINTS else None


def is_chat(endpoint: str) -> bool:
    return api_path(endpoint) == "/chat/completions"


def endpoint_url(settings: BenchServeSettings) -> str:
    """The URL requests go to: ``--endpoint`` under the API base of ``--url``, the ``/v1`` counted once."""
    from llmp.cli.sse import api_url

    return api_url(settings.url) + (api_path(settings.endpoint) or "")


def request_payload(settings: BenchServeSettings, model: str, prompt: str) -> dict[str, Any]:
    body: dict[str, Any] = (
        {"messages": [{"role": "user", "content": prompt}]} if is_chat(settings.endpoint) else {"prompt": prompt}
    )
    return {
        "model": model,
        **body,
        "max_tokens": settings.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def timed_request(
    client: Any, url: str, payload: dict[str, Any], api_key: str | None, on_output: Callable[[], None] | None = None
) -> RequestResult:
    """Send one streaming request, timing the first content chunk and the gaps between later ones;
    ``on_output`` is called at each chunk of output."""
    import time

    from llmp.cli.sse import ServerError, chunk_text, stream_chunks

    result = RequestResult()
    start = last = time.perf_counter()
    chunks = 0
    usage: dict[str, Any] = {}
    try:
        async for chunk in stream_chunks(client, url, payload, api_key):
            now = time.perf_counter()
            usage = chunk.get("usage") or usage  # the include_usage chunk comes last, with no choices
            # output: text, or the last chunk (its tokens may all have been ones that decode to no text)
            if not chunk_text(chunk) and not any(c.get("finish_reason") for c in chunk.get("choices") or ()):
                continue
            if on_output is not None:
                on_output()
            if chunks == 0:
                result.ttft = now - start
            else:
                result.itl.append(now - last)
            last, chunks = now, chunks + 1
    except ServerError as exc:
        result.error = str(exc)
        return result
    result.latency = time.perf_counter() - start
    if chunks == 0:
        result.error = f"{url} streamed no output"
        return result
    result.ok = True
    result.input_tokens = int(usage.get("prompt_tokens") or 0)
    result.output_tokens = int(usage.get("completion_tokens") or chunks)  # without usage, a chunk per token
    return result


async def run_benchmark(settings: BenchServeSettings) -> dict[str, Any]:
    """Check the model is served (the first one listed unless named), send every request, and
    summarize what they measured."""
    import httpx

    from llmp.cli.sse import api_key_or_env, api_url, served_models

    api_key = api_key_or_env(settings.api_key)
    url = endpoint_url(settings)
    in_flight = settings.max_concurrency or settings.num_prompts
    # Enough pooled connections for every request allowed in flight; a slow chunk may take minutes, none forever.
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600.0, connect=30.0, pool=None)) as client:
        models_url = api_url(settings.url) + "/models"
        served = await served_models(client, models_url, api_key)
        model = settings.model or served[0]
        if model not in served:
            raise UnservedModel(f"--model {model!r} is not served at {models_url}, which lists: {', '.join(served)}")
        prompts = make_prompts(settings)
        print(
            f"llmp bench serve: {len(prompts)} requests to {url} (model {model}, request rate "
            f"{settings.request_rate:g}/s, max concurrency {settings.max_concurrency or 'none'})",
            file=sys.stderr,
        )
        payloads = [request_payload(settings, model, prompt) for prompt in prompts]
        results, duration = await send_all(client, url, payloads, api_key, settings)
    return summarize(settings, model, prompts, results, duration)


async def send_all(
    client: Any, url: str, payloads: list[dict[str, Any]], api_key: str | None, settings: BenchServeSettings
) -> tuple[list[RequestResult], float]:
    """Start each request at its Poisson arrival time, at most ``max_concurrency`` in flight; wall time too."""
    import asyncio
    import random
    import time

    semaphore = asyncio.Semaphore(settings.max_concurrency or len(payloads))
    arrivals = random.Random(settings.seed + 1)  # its own stream: the rate does not change the prompts

    progress = LoadProgress(len(payloads))

    async def limited(payload: dict[str, Any]) -> RequestResult:
        async with semaphore:  # TTFT counts from sending, not from waiting for a free slot
            result = await timed_request(client, url, payload, api_key, progress.output)
        progress.finished(result)
        return result

    start = time.perf_counter()
    tasks = []
    try:
        for i, payload in enumerate(payloads):
            if i and math.isfinite(settings.request_rate):
                await asyncio.sleep(arrivals.expovariate(settings.request_rate))
            tasks.append(asyncio.create_task(limited(payload)))
        results = await asyncio.gather(*tasks)
    finally:
        progress.close()
    return list(results), time.perf_counter() - start


class LoadProgress:
    """How far the load has got, on stderr while it runs: at a terminal a rich bar (requests done of
    all, output tokens per second so far), else a plain line at most every ``PLAIN_LINE_EVERY_S``.
    Output tokens are counted as streamed chunks, one token each; the report counts them exactly."""

    PLAIN_LINE_EVERY_S = 10.0

    def __init__(self, total: int) -> None:
        import time

        from rich.console import Console

        self.total, self.done, self.failed, self.tokens = total, 0, 0, 0
        self.start = self.last_line = time.perf_counter()
        console = Console(stderr=True)
        self.bar: Any = None
        if console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("requests"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                console=console,
            )
            self.task = self.bar.add_task("requests", total=total, rate=self._rate())
            self.bar.start()

    def output(self) -> None:
        self.tokens += 1
        self._show()

    def finished(self, result: RequestResult) -> None:
        self.done += 1
        self.failed += not result.ok
        self._show()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, rate=self._rate())
            self.bar.stop()

    def _rate(self) -> str:
        import time

        elapsed = max(time.perf_counter() - self.start, 1e-9)
        failed = f", {self.failed} failed" if self.failed else ""
        return f"{self.tokens / elapsed:.1f} output tok/s{failed}"

    def _show(self) -> None:
        import time

        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, rate=self._rate())
            return
        now = time.perf_counter()
        if now - self.last_line >= self.PLAIN_LINE_EVERY_S:
            self.last_line = now
            print(f"llmp bench serve: {self.done}/{self.total} requests done, {self._rate()}", file=sys.stderr)


# -- the report -------------------------------------------------------------------


def latency_stats(name: str, seconds: list[float], percentiles: list[float]) -> dict[str, float | None]:
    """Mean, median, standard deviation and each percentile in ms, under vLLM's keys (``p99_ttft_ms``,
    ``p99.9_ttft_ms``); null when no request measured this."""
    import statistics

    keys = [f"{stat}_{name}_ms" for stat in ("mean", "median", "std", *map(percentile_word, percentiles))]
    if not seconds:
        return dict.fromkeys(keys)
    values = [
        statistics.fmean(seconds),
        statistics.median(seconds),
        statistics.pstdev(seconds),
        *(percentile(seconds, q) for q in percentiles),
    ]
    return {key: value * 1000 for key, value in zip(keys, values, strict=True)}


def percentile_word(q: float) -> str:
    return f"p{int(q) if q == int(q) else q}"


def request_tpot(result: RequestResult) -> float | None:
    return (result.latency - result.ttft) / (result.output_tokens - 1) if result.output_tokens > 1 else None


def meets(result: RequestResult, slos: dict[str, float]) -> bool:
    """Whether a request met every objective (vLLM's goodput); one token's TPOT meets any."""
    measured = {"ttft": result.ttft, "tpot": request_tpot(result) or 0.0, "e2el": result.latency}
    return all(measured[name] <= bound for name, bound in slos.items())


def summarize(
    settings: BenchServeSettings, model: str, prompts: list[str], results: list[RequestResult], duration: float
) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    errors = [r.error for r in results if not r.ok]
    # Servers that send no usage chunk: count the prompt's words as its tokens.
    input_tokens = sum(r.input_tokens or len(p.split()) for r, p in zip(results, prompts, strict=True) if r.ok)
    output_tokens = sum(r.output_tokens for r in ok)
    report: dict[str, Any] = {
        "model": model,
        "endpoint": settings.endpoint,
        "dataset": settings.dataset,
        "num_prompts": settings.num_prompts,
        "request_rate": settings.request_rate if math.isfinite(settings.request_rate) else "inf",
        "max_concurrency": settings.max_concurrency,
        "successful": len(ok),
        "failed": len(errors),
        "first_error": errors[0] if errors else None,
        "duration_s": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
        "request_goodput": sum(meets(r, settings.slos) for r in ok) / duration if settings.goodput else None,
        "goodput": list(settings.goodput),
        "metric_percentiles": settings.percentiles,
    }
    measured = {
        "ttft": [r.ttft for r in ok],
        "tpot": [t for t in map(request_tpot, ok) if t is not None],
        "itl": [gap for r in ok for gap in r.itl],
        "e2el": [r.latency for r in ok],
    }
    for name in settings.metrics:
        report.update(latency_stats(name, measured[name], settings.percentiles))
    return report


LABELS = {
    "successful": "Successful requests",
    "failed": "Failed requests",
    "duration_s": "Benchmark duration (s)",
    "total_input_tokens": "Total input tokens",
    "total_output_tokens": "Total output tokens",
    "request_throughput": "Request throughput (req/s)",
    "output_throughput": "Output token throughput (tok/s)",
    "total_token_throughput": "Total token throughput (tok/s)",
}


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"llmp bench serve: {report['model']} {report['endpoint']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, label in LABELS.items():
        table.add_row(label, _format(report[key]))
    if report["request_goodput"] is not None:
        table.add_row(f"Request goodput (req/s; {', '.join(report['goodput'])} ms)", _format(report["request_goodput"]))
    stats = ("mean", "median", "std", *map(percentile_word, report["metric_percentiles"]))
    for name, label in METRICS.items():
        if f"mean_{name}_ms" not in report:
            continue
        table.add_section()
        for stat in stats:
            table.add_row(f"{label}, {stat} (ms)", _format(report[f"{stat}_{name}_ms"]))
    console = Console()
    console.print(table)
    if report["first_error"]:
        console.print(f"first error: {report['first_error']}", markup=False, highlight=False, soft_wrap=True)


def _format(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)
