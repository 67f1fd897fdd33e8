"""Process-wide thread settings of a process that runs an engine, applied where the engine starts.

``import llmp`` changes nothing in the process; the engine process (``llmp.engine.core_proc``)
applies these before torch loads, and its workers inherit them. An engine run inside the
caller's process (``LLM``, ``AsyncLLM(engine_mode="thread")``) applies them too, but there they
take effect only if torch is not loaded yet (OpenMP reads them once, when torch first loads it);
the engine's worker processes get them either way.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

log = logging.getLogger("llmp.engine")

# OpenMP worker threads keep spinning between parallel regions instead of sleeping (GNU OpenMP's
# default spin is short): a CPU decode step is hundreds of small matmuls, and waking the threads
# for each one cost 30-40% of bf16 matrix-vector bandwidth on a 2-core machine (docs/benchmarks.md).
# Intel's OpenMP, which vLLM's CPU build preloads, spins for 200 ms by default.
# LLMP_OMP_SPIN=0 keeps GNU OpenMP's default (the test suite does: it runs many engines at once).
SPIN_SETTINGS = {"GOMP_SPINCOUNT": "10000000"}  # about 0.2 s of spinning


def apply_engine_process_settings() -> None:
    """Set the engine's OpenMP variables (unless set already, or ``LLMP_OMP_SPIN=0``)."""
    if os.environ.get("LLMP_OMP_SPIN", "1") == "0":
        return
    missing = {name: value for name, value in SPIN_SETTINGS.items() if name not in os.environ}
    if not missing:
        return
    if "torch" in sys.modules:  # still set: the engine's worker processes read it when they start
        log.debug("torch is already loaded: %s takes no effect in this process", ", ".join(missing))
    os.environ.update(missing)


def exit_without_teardown(code: int) -> NoReturn:
    """End a server or engine process that has shut down: run the exit handlers, flush, and skip
    the interpreter's teardown, which spends seconds freeing torch's and transformers' module
    graphs while whoever stopped the process waits."""
    import atexit

    atexit._run_exitfuncs()  # logging's shutdown, weakref finalizers, tracing's flush
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
