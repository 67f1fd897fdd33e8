"""The reliability and security suite: live ``llmp serve`` processes on a tiny random Llama.

* ``tiny_model``: a random Llama with 2048 positions (long prompts and long generations both fit),
  saved once per session.
* ``main_server``: that model with ``--max-num-seqs 1`` (one request runs, the rest queue) and
  ``--max-num-batched-tokens 16`` (a 2000-token prompt takes over a hundred prefill steps), shared by
  the disconnect, storm and request-validation tests. A slow-header (slowloris) probe starts with it.

Other servers are started by the modules that need their flags, or by the test that takes its
server down.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for reliability_support

from reliability_support import SlowHeaderProbe

from llmp.testing import LiveServer, save_tiny_llama, serving


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reliability-tiny-llama")
    save_tiny_llama(path, max_position_embeddings=2048)
    return path


@pytest.fixture(scope="session")
def main_server(tiny_model: Path) -> Iterator[LiveServer]:
    with serving(tiny_model, "--dtype", "float32", "--max-num-seqs", "1", "--max-num-batched-tokens", "16") as live:
        probe = SlowHeaderProbe(live.port)
        probe.start()
        live.slow_header_probe = probe  # type: ignore[attr-defined]
        yield live
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()[-5000:]}"
