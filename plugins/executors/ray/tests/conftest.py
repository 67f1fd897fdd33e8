"""One Ray cluster for every test of this folder: a head node on 127.0.0.1 with 4 CPUs."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest


def ray_cli() -> str:
    return shutil.which("ray", path=os.path.dirname(sys.executable)) or "ray"


@pytest.fixture(scope="session")
def cluster() -> Iterator[str]:
    """The cluster's address; torn down after the session."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # a throwaway cluster on loopback: no token authentication, for it or for this driver
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run(
        [
            ray_cli(),
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=4",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        check=True,
        capture_output=True,
        env=env,
        timeout=120,
    )
    yield f"127.0.0.1:{port}"
    subprocess.run([ray_cli(), "stop", "--force"], capture_output=True, timeout=120, env=env)
    if saved is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = saved
