"""Live ``llmp serve`` processes with the OpenAI and gRPC front-ends side by side, on a tiny random
Llama (vocab 512, context 512). Each test module starts its own server (a module-scoped fixture
over ``grpc_frontend_support.grpc_server``): the answers of the two front-ends to the same request
are compared exactly.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for grpc_frontend_support (the tests import it)

from llmp.testing import save_tiny_llama


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path)
    return path
