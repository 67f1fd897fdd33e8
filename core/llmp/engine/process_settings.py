"""Process-wide settings of a process that runs an engine (threads, the allocator), applied where the engine starts.

``import llmp`` changes nothing in the process; the engine process (``llmp.engine.core_proc``)
applies these before torch loads, and its workers inherit them. An engine run inside the
caller's process (``LLM``, ``AsyncLLM(engine_mode="thread")``) applies them too, but there they
take effect only if torch is not loaded yet (OpenMP reads them once, when torch first loads it);
the engine's worker processes get them either way.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
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


def release_freed_memory() -> int:
    """Give the memory freed while loading (the tokenizer's and the weights' temporaries) back to the OS.

    glibc keeps freed memory in its heaps (the ``cpu`` kernel set asks it to keep up to 512 MiB, for
    the steps' activations), so a process's resident set after start-up counts what loading let go:
    about 30 MB of the default model's 178 (2026-12-04). One ``malloc_trim`` after loading returns
    it; the steps' memory is taken afterwards. Returns the bytes the resident set shrank by; 0 where
    the C library is not glibc.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return 0
    before = _resident_bytes()
    ctypes.CDLL(None).malloc_trim(0)
    released = max(0, before - _resident_bytes())
    log.debug("returned %.1f MB of memory freed while loading to the OS", released / 1e6)
    return released


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def exit_without_teardown(code: int) -> NoReturn:
    """End a server or engine process that has shut down: run the exit handlers, flush, and skip
    the interpreter's teardown, which spends seconds freeing torch's and transformers' module
    graphs while whoever stopped the process waits."""
    import atexit

    atexit._run_exitfuncs()  # logging's shutdown, weakref finalizers, tracing's flush
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
