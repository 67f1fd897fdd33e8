"""Where an engine runs: ``--device`` resolved once (in the engine's process, before anything is
loaded), with the one-line refusals a GPU needs, and each tensor-parallel rank's own device."""

from __future__ import annotations

from llmp.api import DeviceError


def resolve_device(requested: str, dtype: str) -> str:
    """``"cpu"`` or ``"cuda:N"`` for ``requested`` (auto, cpu, cuda, cuda:N; auto is CUDA when torch
    sees a GPU). ``DeviceError`` (one line) for CUDA without a usable GPU, an index the machine lacks,
    or bfloat16 on a GPU without it."""
    import torch

    name, _, index = requested.partition(":")
    if name == "cpu" or name == "auto" and not torch.cuda.is_available():
        return "cpu"
    if not torch.cuda.is_available():
        reason = "torch is a CPU build" if torch.version.cuda is None else "torch sees no CUDA device"
        raise DeviceError(f"--device {requested}: no usable GPU ({reason}); use --device cpu")
    count = torch.cuda.device_count()
    number = int(index) if index else torch.cuda.current_device()
    if number >= count:
        raise DeviceError(f"--device {requested}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    major, minor = torch.cuda.get_device_capability(number)
    if dtype == "bfloat16" and major < 8:
        gpu = torch.cuda.get_device_name(number)
        raise DeviceError(f"{gpu} (sm_{major}{minor}) has no bfloat16: use --dtype float16")
    return f"cuda:{number}"


def rank_device(device: str, rank: int, world_size: int) -> str:
    """The device of tensor-parallel rank ``rank`` when the engine's is ``device`` (resolved): on CUDA
    the rank-th GPU from it, among those the rank's process sees; a process shown one GPU (a Ray
    actor: Ray sets ``CUDA_VISIBLE_DEVICES``) uses that one."""
    if not device.startswith("cuda"):
        return device
    import torch

    count = torch.cuda.device_count()
    if count == 1:
        return "cuda:0"
    first = int(device.partition(":")[2] or 0)
    if first + world_size > count:
        raise DeviceError(
            f"tensor parallelism over {world_size} GPUs from {device} needs cuda:{first} to "
            f"cuda:{first + world_size - 1}; this machine has {count}"
        )
    return f"cuda:{first + rank}"


def cuda_memory(device: str) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device, as the driver reports them (other processes' use included)."""
    import torch

    return torch.cuda.mem_get_info(device)


def kv_cache_blocks(total: int, used: int, activations: int, utilization: float, per_block: int) -> int:
    """KV-cache blocks a GPU holds: ``utilization`` of its ``total`` bytes, less what is ``used``
    before the cache (weights, the CUDA context, other processes) and the ``activations`` peak of a
    forward pass at the largest batch. ``DeviceError`` when no block fits (the model does not fit)."""
    budget = int(total * utilization)
    left = budget - used - activations
    if left < per_block:
        gib = 1 << 30
        raise DeviceError(
            f"the model does not fit: {used / gib:.2f} GiB in use after loading and {activations / gib:.2f} GiB of "
            f"activations leave no room for the KV cache in {utilization:g} of {total / gib:.2f} GiB "
            "(raise --gpu-memory-utilization, lower --max-num-batched-tokens, or use more GPUs with "
            "--tensor-parallel-size)"
        )
    return left // per_block
