"""llmp-stat-logger-file: a stat logger for llmp writing the engine's figures to a file as JSON lines.

This module is the plugin's entry point: llmp imports it to collect the registration below,
so it imports nothing but llmp's API; the logger's module is imported when an engine starts.
"""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import: an incompatible llmp says so

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import StatLoggerSpec


@hookimpl
def llmp_register_stat_loggers() -> Iterator[StatLoggerSpec]:
    yield StatLoggerSpec(
        name="jsonl_file",
        impl="llmp_stat_logger_file.logger:JSONLinesStatLogger",
        description="Each step's and each finished request's figures, as JSON lines, to $LLMP_STAT_LOGGER_FILE",
    )
