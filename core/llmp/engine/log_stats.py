"""The built-in ``logging`` stat logger: vLLM's periodic statistics line.

Every ``LLMP_LOG_STATS_INTERVAL`` seconds (default 10) while the engine works it logs, at INFO::

    Avg prompt throughput: 52.1 tokens/s, Avg generation throughput: 20.3 tokens/s, Running: 2 reqs,
    Waiting: 0 reqs, KV cache usage: 1.2%, Prefix cache hit rate: 35.0%

and once more after the work stops (the zeros), then nothing while idle. Throughput counts the
tokens computed in the interval (prompt chunks and sampled tokens, as vLLM); the hit rate is the
interval's share of prompt tokens found in the prefix cache. ``--disable-log-stats`` leaves this logger out.
A ``LLMP_LOG_STATS_INTERVAL`` that is not a positive number of seconds is reported in one warning
line and the default used (vLLM's ``VLLM_LOG_STATS_INTERVAL`` also falls back to 10 s).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref

from llmp.api import EngineInfo, FinishedRequestStats, SchedulerStats

log = logging.getLogger("llmp.engine")
INTERVAL_VARIABLE = "LLMP_LOG_STATS_INTERVAL"
DEFAULT_INTERVAL_S = 10.0


def interval_from_env() -> float:
    """Seconds between lines: ``LLMP_LOG_STATS_INTERVAL``, or the default when unset or not usable."""
    text = os.environ.get(INTERVAL_VARIABLE, "").strip()
    if not text:
        return DEFAULT_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        log.warning(
            "%s=%s is not a positive number of seconds; logging statistics every %g s "
            "(--disable-log-stats turns them off)",
            INTERVAL_VARIABLE,
            text,
            DEFAULT_INTERVAL_S,
        )
        return DEFAULT_INTERVAL_S
    return value


class LoggingStatLogger:
    """Counts on the engine's thread; a daemon thread logs each interval (also once the engine
    has gone idle, when no step would call the logger)."""

    def __init__(self, info: EngineInfo) -> None:
        self.interval = interval_from_env()
        self.lock = threading.Lock()
        self.prompt_tokens = self.generation_tokens = 0  # computed since the last line
        self.last: SchedulerStats | None = None  # the latest figures (a step's, or an abort's)
        self.logged: SchedulerStats | None = None  # the figures at the last line (the hit rate's base)
        self.last_line_busy = False  # the last line showed work: one more line shows it stopped
        self.stamp = time.monotonic()
        threading.Thread(
            target=_log_every_interval, args=(weakref.ref(self),), name="llmp-log-stats", daemon=True
        ).start()

    def record_step(self, stats: SchedulerStats) -> None:
        with self.lock:
            self.last = stats
            self.prompt_tokens += stats.num_prompt_tokens
            self.generation_tokens += stats.num_generation_tokens

    def record_finished(self, stats: FinishedRequestStats) -> None:
        pass  # the step figures count tokens as they are computed

    def line(self) -> str | None:
        """The interval's line, and a new interval; None when nothing happened in it or the last."""
        with self.lock:
            now = time.monotonic()
            elapsed, self.stamp = max(now - self.stamp, 1e-9), now
            prompt, generation, self.prompt_tokens, self.generation_tokens = (
                self.prompt_tokens,
                self.generation_tokens,
                0,
                0,
            )
            stats, base = self.last, self.logged
            if stats is None:
                return None
            busy = prompt > 0 or generation > 0 or stats.num_running > 0 or stats.num_waiting > 0
            if not (busy or self.last_line_busy):
                return None
            self.last_line_busy, self.logged = busy, stats
        queries = stats.prefix_cache_queries - (base.prefix_cache_queries if base else 0)
        hits = stats.prefix_cache_hits - (base.prefix_cache_hits if base else 0)
        return (
            f"Avg prompt throughput: {prompt / elapsed:.1f} tokens/s, "
            f"Avg generation throughput: {generation / elapsed:.1f} tokens/s, "
            f"Running: {stats.num_running} reqs, Waiting: {stats.num_waiting} reqs, "
            f"KV cache usage: {stats.kv_cache_usage:.1%}, "
            f"Prefix cache hit rate: {hits / queries if queries else 0.0:.1%}"
        )


def _log_every_interval(ref: weakref.ref[LoggingStatLogger]) -> None:
    """Runs until the logger is garbage-collected with its engine."""
    logger = ref()
    if logger is None:
        return
    interval = logger.interval
    del logger
    while True:
        time.sleep(interval)
        logger = ref()
        if logger is None:
            return
        line = logger.line()
        del logger
        if line is not None:
            log.info(line)
