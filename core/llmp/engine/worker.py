"""One rank of a tensor-parallel executor: joins the group, loads its slice of the model,
runs forward passes. The ``mp`` executor runs it in a process, the ``ray`` executor in an actor,
the ``uniproc`` executor in the engine's own process."""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llmp.api import EngineSleepingError, LLMPError, ResolvedModel
from llmp.options import EngineConfig


class Worker:
    """``init_method=None``: the one rank of the engine's own process (``uniproc``), which joins no
    group and leaves the process's torch settings (threads, seed) as the engine set them."""

    def __init__(
        self,
        config: EngineConfig,
        model: ResolvedModel,
        rank: int = 0,
        world_size: int = 1,
        init_method: str | None = None,
    ) -> None:
        from llmp.engine.model_runner import ModelRunner

        if init_method is not None:
            import dataclasses

            import torch

            from llmp import plugins
            from llmp.engine.device import rank_device
            from llmp.modeling.parallel import init_tensor_parallel
            from llmp.progress import configure_logging

            configure_logging()  # a rank in its own process reports loading as the engine process does
            threads = config.num_threads or max(1, (os.cpu_count() or 1) // world_size)
            torch.set_num_threads(threads)
            torch.manual_seed(config.seed)  # as vLLM seeds each worker: anything random in a rank repeats per run
            config = dataclasses.replace(config, device=rank_device(config.device, rank, world_size))
            on_gpu = config.device.startswith("cuda")
            if on_gpu:  # NCCL binds a rank to the current device
                torch.cuda.set_device(config.device)
            init_tensor_parallel(rank, world_size, init_method, backend="nccl" if on_gpu else "gloo")
            plugins.load_plugins()  # the kernel sets; the model was selected once, by the caller
        from llmp.engine.sampler import Sampler

        self.config = config
        self.rank = rank
        self.runner = ModelRunner(config, model)
        # rank 0 samples, on the model's device: only token ids and logprobs leave the worker
        argmax = getattr(self.runner.kernels, "argmax", None)
        self.sampler = Sampler(config.seed, self.runner.device, argmax) if rank == 0 else None
        self._profiler: Any = None

    def describe(self) -> dict[str, Any]:
        """What this rank runs; works asleep too (``sleeping``: what sleep took away)."""
        return {
            "rank": self.rank,
            "kernels_name": self.runner.kernels_spec.name,
            "isa_path": self.runner.isa_path,
            "bytes_per_block": self.runner.bytes_per_block(),
            "load_seconds": self.runner.load_seconds,
            "pid": os.getpid(),
            "sleeping": sorted(self.runner.asleep),
        }

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.runner.allocate_kv_cache(num_blocks)

    def profile_memory(self) -> dict[str, int]:
        """This rank's GPU memory before the KV cache: total, used, and a largest-batch forward pass's
        activations (``ModelRunner.profile_memory``); the engine sizes the cache from every rank's."""
        return self.runner.profile_memory()

    def execute_model(self, inputs: Any) -> Any:
        """Every rank runs the forward pass (the collectives need all of them); rank 0 samples and
        returns the step's ``ModelRunnerOutput``."""
        from llmp.engine.model_runner import sample_step

        logits = self.runner.forward(inputs)
        return sample_step(self.sampler, inputs, logits) if self.sampler is not None else None

    # -- sleep and profiles (driven by the engine through Executor.collective_rpc) --------------

    def sleep(self, level: int = 1) -> None:
        """Level 1: weights to host memory (they stay put on the CPU), KV cache freed; level 2:
        weights discarded too (reloaded from the model files on wake)."""
        self.runner.sleep(level)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Bring back ``tags`` (``"weights"``, ``"kv_cache"``; None: both)."""
        self.runner.wake_up(tags)

    def start_profile(self, directory: str | None = None) -> None:
        """Start the torch profiler; its trace goes under ``directory`` (default ``profiler_dir``)."""
        import torch

        if self._profiler is not None:
            raise ValueError(f"rank {self.rank} is already profiling")
        directory = directory or self.config.profiler_dir
        if not directory:
            raise ValueError("profiling needs a trace directory: profiler_dir (--profiler-dir)")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.runner.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        Path(directory).mkdir(parents=True, exist_ok=True)
        profiler = torch.profiler.profile(activities=activities)
        profiler.start()
        self._profiler, self._profile_dir = profiler, directory

    def stop_profile(self) -> str:
        """Stop the profiler; the path of the Chrome-trace JSON file written (Perfetto opens it)."""
        if self._profiler is None:
            raise ValueError(f"rank {self.rank} is not profiling")
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        path = Path(self._profile_dir) / f"llmp-rank{self.rank}-{os.getpid()}-{time.time_ns()}.pt.trace.json"
        profiler.export_chrome_trace(str(path))
        return str(path)


def call_worker_method(
    worker: Any, method: str | Callable[..., Any], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
) -> Any:
    """What ``collective_rpc`` runs on one rank: the worker's public method named ``method``, or a
    function called as ``method(worker, *args, **kwargs)``. A private or unknown name is a ``ValueError``."""
    if callable(method):
        return method(worker, *args, **(kwargs or {}))
    if not isinstance(method, str) or not method.isidentifier() or method.startswith("_"):
        raise ValueError(f"collective_rpc calls a public worker method by name, not {method!r}")
    function = getattr(worker, method, None)
    if not inspect.isroutine(function):  # a method, not a callable attribute (the sampler)
        public = sorted(n for n in dir(worker) if not n.startswith("_") and inspect.isroutine(getattr(worker, n, None)))
        raise ValueError(f"the worker has no method {method!r}; it has {', '.join(public)}")
    return function(*args, **(kwargs or {}))


class WorkerCallError(LLMPError):
    """A worker method failed for a reason other than its arguments (a model that no longer loads,
    a device error): a server error (HTTP 500), unlike a ``ValueError``/``TypeError`` (400)."""

    def __init__(self, message: str, *, method: str = "", rank: int = 0, detail: str = "") -> None:
        super().__init__(message)
        self.method, self.rank, self.detail = method, rank, detail


# the failures of a call that are the caller's fault (bad method name, arguments, state)
_BAD_ARGUMENT_FAILURES = ("ValueError", "TypeError")


def rpc_outcome(worker: Any, method: Any, args: Sequence[Any], kwargs: dict[str, Any] | None) -> tuple[bool, Any]:
    """``(True, result)`` or ``(False, "Type: message")``: a failed call is reported, never the end of a rank."""
    try:
        return True, call_worker_method(worker, method, args, kwargs)
    except AttributeError as exc:
        if "weights" in getattr(getattr(worker, "runner", None), "asleep", ()):  # level 2: no model to call
            name = method if isinstance(method, str) else getattr(method, "__name__", "the function")
            return False, (
                f"EngineSleepingError: {name} needs the model, whose weights are not loaded while the engine "
                "sleeps: wake it up first (POST /wake_up, wake_up())"
            )
        return False, f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"


def raise_rpc_failures(method: Any, outcomes: Sequence[tuple[bool, Any]]) -> list[Any]:
    """The results of every rank's :func:`rpc_outcome`, or an error naming the first rank that
    failed: a ``ValueError`` when the call was refused (a ``ValueError``/``TypeError`` on the rank),
    ``EngineSleepingError`` when it needs the model of a sleeping engine, else :class:`WorkerCallError`."""
    for rank, (ok, value) in enumerate(outcomes):
        if not ok:
            name = method if isinstance(method, str) else getattr(method, "__name__", repr(method))
            message = f"collective_rpc {name!r} failed on rank {rank}: {value}"
            kind = str(value).partition(":")[0]
            if kind in _BAD_ARGUMENT_FAILURES:
                raise ValueError(message)
            if kind == "EngineSleepingError":
                raise EngineSleepingError(f"{name!r} on rank {rank}: {str(value).partition(': ')[2]}")
            raise WorkerCallError(message, method=name, rank=rank, detail=str(value))
    return [value for _, value in outcomes]
