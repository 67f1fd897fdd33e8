"""One API server of ``llmp serve --api-server-count N`` (``python -m llmp.server.api_server``),
started by the launcher in ``llmp.server.api_servers``: the whole HTTP app of ``llmp.server.launch``
on the inherited listening socket, with an engine client attached to the launcher's engine."""

from __future__ import annotations

import logging
import pickle
import signal
import socket
import sys
import threading
from typing import Any

from llmp.api import LLMPError
from llmp.server import launch
from llmp.server.api_servers import Replica
from llmp.server.settings import ServeSettings

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _main() -> None:
    # `python -m llmp.server.api_server`: the arguments arrive pickled on stdin from the launcher
    settings, model, replica, sock_fd, launcher_pid, started = pickle.load(sys.stdin.buffer)
    from llmp.engine.process_settings import exit_without_teardown

    exit_without_teardown(run_api_server(settings, model, replica, sock_fd, launcher_pid, started))


def run_api_server(
    settings: ServeSettings, model: Any, replica: Replica, sock_fd: int, launcher_pid: int, started: float
) -> int:
    """One API server of several, until the launcher stops it; its exit status."""
    from llmp.engine.core_proc import exit_with_parent
    from llmp.frontend.startup import read_chat_template
    from llmp.lora import parse_lora_module

    _die_with_launcher()
    threading.Thread(target=exit_with_parent, args=(launcher_pid,), daemon=True).start()  # elsewhere
    signal.signal(signal.SIGTERM, launch._interrupt)  # until uvicorn handles it: stop start-up quietly
    label = f"[api-server {replica.index}]"
    logging.basicConfig(level=settings.server.log_level.upper(), format=f"%(levelname)s %(name)s {label}: %(message)s")
    _label_uvicorn_logs(label)
    try:
        frontends = launch._frontend_specs(settings.server.frontend)
        chat_template = read_chat_template(settings.frontend.chat_template)
        lora_modules = [parse_lora_module(value) for value in settings.server.lora_modules]
        sock = socket.socket(fileno=sock_fd)
        return launch.serve_one(settings, model, sock, frontends, chat_template, lora_modules, started, replica)
    except (ValueError, TypeError, LLMPError) as exc:
        launch._error(exc)
        return 2
    except KeyboardInterrupt:
        return 0


def _die_with_launcher() -> None:
    """On Linux, the kernel kills this process the moment its launcher dies (a SIGKILLed launcher
    cannot stop it): at once, not at the next look of the watch thread. The launcher spawns API
    servers from its main thread only, whose end is the process's end (the signal follows the thread)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the watch thread alone
        pass


def _label_uvicorn_logs(label: str) -> None:
    """uvicorn's log lines (the access log too) say which API server wrote them."""
    from uvicorn.config import LOGGING_CONFIG

    for formatter in LOGGING_CONFIG["formatters"].values():
        formatter["fmt"] = formatter["fmt"].replace("%(levelprefix)s", f"%(levelprefix)s {label}", 1)


if __name__ == "__main__":
    _main()
