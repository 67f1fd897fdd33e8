"""Everything an engine is built from, as one plain record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True)
class EngineConfig:
    model: str | None = None  # directory, .gguf file or packaged name; None = the default model
    tokenizer: str | None = None  # defaults to the model's directory
    dtype: str = "auto"  # auto | bfloat16 | float16 | float32
    device: str = "cpu"
    max_model_len: int | None = None  # defaults to the model's context, capped by the KV pool
    block_size: int = 16
    num_kv_blocks: int | None = None  # overrides kv_cache_memory_bytes
    kv_cache_memory_bytes: int = 4 << 30
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    scheduling_policy: str = "fcfs"
    seed: int = 0
    kernels: str | None = None  # a kernel-set name; None = best for the device
    scheduler: str = "default"
    kv_manager: str = "default"
    executor: str = "uniproc"  # uniproc | mp | ray (plugins)
    tensor_parallel_size: int = 1
    ray_address: str | None = None  # the ray executor's cluster; None = RAY_ADDRESS, else a local one
    worker_timeout_s: float = 300.0  # a worker silent this long in a step is taken for dead
    model_impl: str = "auto"  # auto | native | transformers
    task: str = "auto"  # auto | generate | embed (a causal LM's hidden states pooled into embeddings)
    num_threads: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError(f"dtype must be auto, bfloat16, float16 or float32, got {self.dtype!r}")
        if self.task not in ("auto", "generate", "embed"):
            raise ValueError(f"task must be auto, generate or embed, got {self.task!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
