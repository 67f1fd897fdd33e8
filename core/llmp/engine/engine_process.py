"""The engine's child process, which can start before its arguments are known.

``python -m llmp.engine.core_proc`` imports torch, the engine and the plugins as soon as it
starts (about 2 s on a small CPU), then reads its arguments, pickled on stdin. A caller may so
start it first and send the arguments once it has them: ``llmp serve`` starts it before it
imports its web stack and resolves the model (a GGUF file's first conversion included), and the
engine's imports run meanwhile on another core. Light to import: nothing here loads torch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

from llmp.progress import LEVELS, configure_logging


class EngineProcess:
    """``python -m llmp.engine.core_proc PARENT_PID``, started at once; :meth:`send` gives it its arguments
    (the ``EngineConfig``, the ``ResolvedModel`` and the two ZMQ addresses), and
    :meth:`discard` stops one that never got them. It logs at ``log_level`` (the caller's level of
    the ``llmp`` logger by default) to the caller's stderr."""

    def __init__(self, log_level: str | None = None) -> None:
        if log_level is None:
            configure_logging()  # the caller's level: LLMP_LOG_LEVEL's unless it set its own
            log_level = logging.getLevelName(logging.getLogger("llmp").getEffectiveLevel()).lower()
        env = {**os.environ, **({"LLMP_LOG_LEVEL": log_level} if log_level in LEVELS else {})}
        # the parent's pid on the command line: the child watches it from its first moment, so a parent that
        # dies before the child has started is seen at once (getppid() would already name another process)
        command = [sys.executable, "-m", "llmp.engine.core_proc", str(os.getpid())]
        with _ctrl_c_ignored():  # Ctrl-C goes to the front-end: the child ignores it from its start
            self.popen = subprocess.Popen(command, stdin=subprocess.PIPE, env=env)
        self.pid = self.popen.pid
        self.sent = False

    def send(self, args: tuple) -> None:
        """Hand the process its arguments (once); it reads them when its imports are done."""
        if self.sent:
            raise RuntimeError("the engine process has its arguments already")
        self.sent = True
        try:
            self.popen.stdin.write(pickle.dumps(args))  # the child drains its stdin while it imports
            self.popen.stdin.close()
        except BrokenPipeError:  # it died starting (its exit code tells the caller's wait_ready)
            pass

    def discard(self) -> None:
        """Stop the process if it never got its arguments (it has done nothing but import)."""
        if self.sent:
            return
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self.popen.stdin.close()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:  # the caller checks is_alive()
            pass

    def terminate(self) -> None:
        self.popen.terminate()

    def kill(self) -> None:
        self.popen.kill()


@contextlib.contextmanager
def _ctrl_c_ignored() -> Iterator[None]:
    """SIGINT ignored while the block runs (a child started in it inherits that across exec, and Python then
    installs no KeyboardInterrupt handler); only in the main thread, the one signal handlers belong to."""
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous is None:  # not the main thread, or a handler Python did not install (it could not restore it)
        yield
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
