"""One rank of a tensor-parallel executor: joins the group, loads its slice of the model,
runs forward passes. The ``mp`` executor runs it in a process, the ``ray`` executor in an actor."""

from __future__ import annotations

import os
from typing import Any

from llmp.api import ResolvedModel
from llmp.options import EngineConfig


class Worker:
    def __init__(
        self, config: EngineConfig, model: ResolvedModel, rank: int, world_size: int, init_method: str
    ) -> None:
        import torch

        from llmp import plugins
        from llmp.engine.model_runner import ModelRunner
        from llmp.modeling.parallel import init_tensor_parallel
        from llmp.progress import configure_logging

        configure_logging()  # a rank in its own process reports loading as the engine process does
        threads = config.num_threads or max(1, (os.cpu_count() or 1) // world_size)
        torch.set_num_threads(threads)
        torch.manual_seed(config.seed)  # as vLLM seeds each worker: anything random in a rank repeats per run
        init_tensor_parallel(rank, world_size, init_method)
        plugins.load_plugins()  # the kernel sets; the model was selected once, by the caller
        self.rank = rank
        self.runner = ModelRunner(config, model)

    def describe(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "kernels_name": self.runner.kernels_spec.name,
            "bytes_per_block": self.runner.bytes_per_block(),
            "load_seconds": self.runner.load_seconds,
            "pid": os.getpid(),
        }

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.runner.allocate_kv_cache(num_blocks)

    def execute_model(self, inputs: Any) -> Any:
        """Every rank runs the step (the collectives need all of them); rank 0 returns the logits."""
        out = self.runner.forward(inputs)
        return out if self.rank == 0 else None
