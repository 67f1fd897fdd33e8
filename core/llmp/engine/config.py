"""Everything an engine is built from, as one plain record.

Fields declared with ``option`` are also the engine options of ``llmp serve``,
``llmp bench throughput``/``latency`` and ``llmp mcp`` (generated from this record);
the others are set by programs and plugins only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from llmp.options import option


@dataclass(kw_only=True)
class EngineConfig:
    model: str | None = option(
        None,
        "Model directory, .gguf file or Hugging Face id in the local cache; default SmolLM2-135M-Instruct.",
        argument=True,
    )
    tokenizer: str | None = None  # defaults to the model's directory
    device: str = option("cpu", "Device the model runs on: cpu or cuda.")
    executor: str = option("uniproc", "Executor plugin: uniproc, mp or ray.")
    tensor_parallel_size: int = option(1, "Tensor-parallel workers.", short="-tp")
    ray_address: str | None = option(None, "Ray cluster for --executor ray (default: RAY_ADDRESS).")
    dtype: str = option("auto", "auto, bfloat16, float16 or float32.")
    max_model_len: int | None = option(None, "Context length (default: the model's, capped by the KV cache).")
    max_num_seqs: int = option(256, "Most sequences in one step.")
    max_num_batched_tokens: int = option(2048, "Most tokens in one step.")
    scheduling_policy: str = option("fcfs", "fcfs (arrival order) or priority (a request's priority, lower first).")
    enable_prefix_caching: bool = option(True, "Reuse the KV cache of a shared prompt prefix.")
    enable_chunked_prefill: bool = option(True, "Split long prompts over several steps.")
    kv_cache_memory_bytes: int = option(
        4 << 30, "Memory for the KV cache, in GiB.", name="kv_cache_memory_gib", scale=1 << 30, gt=0
    )
    num_kv_blocks: int | None = None  # overrides kv_cache_memory_bytes
    block_size: int = option(16, "Tokens per KV-cache block.")
    kernels: str | None = option(None, "Kernel set (default: the best for the device).")
    model_impl: str = option(
        "auto", "auto (native when a plugin provides the architecture, else transformers), native or transformers."
    )
    task: str = option("auto", "auto, generate or embed (serve a causal LM's pooled hidden states on /v1/embeddings).")
    num_threads: int | None = option(None, "Torch threads of the engine (default: all cores).")
    seed: int = option(0, "Engine seed for requests without one.")
    scheduler: str = "default"  # scheduler plugin
    kv_manager: str = "default"  # KV-cache manager plugin
    worker_timeout_s: float = 300.0  # a worker silent this long in a step is taken for dead
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError(f"dtype must be auto, bfloat16, float16 or float32, got {self.dtype!r}")
        if self.task not in ("auto", "generate", "embed"):
            raise ValueError(f"task must be auto, generate or embed, got {self.task!r}")
        for name in ("block_size", "tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes must be > 0, got {self.kv_cache_memory_bytes}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")

    def keywords(self) -> dict[str, Any]:
        """This config as ``LLM``/``AsyncLLM`` keywords, the model aside: ``AsyncLLM(model, **config.keywords())``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "model"}
