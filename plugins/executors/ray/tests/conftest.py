"""One Ray cluster for every test of this folder: a head node on 127.0.0.1 with 4 CPUs."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

START_TIMEOUT_S = 120


def ray_cli() -> str:
    return shutil.which("ray", path=os.path.dirname(sys.executable)) or "ray"


@pytest.fixture(scope="session")
def cluster() -> Iterator[str]:
    """The cluster's address; torn down after the session.

    ``ray start --block`` runs in its own process group, and teardown signals that group only: ``ray stop``
    would kill every Ray process on the machine, among them another test worker's cluster, whose driver
    (that pytest worker) Ray's core worker then ends without a word."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # a throwaway cluster on loopback: no token authentication, for it or for this driver
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    address = f"127.0.0.1:{port}"
    log = tempfile.TemporaryFile()  # not a pipe: a blocked head would fill it and stall
    head = subprocess.Popen(
        [
            ray_cli(),
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=4",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        _wait_until_up(head, address, env, log)
        yield address
    finally:
        _stop(head)
        log.close()
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved


def _wait_until_up(head: subprocess.Popen, address: str, env: dict[str, str], log: Any) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if head.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"ray start exited with {head.returncode}: {log.read().decode()[-2000:]}")
        status = subprocess.run([ray_cli(), "status", f"--address={address}"], capture_output=True, env=env)
        if status.returncode == 0:
            return
        time.sleep(1)
    raise RuntimeError(f"the Ray head node at {address} did not come up within {START_TIMEOUT_S} s")


def _stop(head: subprocess.Popen) -> None:
    """SIGTERM to the head's process group (raylet, GCS, agents; the workers share their raylet's fate), then
    SIGKILL to what is left."""
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            return
        try:
            head.wait(wait_s)
            time.sleep(0.5)  # its children exit just after it
        except subprocess.TimeoutExpired:
            continue
        try:
            os.killpg(head.pid, 0)  # anything of the group still running?
        except ProcessLookupError:
            return
