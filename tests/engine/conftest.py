"""Every engine test runs on each device present: ``cpu``, and ``cuda`` when torch sees a GPU.

An ``LLM`` or ``AsyncLLM`` a test builds without naming a device gets the one of the test's
parameter (``device="auto"`` would put every test on the GPU alone there, never on the CPU). A
module-scoped engine is built once, with the first parameter's device."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from llmp.async_llm import AsyncLLM
from llmp.llm import LLM

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def _defaulting_device(init: Any, device: str) -> Any:
    def init_on_device(self: Any, *args: Any, **options: Any) -> None:
        options.setdefault("device", device)
        init(self, *args, **options)

    return init_on_device


@pytest.fixture(autouse=True, params=DEVICES)
def engine_device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for cls in (LLM, AsyncLLM):
        monkeypatch.setattr(cls, "__init__", _defaulting_device(cls.__init__, request.param))
    yield request.param
