"""llmp plugin: the ``mp`` executor (one worker process per tensor-parallel rank).

This module only registers; ``executor.py`` loads on selection.
"""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import ExecutorSpec


@hookimpl
def llmp_register_executors() -> Iterator[ExecutorSpec]:
    yield ExecutorSpec(
        name="mp",
        impl="llmp_executors_mp.executor:MultiprocExecutor",
        description=(
            "One worker process per rank; tensor parallelism over torch.distributed (gloo on CPU, nccl on CUDA)."
        ),
        distributed=True,
    )
