"""The engine's stat loggers: every registered ``stat_logger``, built once and called directly."""

from __future__ import annotations

import logging

from llmp import registry
from llmp.api import EngineInfo, FinishedRequestStats, SchedulerStats, StatLogger
from llmp.builtins.engine import LOGGING_STAT_LOGGER

log = logging.getLogger("llmp.engine")


class StatLoggers:
    """The stat loggers of one engine, built from the registry when it starts.

    The engine calls ``record_step`` once per step, and once more with the fresh counts (no tokens)
    when it aborts requests between steps, so no logger keeps showing an aborted request as running;
    ``record_finished`` once per request that ends, aborted ones included: plain method calls, no
    pluggy. A logger that raises (when built or when called) is reported once, with its traceback,
    and dropped: figures are never worth the engine.
    ``log_stats=False`` (``--disable-log-stats``) leaves out the built-in ``logging`` logger.
    While ``muted`` (the server's warm-up request) no logger is told anything.
    """

    def __init__(self, info: EngineInfo, log_stats: bool = True) -> None:
        self.loggers: list[tuple[str, StatLogger]] = []
        self.muted = False
        for name, spec in registry.components("stat_logger").items():
            if name == LOGGING_STAT_LOGGER and not log_stats:
                continue
            try:
                self.loggers.append((name, spec.load()(info)))
            except Exception:
                log.exception("stat logger %r (from %s) failed to start; it is disabled", name, spec.distribution)

    def __bool__(self) -> bool:
        """Whether the engine should compute figures for the loggers at all."""
        return bool(self.loggers) and not self.muted

    def record_step(self, stats: SchedulerStats) -> None:
        for name, logger in self.loggers:
            try:
                logger.record_step(stats)
            except Exception:
                self._drop(name)

    def record_finished(self, stats: FinishedRequestStats) -> None:
        for name, logger in self.loggers:
            try:
                logger.record_finished(stats)
            except Exception:
                self._drop(name)

    def _drop(self, name: str) -> None:
        log.exception("stat logger %r failed; it is disabled for the rest of this engine's life", name)
        self.loggers = [entry for entry in self.loggers if entry[0] != name]
