"""The ``ray`` executor: one Ray actor per tensor-parallel rank.

The actors run the same :class:`llmp.executor.Worker` as the ``mp``
executor's processes; Ray places them (a placement group of one bundle per
rank), ships each step's inputs through its object store, and reports a dead
actor as an error on the pending call. The model directory must exist at the
same path on every node.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from llmp.api import EngineDeadError, ResolvedModel
from llmp.executor import raise_rpc_failures, rpc_outcome
from llmp.options import EngineConfig

HEALTH_TIMEOUT_S = 10.0


class WorkerActor:
    """Hosts one Worker; built empty so rank 0 can name the rendezvous address first."""

    def __init__(self) -> None:
        self.worker: Any = None

    def rendezvous_address(self) -> str:
        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            return f"tcp://{ip}:{s.getsockname()[1]}"

    def start(self, config: EngineConfig, model: ResolvedModel, rank: int, world_size: int, init_method: str) -> dict:
        from llmp.executor import Worker

        self.worker = Worker(config, model, rank, world_size, init_method)
        return self.worker.describe()

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.worker, method)(*args)

    def collective_rpc(self, method: Any, args: tuple, kwargs: dict[str, Any] | None) -> tuple[bool, Any]:
        return rpc_outcome(self.worker, method, args, kwargs)  # a failing call is answered; the actor goes on

    def ping(self) -> int:
        return os.getpid()


class RayExecutor:
    def __init__(self, config: EngineConfig, model: ResolvedModel) -> None:
        self.world_size = config.tensor_parallel_size
        self.timeout = config.worker_timeout_s
        self._connected = False  # True when this executor called ray.init (and so disconnects at shutdown)
        self._closed = False
        if not ray.is_initialized():
            address = config.ray_address or os.environ.get("RAY_ADDRESS")
            ray.init(
                address=address or "local",
                include_dashboard=False,
                log_to_driver=False,
                **({} if address else {"num_cpus": max(os.cpu_count() or 1, self.world_size)}),
            )
            self._connected = True
        device = "GPU" if config.device.startswith("cuda") else "CPU"
        self.group = placement_group([{device: 1}] * self.world_size, strategy="PACK")
        try:
            ray.get(self.group.ready(), timeout=max(self.timeout, 60))
        except GetTimeoutError:
            self.shutdown()
            raise EngineDeadError(
                f"the Ray cluster cannot place {self.world_size} workers needing one {device} each"
            ) from None
        # the bundle reserves the CPU or GPU; the actor itself asks for nothing more
        actor_cls = ray.remote(num_cpus=0, num_gpus=1 if device == "GPU" else 0)(WorkerActor)
        self.actors = [
            actor_cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, bundle_index)).remote()
            for bundle_index in range(self.world_size)
        ]
        try:
            init_method = self._get(self.actors[0].rendezvous_address.remote(), HEALTH_TIMEOUT_S * 6)
            described = self._get(
                [
                    a.start.remote(config, model, rank, self.world_size, init_method)
                    for rank, a in enumerate(self.actors)
                ],
                max(self.timeout, 600),
            )
        except EngineDeadError:
            self.shutdown()
            raise
        first = described[0]
        self.kernels_name = first["kernels_name"]
        self.kernels_isa_path = first["isa_path"]
        self.load_seconds = max(d["load_seconds"] for d in described)
        self._bytes_per_block = first["bytes_per_block"]
        self.worker_pids = [d["pid"] for d in described]

    def _get(self, refs: Any, timeout: float | None = None) -> Any:
        if self._closed:
            raise EngineDeadError("the ray executor has been shut down")
        try:
            return ray.get(refs, timeout=timeout or self.timeout)
        except GetTimeoutError:
            raise EngineDeadError(f"Ray workers did not answer within {timeout or self.timeout:.0f} s") from None
        except RayError as exc:
            raise EngineDeadError(f"a Ray worker failed: {type(exc).__name__}: {exc}") from exc

    def _call_all(self, method: str, *args: Any) -> list[Any]:
        return self._get([actor.call.remote(method, *args) for actor in self.actors])

    def bytes_per_block(self) -> int:
        return self._bytes_per_block

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self._call_all("allocate_kv_cache", num_blocks)

    def execute_model(self, inputs: Any) -> Any:
        shared = ray.put(inputs)  # one copy in the object store, read by every rank
        return self._call_all("execute_model", shared)[0]

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        if self._closed:
            raise EngineDeadError("the ray executor has been shut down")
        refs = [actor.collective_rpc.remote(method, tuple(args), kwargs) for actor in self.actors]
        try:  # each actor runs its calls in order, and every call has its own result: no late answer mixes in
            outcomes = ray.get(refs, timeout=timeout)
        except GetTimeoutError:
            raise TimeoutError(f"collective_rpc {method!r}: Ray workers did not answer within {timeout:g} s") from None
        except RayError as exc:
            raise EngineDeadError(f"a Ray worker failed: {type(exc).__name__}: {exc}") from exc
        return raise_rpc_failures(method, outcomes)

    def check_health(self) -> None:
        self._get([actor.ping.remote() for actor in self.actors], HEALTH_TIMEOUT_S)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for actor in getattr(self, "actors", []):
            ray.kill(actor)
        try:
            remove_placement_group(self.group)
        except Exception:  # the cluster may already be gone
            pass
        if self._connected:
            ray.shutdown()  # a local instance stops; an external cluster just loses this driver
