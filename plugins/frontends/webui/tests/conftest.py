"""Live ``llmp serve --frontend webui`` processes and a headless browser for the page tests.

* ``server``: the default model (SmolLM2-135M, packaged) under two served names, for real replies
  (a tiny random Llama where the default model is not installed, as in a plugin's own venv).
* ``key_server``: a tiny random Llama behind ``--api-key``, mounted under ``--root-path /llm``.
* ``reasoning_server``: ``--reasoning-parser deepseek_r1`` on a tiny Llama whose weights make it write
  reasoning, ``</think>`` and an answer (``save_reasoning_llama``), so replies carry real reasoning.
* ``browser``: headless Debian chromium; the tests using it skip, saying why, without one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for webui_frontend_support (tests import it too)

from webui_frontend_support import (
    API_KEY,
    MODEL_NAMES,
    default_model_installed,
    missing_browser,
    save_reasoning_llama,
    start_browser,
)

from llmp.testing import LiveServer, save_tiny_llama, serving


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path)
    return path


def _serve(model: Path | None, *args: str) -> Iterator[LiveServer]:
    with serving(model, *args) as live:
        yield live
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[LiveServer]:
    model = None if default_model_installed() else tiny_model
    names = [arg for name in MODEL_NAMES for arg in ("--served-model-name", name)]
    yield from _serve(model, "--frontend", "webui", *names)


@pytest.fixture(scope="module")
def key_server(tiny_model: Path) -> Iterator[LiveServer]:
    yield from _serve(tiny_model, "--frontend", "webui", "--api-key", API_KEY, "--root-path", "/llm")


@pytest.fixture(scope="module")
def reasoning_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # the parser is another distribution: on its own (CI's isolation run) this test waits for the main pass
    pytest.importorskip("llmp_parsers_reasoning", reason="the reasoning parsers (llmp-parsers-reasoning) aren't here")
    model = tmp_path_factory.mktemp("reasoning-llama")
    save_reasoning_llama(model)
    parser = ("--reasoning-parser", "deepseek_r1")
    yield from _serve(model, "--frontend", "webui", *parser, "--served-model-name", "thinker")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    reason = missing_browser()
    if reason:
        pytest.skip(reason)
    driver = start_browser()
    try:
        yield driver
    finally:
        driver.quit()
