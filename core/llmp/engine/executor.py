"""The ``uniproc`` executor: the model runs in the engine's own process.

An executor owns the model workers. The engine prepares each step's inputs
(``prepare_inputs``, with the rows' sampling parameters); the workers run the
forward pass and rank 0 samples on the model's device, so an executor only
loads the model, holds the KV cache and carries steps and their tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from llmp.api import ResolvedModel
from llmp.engine.model_runner import ModelRunnerOutput, StepInputs
from llmp.engine.worker import Worker, raise_rpc_failures, rpc_outcome
from llmp.options import EngineConfig


class UniprocExecutor:
    def __init__(self, config: EngineConfig, model: ResolvedModel) -> None:
        if config.tensor_parallel_size != 1:
            raise ValueError(
                f"the uniproc executor runs one rank, not {config.tensor_parallel_size}; "
                "use the mp or ray executor for tensor parallelism"
            )
        self.worker = Worker(config, model)  # in this process: no group to join
        self.runner = self.worker.runner
        self.kernels_name = self.runner.kernels_spec.name
        self.kernels_isa_path = self.runner.isa_path
        self.load_seconds = self.runner.load_seconds

    def bytes_per_block(self) -> int:
        return self.runner.bytes_per_block()

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.runner.allocate_kv_cache(num_blocks)

    def execute_model(self, inputs: StepInputs) -> ModelRunnerOutput:
        return self.worker.execute_model(inputs)

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        # in this process a call cannot be interrupted: one that overran its timeout is reported as such
        started = time.monotonic()
        results = raise_rpc_failures(method, [rpc_outcome(self.worker, method, args, kwargs)])
        if timeout is not None and time.monotonic() - started > timeout:
            raise TimeoutError(f"collective_rpc {method!r} took longer than {timeout:g} s (its result is dropped)")
        return results

    def check_health(self) -> None:
        """In-process: if the engine runs, the model does."""

    def shutdown(self) -> None:
        """Nothing to stop."""
