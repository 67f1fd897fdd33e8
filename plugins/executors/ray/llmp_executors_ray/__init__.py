"""llmp plugin: the ``ray`` executor (tensor-parallel workers as Ray actors).

This module only registers; ``executor.py`` (which imports ray) loads on selection.
"""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import ExecutorSpec


@hookimpl
def llmp_register_executors() -> Iterator[ExecutorSpec]:
    yield ExecutorSpec(
        name="ray",
        impl="llmp_executors_ray.executor:RayExecutor",
        description="Workers as Ray actors, across machines; joins the cluster at ray_address "
        "(or RAY_ADDRESS), else starts a local one.",
        distributed=True,
    )
