"""Loads the model, owns the KV cache and runs one scheduled step.

A step is one forward pass over the flattened new tokens of every scheduled
request (prefill chunks and decodes alike), followed by one sampler call over
the rows whose sequence is complete. Pooling requests in the same step are
pooled from the same hidden states (``StepInputs.pool_items``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from llmp import registry
from llmp.api import AttentionMetadata, DeviceError, PacksLinear, ResolvedModel
from llmp.engine.decode_graphs import DecodeGraphs, default_graph_sizes
from llmp.engine.sampler import Sampler, SamplingBatch, TokenLogprobs, batch_logprobs
from llmp.engine.scheduler import SchedulerOutput
from llmp.model_files.resolve import resolve_kv_cache_dtype
from llmp.model_files.weights import iter_weights
from llmp.modeling.decoder import as_pooling_model
from llmp.modeling.layers import QuantizedLayers, pack_quantized_layers
from llmp.modeling.pooling import POOLERS, PoolSlice
from llmp.options import EngineConfig
from llmp.progress import human_bytes, kernels_isa_path

log = logging.getLogger("llmp.engine")

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(slots=True)
class ModelRunnerOutput:
    """What a step sends back to the engine (rank 0): tokens and logprobs, never logits."""

    sampled: list[int | None]  # per scheduled request; None for a partial prefill chunk or a pooling request
    logprobs: list[TokenLogprobs | None]
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)  # request id -> new positions
    pooled: list[torch.Tensor] = field(default_factory=list)  # per StepInputs.pool_items (StepLogits.pooled)


def _log_weights(model: Any, quantized: QuantizedLayers, kernels: str, dtype: torch.dtype) -> None:
    """One line (first rank) of the weights' resident size and, for quantised ones, which are computed in their
    blocks by the kernel set and which were dequantised."""
    from llmp.modeling.parallel import tp_rank

    if tp_rank() != 0:
        return
    params = {id(p): p for p in model.parameters()}.values()  # a tied head counted once
    resident = human_bytes(sum(p.nbytes for p in params) + quantized.nbytes)
    if not quantized.counts:
        log.info("weights: %s resident", resident)
        return
    counts = sorted(quantized.counts.items())
    kept = ", ".join(f"{n} {fmt}" for (fmt, in_blocks), n in counts if in_blocks)
    dense = ", ".join(f"{n} {fmt}" for (fmt, in_blocks), n in counts if not in_blocks)
    parts = [f"{kept} computed in their blocks by kernel set {kernels!r}"] if kept else []
    if dense:
        dtype_name = str(dtype).removeprefix("torch.")
        parts.append(f"{dense} dequantised to {dtype_name} (kernel set {kernels!r} does not compute them)")
    log.info("weights: %s resident; quantised: %s", resident, "; ".join(parts))


class ModelRunner:
    def __init__(self, config: EngineConfig, resolved: ResolvedModel) -> None:
        self.config = config
        self.device = torch.device(config.device)
        if self.device.type == "cuda":  # kernels launch on the current device
            torch.cuda.set_device(self.device)
        self.dtype = TORCH_DTYPES[resolved.dtype]
        self.kv_dtype = TORCH_DTYPES[resolve_kv_cache_dtype(config.kv_cache_dtype, resolved.dtype)]
        started = time.perf_counter()
        self.kernels_spec = registry.select_kernels(config.kernels, self.device.type)
        self.kernels = self.kernels_spec.load()()
        self.isa_path = kernels_isa_path(self.kernels, str(self.device), resolved.dtype)  # for the start-up line
        model_cls = as_pooling_model(resolved.spec.load(), resolved.task)
        try:
            self.model = self._load_model(model_cls, resolved)
        except torch.OutOfMemoryError:  # a GPU's (the CPU's allocator raises no such error)
            import gc

            gc.collect()  # the half-loaded model goes, so the free memory reads as it was
            torch.cuda.empty_cache()
            free, total = torch.cuda.mem_get_info(self.device)
            raise DeviceError(
                f"the model does not fit: its weights in {resolved.dtype} need more than the {human_bytes(free)} free "
                f"of {human_bytes(total)} on {self.device} (use more GPUs with --tensor-parallel-size, or a "
                "quantised model)"
            ) from None
        self.lora = self._install_lora() if config.enable_lora else None
        self.accepts_token_type_ids = bool(getattr(self.model, "accepts_token_type_ids", False))
        self.accepts_output_rows = bool(getattr(self.model, "accepts_output_rows", False))
        self.load_seconds = time.perf_counter() - started
        self.block_size = config.block_size
        self.resolved_context_len = resolved.context_len
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.kv_shapes: list[tuple[int, int, int, int]] = []
        self.resolved = resolved
        self.asleep: set[str] = set()  # what sleep() took away: "weights", "kv_cache"
        self.graphs = self._decode_graphs()

    def _load_model(self, model_cls: Any, resolved: ResolvedModel) -> Any:
        if resolved.spec.model_impl == "native":
            hf_config = resolved.config
        else:  # transformers' model classes take transformers' own config object
            from llmp.model_files.config import transformers_config

            hf_config = transformers_config(resolved.model_dir, resolved.hf_overrides)
        if hasattr(model_cls, "load_pretrained"):  # a model that reads its own files (the transformers fallback)
            loaded = model_cls.load_pretrained(resolved.model_dir, hf_config, self.kernels, self.dtype, self.device)
            return loaded.eval()
        with torch.device("meta"):
            model = model_cls(hf_config, self.kernels)
        # what Module.to_empty does, with torch.empty: empty_like of a meta tensor goes through
        # torch._refs, whose first use imports sympy (a third of a second of start-up)
        model = model.to(dtype=self.dtype)._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=self.device))
        if hasattr(model, "tie_weights"):
            model.tie_weights()
        model.load_weights(iter_weights(resolved.model_dir, quantized=getattr(model, "keeps_quantized_weights", False)))
        quantized = pack_quantized_layers(model, self.kernels, self.dtype)
        _log_weights(model, quantized, self.kernels_spec.name, self.dtype)
        if isinstance(self.kernels, PacksLinear):
            from llmp.modeling.decoder import pack_decoder_layers
            from llmp.modeling.layers import pack_linear_layers

            pack_linear_layers(model, self.kernels)
            pack_decoder_layers(model, self.kernels)
        return model.eval()

    def _decode_graphs(self) -> DecodeGraphs | None:
        """CUDA graphs of decode steps on a GPU, TorchScript traces of them on the CPU when the kernel set is
        ``traceable_decode`` (neither with --enforce-eager or LoRA, whose slots change per step);
        ``extra["static_decode_buffers"]`` runs the padded buffers eagerly on any device (the CPU tests of
        that padding)."""
        config = self.config
        if self.resolved.task != "generate":  # pooling steps never take the decode path
            return None
        replay = not config.enforce_eager and self.lora is None
        capture = self.device.type == "cuda" and replay
        padded = bool(config.extra.get("static_decode_buffers"))
        traceable = bool(getattr(self.kernels, "traceable_decode", False)) and _traceable(self.model)
        # one rank: the tracer records no collective, so a rank would skip its all-reduce
        single = config.tensor_parallel_size == 1
        trace = self.device.type == "cpu" and replay and traceable and single and not padded
        static = capture or trace or padded
        if not static or not hasattr(self.model, "attention_layers"):
            return None
        if trace:  # exact sizes, up to the largest batch: one trace runs them all where it holds at any size
            sizes = list(range(1, config.max_num_seqs + 1))
        else:
            sizes = list(config.cuda_graph_sizes) or default_graph_sizes(config.max_num_seqs)
        max_len = config.max_model_len or self.resolved_context_len
        return DecodeGraphs(self.model, sizes, max_len, config.block_size, self.device, capture, trace=trace)

    def _install_lora(self) -> Any:
        """The model's LoRA-adapted layers with empty slots (``llmp.modeling.lora.LoRAModelState``)."""
        from llmp.modeling.lora import install_lora

        config = self.config
        return install_lora(
            self.model,
            self.kernels,
            max_loras=config.max_loras,
            max_rank=config.max_lora_rank,
            dtype=self.dtype,
            device=self.device,
        )

    # -- KV cache --------------------------------------------------------

    def bytes_per_block(self) -> int:
        """Bytes of one KV-cache block over every attention layer (known asleep too: from the cache's shapes)."""
        if self.model is None:  # level-2 sleep: the shapes the cache was allocated with
            per_token = sum(2 * heads * dim for _, _, heads, dim in self.kv_shapes)
            return per_token * self.block_size * self.kv_dtype.itemsize
        layers = self.model.attention_layers()
        per_token = sum(2 * layer.num_kv_heads * layer.head_dim for layer in layers)
        return per_token * self.block_size * self.kv_dtype.itemsize

    def allocate_kv_cache(self, num_blocks: int) -> None:  # nothing for models without paged attention
        """One (k, v) pair of ``[num_blocks, block_size, kv_heads, head_dim]`` per attention layer, allocated once."""
        self.kv_shapes = [
            (num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim) for layer in self.model.attention_layers()
        ]
        self._build_kv_cache()
        self._capture_graphs()

    def _capture_graphs(self) -> None:
        if self.graphs is not None and self.kv_caches and not self.asleep:
            self.graphs.model = self.model
            self.graphs.capture()

    def _build_kv_cache(self) -> None:
        # torch.empty: untouched pages cost nothing; kernels read only slots they wrote
        self.kv_caches = [
            (
                torch.empty(shape, dtype=self.kv_dtype, device=self.device),
                torch.empty(shape, dtype=self.kv_dtype, device=self.device),
            )
            for shape in self.kv_shapes
        ]
        if self.model is not None:
            self._bind_kv_cache()

    def _bind_kv_cache(self) -> None:
        for layer, cache in zip(self.model.attention_layers(), self.kv_caches, strict=True):
            layer.kv_cache = cache

    def profile_memory(self) -> dict[str, int]:
        """Bytes of the device's memory: ``total``, ``used`` now (weights, the CUDA context and other
        processes; before any KV cache) and ``activations``, the peak a forward pass at the largest
        batch adds (:meth:`run_largest_batch`, its temporary cache not counted). CUDA only: on the
        CPU the KV cache's size is given (kv_cache_memory_bytes)."""
        device = self.device
        if device.type != "cuda":
            raise ValueError("memory profiles measure a CUDA device; on the CPU the KV cache's size is given")
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        cache_bytes = self.run_largest_batch()
        torch.cuda.synchronize(device)
        activations = torch.cuda.max_memory_allocated(device) - before - cache_bytes
        torch.cuda.empty_cache()
        return {"total": total, "used": total - free, "activations": max(activations, 0)}

    @torch.inference_mode()
    def run_largest_batch(self) -> int:
        """One forward pass (and the logits of each sequence's last row, in float32 as the sampler
        takes them) at the step the scheduler may build at its largest: ``max_num_batched_tokens``
        tokens over up to ``max_num_seqs`` sequences, on a temporary KV cache just large enough
        (freed after). Returns that cache's bytes."""
        config, size = self.config, self.block_size
        longest = config.max_model_len or self.resolved_context_len
        tokens = max(1, min(config.max_num_batched_tokens, config.max_num_seqs * longest))
        seqs = max(1, min(config.max_num_seqs, tokens), -(-tokens // longest))
        lengths = [tokens // seqs + (i < tokens % seqs) for i in range(seqs)]
        blocks_per_seq = -(-max(lengths) // size)
        saved = self.kv_shapes, self.kv_caches  # the real cache, when there is one already, comes back after
        self.kv_shapes = [
            (seqs * blocks_per_seq, size, layer.num_kv_heads, layer.head_dim) for layer in self.model.attention_layers()
        ]
        self._build_kv_cache()  # no graphs captured on it
        cache_bytes = self.bytes_per_block() * seqs * blocks_per_seq
        try:
            starts = np.cumsum([0, *lengths])
            positions = np.concatenate([np.arange(n) for n in lengths])
            tables = np.arange(seqs * blocks_per_seq, dtype=np.int32).reshape(seqs, blocks_per_seq)
            seq_of_row = np.repeat(np.arange(seqs), lengths)
            slots = tables[seq_of_row, positions // size].astype(np.int64) * size + positions % size
            metadata = AttentionMetadata(
                query_start_loc=torch.tensor(starts, dtype=torch.int32),
                seq_lens=torch.tensor(lengths, dtype=torch.int32),
                block_tables=torch.from_numpy(tables),
                slot_mapping=torch.from_numpy(slots),
                max_query_len=max(lengths),
                max_seq_len=max(lengths),
            )
            # logits for a generating model only: a pooling model's head runs in the pooler
            last_rows = (starts[1:] - 1).tolist() if self.resolved.task == "generate" else []
            inputs = StepInputs(
                torch.zeros(tokens, dtype=torch.long), torch.from_numpy(positions), metadata, last_rows, []
            )
            step = self.forward(inputs)
            if step.logits is not None:
                step.logits.float().softmax(-1)
        finally:
            self.kv_shapes, self.kv_caches = saved
            if self.kv_caches:
                self._bind_kv_cache()
            else:
                for layer in self.model.attention_layers():
                    layer.kv_cache = None
        return cache_bytes

    # -- sleep -----------------------------------------------------------

    def sleep(self, level: int) -> None:
        """Level 1: the weights go to host memory (on the CPU they stay where they are) and the KV
        cache is freed; level 2: the weights are discarded too, to be loaded again on wake."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level!r}")
        if self.asleep:
            return
        for layer in self.model.attention_layers():
            layer.kv_cache = None
        self.kv_caches = []
        if self.graphs is not None:  # they point at the cache and the weights going away
            self.graphs.reset()
        if level == 2:
            self.model = self.lora = None
        elif self.device.type != "cpu":
            self.model.to("cpu")
        self.asleep = {"weights", "kv_cache"}
        _release_memory(self.device, collect=level == 2)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Bring back ``tags`` of what :meth:`sleep` took (None: all): ``"weights"`` (moved back,
        or loaded again from the model files after level 2) and ``"kv_cache"`` (allocated empty)."""
        wanted = self.asleep & set(self.asleep if tags is None else tags)
        if "weights" in wanted:
            if self.model is None:  # level 2: through the normal loading code, as at start-up
                model_cls = as_pooling_model(self.resolved.spec.load(), self.resolved.task)
                self.model = self._load_model(model_cls, self.resolved)
                self.lora = self._install_lora() if self.config.enable_lora else None
            elif self.device.type != "cpu":
                self.model.to(self.device)
            if self.kv_caches:  # the cache came back first
                self._bind_kv_cache()
        if "kv_cache" in wanted:
            self._build_kv_cache()
        self.asleep -= wanted
        self._capture_graphs()

    # -- one step --------------------------------------------------------

    @torch.inference_mode()
    def forward(self, inputs: StepInputs) -> StepLogits:
        """Run the model over a step's flattened tokens; logits of the rows that need them."""
        if self.asleep:
            raise RuntimeError(f"the model runner is asleep ({', '.join(sorted(self.asleep))} not restored)")
        if self.lora is None:
            if inputs.lora is not None:
                raise RuntimeError("a step with LoRA rows reached a model runner started without enable_lora")
            return self._forward(inputs)
        if inputs.lora is not None:
            for slot, weights in inputs.lora.loads.items():
                self.lora.load(slot, weights)
        self.lora.context.set_rows(None if inputs.lora is None else inputs.lora.token_slots, self.device)
        try:
            return self._forward(inputs)
        finally:
            self.lora.context.set_rows(None, self.device)

    def _lora_rows(self, index: Any) -> AbstractContextManager[None]:
        """Run the LoRA-adapted layers on the step's rows ``index`` (the LM head on some hidden states)."""
        return nullcontext() if self.lora is None else self.lora.context.rows(index)

    def _forward(self, inputs: StepInputs) -> StepLogits:
        device = self.device
        metadata = inputs.metadata
        if device.type != "cpu":
            metadata = AttentionMetadata(
                *(getattr(metadata, f).to(device) for f in _TENSOR_FIELDS),
                metadata.max_query_len,
                metadata.max_seq_len,
                metadata.sliding_window,
            )
        input_ids = inputs.input_ids.to(device)
        extra = {}
        if self.accepts_token_type_ids:
            token_type_ids = inputs.token_type_ids
            extra["token_type_ids"] = (
                torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids.to(device)
            )
        pool_items = inputs.pool_items
        logit_rows_only = False  # the model returns just the logit rows' hidden states
        # (never with LoRA rows: the adapters' row mapping covers every row of the step)
        subset = self.accepts_output_rows and inputs.lora is None
        if subset and (rows := _one_row_per_request(inputs)) is not None:
            # the poolers read one row per request: the model computes only those in its last layer
            extra["output_rows"] = torch.tensor(rows, device=device)
            pool_items = [replace(item, rows=PoolSlice(i, 1)) for i, item in enumerate(pool_items)]
        elif subset and _reads_only_logit_rows(inputs):
            # a step with prompt rows whose logits nobody reads: the last layer computes only the sampled rows
            extra["output_rows"] = torch.tensor(inputs.logit_rows, device=device)
            logit_rows_only = True
        size = self.graphs.size_for(inputs) if self.graphs is not None and not extra else None
        if size is not None:
            hidden = self.graphs.run(inputs, size)
        else:
            hidden = self.model(input_ids, inputs.positions.to(device), metadata, **extra)
        logits = None
        if inputs.logit_rows:
            if logit_rows_only or inputs.logit_rows == list(range(len(hidden))):
                sampled = hidden  # every row, in order (a decode step): no gathered copy (~90 us at batch 1)
            else:
                sampled = hidden[torch.tensor(inputs.logit_rows, device=device)]
            # in the model's dtype: the sampler converts only when it needs to (a greedy argmax does not)
            with self._lora_rows(inputs.logit_rows):
                logits = self.model.compute_logits(sampled)
        prompt_logits = []
        for start, count in inputs.prompt_rows:
            with self._lora_rows(np.arange(start, start + count)):
                prompt_logits.append(self.model.compute_logits(hidden[start : start + count]).float())
        pooled = self._pool(hidden, input_ids, pool_items) if pool_items else []
        return StepLogits(logits, prompt_logits, pooled)

    def _pool(self, hidden: torch.Tensor, input_ids: torch.Tensor, items: list[PoolItem]) -> list[torch.Tensor]:
        """Each pooling item's result: pooled (one call per pooler), then the classification head for
        the tasks that have one (one call for all of them), then one copy to the CPU, in float32."""
        results: list[torch.Tensor] = [hidden[:0]] * len(items)
        by_pooler: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            by_pooler.setdefault(item.pooler, []).append(i)
        for name, indices in by_pooler.items():
            pooled = POOLERS[name](hidden, input_ids, [items[i].rows for i in indices])
            for i, vector in zip(indices, pooled, strict=True):
                results[i] = vector
        heads = [i for i, item in enumerate(items) if item.task in HEAD_TASKS]
        if heads:
            rows = [results[i].reshape(-1, hidden.shape[-1]) for i in heads]
            scores = self.model.classify(torch.cat(rows)).split([len(r) for r in rows])
            for i, score in zip(heads, scores, strict=True):
                results[i] = score if results[i].dim() == 2 else score[0]
        flat = torch.cat([r.reshape(-1) for r in results]).float().cpu()
        return [part.view(r.shape) for part, r in zip(flat.split([r.numel() for r in results]), results, strict=True)]


_TENSOR_FIELDS = ("query_start_loc", "seq_lens", "block_tables", "slot_mapping")


def _traceable(model: Any) -> bool:
    """Whether a model's decode step may be traced: it says so (``CausalLM``) and no module of it says not."""
    if not getattr(model, "traceable_decode", False):
        return False
    return all(getattr(module, "traceable_decode", True) for module in model.modules())


def _release_memory(device: torch.device, collect: bool) -> None:
    """Hand what sleep let go of back. ``collect``: a discarded model's modules may hold each other in
    cycles (a second or so in a large process); on CUDA, torch's caching allocator keeps freed memory."""
    if collect:
        import gc

        gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _one_row_per_request(inputs: StepInputs) -> list[int] | None:
    """The rows a step's poolers read when that is one row of each request, in order (every request
    a pooling request pooled by ``cls`` or ``last``), else None: the model then computes every row."""
    items = inputs.pool_items
    if inputs.logit_rows or inputs.prompt_rows or len(items) != len(inputs.metadata.query_start_loc) - 1:
        return None
    rows = []
    for index, item in enumerate(items):
        if item.index != index or item.pooler not in ("cls", "last") or item.rows.step_tag_id is not None:
            return None
        rows.append(item.rows.start if item.pooler == "cls" else item.rows.start + item.rows.count - 1)
    return rows


def _reads_only_logit_rows(inputs: StepInputs) -> bool:
    """Whether the step reads the hidden states of its logit rows alone, and they are fewer than its rows (a
    prompt's rows are in it): no prompt logprobs, no pooling."""
    return 0 < len(inputs.logit_rows) < len(inputs.input_ids) and not inputs.prompt_rows and not inputs.pool_items


@dataclass(slots=True)
class StepInputs:
    """Everything a worker needs for one step: the forward pass, then sampling (CPU tensors; picklable)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    logit_rows: list[int]  # last row of each generation request whose sequence this step completes
    prompt_rows: list[tuple[int, int]]  # (first row, count) of each request wanting prompt logprobs
    pool_items: list[PoolItem] = field(default_factory=list)  # pooling requests this step completes
    token_type_ids: torch.Tensor | None = None  # [T]: only when some scheduled request has them
    lora: LoRAStepInputs | None = None  # only when some scheduled request runs with a LoRA adapter
    sample_index: list[int] = field(default_factory=list)  # per logit row: its index in the scheduled requests
    sampling: SamplingBatch | None = None  # per logit row: its sampling parameters (the engine fills it)
    prompt_targets: list[PromptTarget] = field(default_factory=list)  # per prompt_rows entry


@dataclass(slots=True)
class LoRAStepInputs:
    """The adapters of one step: each row's slot, and the adapters to copy into slots first."""

    token_slots: torch.Tensor  # [T] int32 on the CPU: each row's slot, -1 = the base model only
    loads: dict[int, Any] = field(default_factory=dict)  # slot -> llmp.modeling.lora.LoRAWeights to copy in


HEAD_TASKS = ("classify", "score", "token_classify")  # the pooling tasks run through the model's ``classify``


@dataclass(frozen=True, slots=True)
class PoolItem:
    """A pooling request whose pooled result this step computes."""

    index: int  # in SchedulerOutput.scheduled
    task: str  # a pooling task (llmp.pooling_params.POOLING_TASKS)
    pooler: str  # a name in llmp.modeling.pooling.POOLERS
    rows: PoolSlice  # its rows in the step


@dataclass(slots=True)
class StepLogits:
    """A forward pass's logits, on the model's device: the sampler reads them where they are."""

    logits: torch.Tensor | None  # [len(logit_rows), V] in the model's dtype
    prompt_logits: list[torch.Tensor]  # float32, per StepInputs.prompt_rows
    # per StepInputs.pool_items, float32 on the CPU: [H] (embed), [num_labels] (classify, score),
    # [rows, H] (token_embed) or [rows, num_labels] (token_classify); before any activation
    pooled: list[torch.Tensor] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PromptTarget:
    """A request wanting prompt logprobs: the prompt tokens its rows of the step predict, and its top-k."""

    request_id: str
    token_ids: list[int]
    k: int


def prepare_inputs(out: SchedulerOutput, block_size: int) -> StepInputs:
    """Flatten a scheduled step: its tokens and attention metadata, the rows to sample and the
    prompt logprobs each request wants (``StepInputs.sampling`` is left to the engine)."""
    tokens: list[int] = []
    positions: list[np.ndarray] = []
    slots: list[np.ndarray] = []
    query_start = [0]
    seq_lens: list[int] = []
    logit_rows: list[int] = []
    prompt_rows: list[tuple[int, int]] = []
    prompt_targets: list[PromptTarget] = []
    sample_index: list[int] = []
    pool_items: list[PoolItem] = []
    with_types = any(s.request.token_type_ids is not None for s in out.scheduled)
    token_types: list[int] = []
    max_blocks = max(len(s.request.block_ids) for s in out.scheduled)
    block_tables = np.zeros((len(out.scheduled), max_blocks), dtype=np.int32)
    for i, item in enumerate(out.scheduled):
        request, start, end = item.request, item.start, item.start + item.num_tokens
        tokens.extend(request.all_token_ids[start:end])
        pos = np.arange(start, end)
        blocks = np.asarray(request.block_ids, dtype=np.int64)
        block_tables[i, : len(blocks)] = blocks
        positions.append(pos)
        slots.append(blocks[pos // block_size] * block_size + pos % block_size)
        row0 = query_start[-1]
        query_start.append(row0 + item.num_tokens)
        seq_lens.append(end)
        if with_types:
            types = request.token_type_ids
            token_types.extend(types[start:end] if types is not None else [0] * item.num_tokens)
        if request.pooling_params is not None:
            if item.completes_sequence:  # a chunked prompt ("last" pooling) is pooled at its final chunk
                rows = PoolSlice(row0, item.num_tokens, request.pooling_params.step_tag_id)
                pool_items.append(PoolItem(i, request.pooling_task, request.pooler, rows))
        elif item.completes_sequence:
            logit_rows.append(query_start[-1] - 1)
            sample_index.append(i)
        if request.params.prompt_logprobs is not None and start < request.num_prompt_tokens - 1:
            last = min(end, request.num_prompt_tokens - 1)  # position whose next token is the last prompt token
            targets = request.prompt_token_ids[start + 1 : last + 1]
            prompt_rows.append((row0, len(targets)))
            prompt_targets.append(PromptTarget(request.request_id, targets, request.params.prompt_logprobs))
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor(query_start, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.from_numpy(block_tables),
        slot_mapping=torch.from_numpy(np.concatenate(slots)),
        max_query_len=max(s.num_tokens for s in out.scheduled),
        max_seq_len=max(seq_lens),
    )
    return StepInputs(
        torch.tensor(tokens, dtype=torch.long),
        torch.from_numpy(np.concatenate(positions)),
        metadata,
        logit_rows,
        prompt_rows,
        pool_items,
        torch.tensor(token_types, dtype=torch.long) if with_types else None,
        sample_index=sample_index,
        prompt_targets=prompt_targets,
    )


PROMPT_LOGPROB_ROWS = 256  # prompt rows whose logprobs are gathered at once


def sample_step(sampler: Sampler, inputs: StepInputs, logits: StepLogits) -> ModelRunnerOutput:
    """Sample the generation requests whose sequence the step completed and gather prompt logprobs,
    on the logits' device. Pooling requests get ``None`` (the engine finishes them from ``pooled``)."""
    num_scheduled = len(inputs.metadata.query_start_loc) - 1
    sampled: list[int | None] = [None] * num_scheduled
    logprobs: list[TokenLogprobs | None] = [None] * num_scheduled
    if inputs.sample_index:
        if inputs.sampling is None:
            raise ValueError("a step with rows to sample needs StepInputs.sampling")
        result = sampler(logits.logits, inputs.sampling)
        for row, i in enumerate(inputs.sample_index):
            sampled[i], logprobs[i] = result.token_ids[row], result.logprobs[row]
    prompt_logprobs = {}
    for target, rows in zip(inputs.prompt_targets, logits.prompt_logits, strict=True):
        entries: list[TokenLogprobs] = []
        # in slices: a long prompt's [rows, V] tables (log-softmax, comparisons) would not fit a GPU's slack
        for start in range(0, len(target.token_ids), PROMPT_LOGPROB_ROWS):
            table = rows[start : start + PROMPT_LOGPROB_ROWS].log_softmax(-1)
            ids = torch.tensor(target.token_ids[start : start + len(table)], dtype=torch.long, device=table.device)
            entries += batch_logprobs(table, ids, [target.k] * len(ids))[0]
        prompt_logprobs[target.request_id] = entries
    return ModelRunnerOutput(sampled, logprobs, prompt_logprobs, logits.pooled)
