"""Tensor-parallel state of this process and its collectives.

Each worker of a tensor-parallel executor calls :func:`init_tensor_parallel`
once; models then read :func:`tp_rank` / :func:`tp_size` while building their
layers. With one rank every collective is a no-op, so models have one code path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["all_gather", "all_reduce", "divide", "init_tensor_parallel", "tp_rank", "tp_size"]


@dataclass
class _TensorParallel:
    rank: int = 0
    size: int = 1


_state = _TensorParallel()


def init_tensor_parallel(rank: int, size: int, init_method: str, backend: str | None = None) -> None:
    """Join the process group of ``size`` ranks: ``backend`` (the worker's: nccl for a rank on a GPU,
    gloo on the CPU), else nccl when torch sees a GPU."""
    if size > 1:
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size)
    _state.rank, _state.size = rank, size


def tp_rank() -> int:
    return _state.rank


def tp_size() -> int:
    return _state.size


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum over ranks, in place."""
    if _state.size > 1:
        dist.all_reduce(x)
    return x


def all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim``, in rank order."""
    if _state.size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_state.size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=dim)


def divide(total: int, parts: int, what: str) -> int:
    if total % parts:
        raise ValueError(f"{what} ({total}) is not divisible by the tensor-parallel size ({parts})")
    return total // parts
