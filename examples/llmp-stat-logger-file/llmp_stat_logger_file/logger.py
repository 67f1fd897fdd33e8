"""The ``jsonl_file`` stat logger: every engine step and every request that ends, one JSON line
each, appended to the file ``LLMP_STAT_LOGGER_FILE`` names (nothing is written when it is unset).

Each line has ``event`` (``"step"`` or ``"finished"``), ``time`` (Unix seconds), ``pid`` and
``model``, then the record's fields (``llmp.api.SchedulerStats`` or ``FinishedRequestStats``)::

    {"event": "step", "time": 1718000000.25, "pid": 4242, "model": "Qwen/Qwen3-0.6B", "num_running": 2, ...}
    {"event": "finished", "time": 1718000000.5, "pid": 4242, "model": "Qwen/Qwen3-0.6B", "request_id": ...}

Read it with ``jq``, pandas (``pandas.read_json(path, lines=True)``) or any log shipper.

The engine builds the logger once when it starts, in the engine's process, and calls it directly on
its loop, so each call must be cheap: a line is written with one ``write`` to a file opened for
appending with line buffering (microseconds on a local disk; a network sink would hand the lines
to a thread instead). Several engine processes may share the file: each line is one append.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import IO, Any

from llmp.api import EngineInfo, FinishedRequestStats, SchedulerStats

PATH_VARIABLE = "LLMP_STAT_LOGGER_FILE"


class JSONLinesStatLogger:
    def __init__(self, info: EngineInfo) -> None:
        self.model = info.model
        self.path = os.environ.get(PATH_VARIABLE) or None
        self._file: IO[str] | None = None  # opened at the first record: building the logger stays instant

    def record_step(self, stats: SchedulerStats) -> None:
        self._write("step", stats)

    def record_finished(self, stats: FinishedRequestStats) -> None:
        self._write("finished", stats)

    def _write(self, event: str, stats: Any) -> None:
        if self.path is None:
            return
        if self._file is None:
            self._file = open(self.path, "a", buffering=1, encoding="utf-8")  # open for the engine's life
        line = {"event": event, "time": round(time.time(), 6), "pid": os.getpid(), "model": self.model}
        line.update(dataclasses.asdict(stats))
        self._file.write(json.dumps(line) + "\n")
