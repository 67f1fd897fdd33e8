"""Decode steps replayed from CUDA graphs, or on the CPU from TorchScript traces.

A decode step (one new token per request, nothing else) of ``B`` requests runs in the smallest
captured size ``S >= B``: its inputs are copied into static buffers, the ``S - B`` spare rows
write no KV (slot -1) and attend to one position, and the graph of ``S`` replays the whole forward
pass in one launch. The LM head runs eagerly on the ``B`` real rows.

The same buffers and padding run eagerly where there is no CUDA graph (``capture=False``: the
CPU tests of this padding), so the code a GPU replays is the code the CPU tests run.

On the CPU (``trace=True``, a kernel set with ``traceable_decode``) a small decode step is mostly
Python: some 20 module calls and kernel dispatches a layer cost more than the arithmetic at batch 1.
The first decode step is traced with ``torch.jit.trace`` and replayed by TorchScript's interpreter,
which dispatches the same ops in C++: the same kernels, the same bits. Steps run at their exact
size (no padding: on a CPU a padded row costs its full compute). The tracer records sizes as
values read from the inputs, so one trace serves every batch size where the model's Python does no
arithmetic of its own on them: the trace is checked against the eager model at its size and at
another, and then replayed at every size (one trace of ~0.2 s, where tracing each size as it came
cost an offline run of falling batch sizes 5-8 of them). A trace that holds only at its own size is
kept for that size, and each size up to ``CPU_TRACE_SIZES`` is traced as it first comes; a forward pass the
tracer cannot record (an op it has no value kind for) is not tried again at other sizes. The
embedding lookup stays eager (a GGUF table is dequantised per lookup by ops the tracer cannot
record). A trace is kept only if it gives the eager model's bits on other inputs too (a model with
data-dependent Python, such as MoE routing, fails that check and runs eagerly). Everything a trace
reads is an input: the KV cache explicitly, and the weights and other tensors the tracer recorded
as constants are lifted into inputs afterwards (``_TracedStep``), since torch keeps each traced
function for the life of the process and its constants with it.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import torch

from llmp.api import AttentionMetadata
from llmp.modeling.layers import VocabParallelEmbedding

log = logging.getLogger("llmp.engine")


def default_graph_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's shape of the list: 1, 2, 4, then every multiple of 8 up to 256; none above ``max_num_seqs``
    but the first that holds it (a larger batch runs eagerly)."""
    sizes = [1, 2, 4, *range(8, 257, 8)]
    kept = [s for s in sizes if s < max_num_seqs]
    return kept + [next((s for s in sizes if s >= max_num_seqs), sizes[-1])]


# Batch sizes traced one by one on the CPU where a trace holds only at its own size: each is traced once, when
# first run (about 0.2 s for a 30-layer model); larger decode steps then run eagerly, where the Python overhead
# is a small share of the step.
CPU_TRACE_SIZES = list(range(1, 9))


class DecodeGraphs:
    def __init__(
        self,
        model: Any,
        sizes: list[int],
        max_len: int,
        block_size: int,
        device: torch.device,
        capture: bool,
        trace: bool = False,
    ) -> None:
        self.model = model
        self.sizes = sorted(set(sizes))
        self.capture_graphs = capture
        self.trace_graphs = trace  # CPU: a TorchScript trace of the first decode step (sizes: exact, no padding)
        self.any_size: _TracedStep | None = None  # the first trace, where it holds at another size too
        self.traces: dict[int, Any] = {}  # size -> its own trace, or None where tracing failed (eager)
        self.untraceable: str | None = None  # why the tracer could not record the forward pass: all steps eager
        self._embedding_of: Any = None
        self._embedding_layer: VocabParallelEmbedding | None = None
        self._attention_layers: list[Any] = []
        largest = self.sizes[-1]
        self.max_blocks = -(-max_len // block_size)
        self.max_seq_len = self.max_blocks * block_size
        self.input_ids = torch.zeros(largest, dtype=torch.long, device=device)
        self.positions = torch.zeros(largest, dtype=torch.long, device=device)
        self.query_start_loc = torch.arange(largest + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(largest, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(largest, self.max_blocks, dtype=torch.int32, device=device)
        self.slot_mapping = torch.full((largest,), -1, dtype=torch.long, device=device)
        self.graphs: dict[int, tuple[Any, torch.Tensor]] = {}
        self.capture_seconds = 0.0
        self.disabled: str | None = None  # why capturing failed: every step then runs eagerly, unpadded
        self.steps_by_size: dict[int, int] = {}  # decode steps run at each size (replayed or eager)

    def metadata(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            self.query_start_loc[: size + 1],
            self.seq_lens[:size],
            self.block_tables[:size],
            self.slot_mapping[:size],
            max_query_len=1,
            max_seq_len=self.max_seq_len,  # a bound: every request's length is in seq_lens
        )

    def size_for(self, inputs: Any) -> int | None:
        """The captured size that runs this step, or None when it is not a plain decode step that fits."""
        metadata = inputs.metadata
        requests = len(metadata.seq_lens)
        if (
            self.disabled is not None
            or metadata.max_query_len != 1
            or inputs.prompt_rows
            or inputs.pool_items
            or inputs.token_type_ids is not None
            or inputs.lora is not None
            or metadata.sliding_window is not None
            or requests > self.sizes[-1]
            or metadata.block_tables.shape[1] > self.max_blocks
        ):
            return None
        if self.trace_graphs:
            return requests  # exact: a padded row costs its full compute on a CPU
        return next(s for s in self.sizes if s >= requests)

    @torch.inference_mode()
    def capture(self) -> None:
        """Record one graph per size, largest first (the smaller ones reuse its memory pool)."""
        if not self.capture_graphs:
            return
        started = time.perf_counter()
        self._reset_spare_rows(0)
        try:
            self._capture_each()
        except Exception as exc:  # a model that syncs with the host mid-pass (MoE routing): eager, said once
            self.graphs.clear()
            self.capture_graphs = False
            self.disabled = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            log.warning("CUDA graphs off, decode steps run eagerly: capturing failed (%s)", self.disabled)
            return
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - started
        log.info(
            "captured %d CUDA graphs of decode steps (batch sizes %s) in %.1f s",
            len(self.graphs),
            ", ".join(map(str, self.sizes)),
            self.capture_seconds,
        )

    def _capture_each(self) -> None:
        pool = None
        stream = torch.cuda.Stream()
        for size in reversed(self.sizes):
            metadata = self.metadata(size)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up off the capture: lazy initialisation, autotuning
                self.model(self.input_ids[:size], self.positions[:size], metadata)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                hidden = self.model(self.input_ids[:size], self.positions[:size], metadata)
            pool = graph.pool()
            self.graphs[size] = (graph, hidden)

    def reset(self) -> None:
        """Drop the graphs and every reference to the model (their KV cache or weights went away: sleep; a
        level-2 sleep frees the weights only if nothing here holds them). ``model`` is set again before the
        next capture."""
        self.graphs.clear()
        self.traces.clear()
        self.any_size = None
        self.untraceable = None
        self.model = self._embedding_of = self._embedding_layer = None
        self._attention_layers = []

    def run(self, inputs: Any, size: int) -> torch.Tensor:
        """The hidden states of a decode step's ``B`` rows, computed at ``size``."""
        metadata = inputs.metadata
        rows = len(metadata.seq_lens)
        device = self.input_ids.device
        self.input_ids[:rows].copy_(inputs.input_ids, non_blocking=True)
        self.positions[:rows].copy_(inputs.positions, non_blocking=True)
        self.seq_lens[:rows].copy_(metadata.seq_lens, non_blocking=True)
        self.slot_mapping[:rows].copy_(metadata.slot_mapping, non_blocking=True)
        width = metadata.block_tables.shape[1]
        self.block_tables[:rows, :width].copy_(metadata.block_tables.to(device, non_blocking=True))
        if size > rows:  # padded (a CUDA graph's size): the spare rows it computes write nothing
            self._reset_spare_rows(rows)
        self.steps_by_size[size] = self.steps_by_size.get(size, 0) + 1
        if size in self.graphs:
            graph, hidden = self.graphs[size]
            graph.replay()
            return hidden[:rows]
        if self.trace_graphs:
            traced = self._trace_for(size)
            if traced is not None:
                return _replay(traced, self._trace_inputs(size))[:rows]
        hidden = self.model(self.input_ids[:size], self.positions[:size], self.metadata(size))
        return hidden[:rows]

    # -- CPU traces --------------------------------------------------------------------------------

    def _embedding(self) -> VocabParallelEmbedding | None:
        if self._embedding_of is not self.model:  # found once per model (wake_up may bring a new one)
            self._embedding_of = self.model
            layers = (m for m in self.model.modules() if isinstance(m, VocabParallelEmbedding))
            self._embedding_layer = next(layers, None)
            self._attention_layers = list(getattr(self.model, "attention_layers", list)())
        return self._embedding_layer

    def _kv_caches(self) -> list[torch.Tensor]:
        # inputs of the trace, not constants: the cache is replaced by sleep, and its tensors are read per step
        self._embedding()
        return [tensor for layer in self._attention_layers for tensor in layer.kv_cache]

    def _trace_inputs(self, size: int, input_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """The traced forward's arguments: the step's embeddings (or ids, for a model without the embedding
        layer), positions and attention metadata, from the static buffers."""
        ids = self.input_ids[:size] if input_ids is None else input_ids
        embedding = self._embedding()
        first = ids if embedding is None else embedding(ids)
        return (first, self.positions[:size], *self._metadata_tensors(size), *self._kv_caches())

    def _metadata_tensors(self, size: int) -> tuple[torch.Tensor, ...]:
        m = self.metadata(size)
        return m.query_start_loc, m.seq_lens, m.block_tables, m.slot_mapping

    def _traceable_forward(self, size: int) -> Any:
        model, embedding, max_seq_len = self.model, self._embedding(), self.max_seq_len
        layers, dummy_ids = self._attention_layers, self.input_ids[:size]

        def forward(first: torch.Tensor, positions: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
            attention = AttentionMetadata(*tensors[:4], max_query_len=1, max_seq_len=max_seq_len)
            caches, saved = tensors[4:], [layer.kv_cache for layer in layers]
            for layer, k_cache, v_cache in zip(layers, caches[0::2], caches[1::2], strict=True):
                layer.kv_cache = (k_cache, v_cache)
            try:
                if embedding is None:
                    return model(first, positions, attention)
                embedding.forward = lambda input_ids: first  # the lookup ran eagerly: its rows are the input
                try:
                    return model(dummy_ids, positions, attention)
                finally:
                    del embedding.forward
            finally:
                for layer, cache in zip(layers, saved, strict=True):
                    layer.kv_cache = cache

        return forward

    def _trace_for(self, size: int) -> Any:
        """The trace that runs a step of ``size`` (made now if this is the first), or None: eager."""
        if self.any_size is not None:
            return self.any_size
        if self.untraceable is not None:
            return None
        if size in self.traces:
            return self.traces[size]
        first = not self.traces
        if not first and size > CPU_TRACE_SIZES[-1]:
            return None
        return self._trace(size, try_any_size=first)

    @torch.inference_mode()
    def _trace(self, size: int, try_any_size: bool = False) -> Any:
        """Trace the forward pass at ``size`` on this step's buffers, check it, keep it (None: eager). With
        ``try_any_size``, check it at another size too: if it holds there, it runs every size."""
        started = time.perf_counter()
        self.model.requires_grad_(False)  # the tracer takes parameters as constants, which must not need grad
        other = size + 1 if size < self.sizes[-1] else size - 1
        any_size = False
        try:
            self._warm_up(size)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # its deprecation note and shape-specialisation warnings
                traced = torch.jit.trace(self._traceable_forward(size), self._trace_inputs(size), check_trace=False)
            traced = _TracedStep(traced)
        except Exception as exc:  # an op the tracer cannot record: no size would trace, every decode step is eager
            self.untraceable = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            log.warning("decode steps run eagerly: tracing them failed (%s)", self.untraceable)
            return None
        try:
            mismatch = self._check_trace(traced, size)
        except Exception as exc:  # the replay raised: this size runs eagerly
            mismatch = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if not mismatch and try_any_size:
            # the other size's rows past this step's are spare ones: nothing is written, and the check restores them
            self._reset_spare_rows(size)
            try:
                any_size = other < 1 or self._check_trace(traced, other) is None
            except Exception:  # a size the trace kept (a reshape to it): the trace runs its own size only
                any_size = False
        if mismatch:
            log.warning("decode steps of %d run eagerly: tracing them failed (%s)", size, mismatch)
            self.traces[size] = None
            return None
        self.traces[size] = traced
        if any_size:
            self.any_size = traced
            log.info("traced decode steps in %.2f s: one trace for every batch size", time.perf_counter() - started)
        else:
            log.info("traced decode steps of %d sequence(s) in %.2f s", size, time.perf_counter() - started)
        return traced

    def _warm_up(self, size: int) -> None:
        """One eager step on this step's inputs, writing no KV, so that lazy initialisation (a rotary table built
        on first use: an engine's first step may be a decode-shaped one) is not recorded into the trace."""
        slots = self.slot_mapping[:size].clone()
        self.slot_mapping[:size].fill_(-1)
        try:
            self.model(self.input_ids[:size], self.positions[:size], self.metadata(size))
        finally:
            self.slot_mapping[:size].copy_(slots)

    def _check_trace(self, traced: Any, size: int) -> str | None:
        """Why the trace is not the eager model, on inputs other than those traced (no KV written)."""
        saved = [t[:size].clone() for t in (self.input_ids, self.positions, self.seq_lens, self.slot_mapping)]
        try:
            ids = saved[0]
            self.input_ids[:size].copy_(torch.where(ids > 0, ids - 1, ids + 1))
            self.positions[:size].copy_(saved[1] // 2)
            self.seq_lens[:size].copy_(saved[1] // 2 + 1)
            self.slot_mapping[:size].fill_(-1)
            expected = self.model(self.input_ids[:size], self.positions[:size], self.metadata(size))
            got = _replay(traced, self._trace_inputs(size))
            if not torch.equal(got, expected):
                return f"its output differs from the eager model's by up to {(got - expected).abs().max().item():.3g}"
            return None
        finally:
            for buffer, value in zip((self.input_ids, self.positions, self.seq_lens, self.slot_mapping), saved):
                buffer[:size].copy_(value)

    def _reset_spare_rows(self, rows: int) -> None:
        # spare rows: one position, block 0, nothing written; their outputs are never read
        self.input_ids[rows:].zero_()
        self.positions[rows:].zero_()
        self.seq_lens[rows:].fill_(1)
        self.slot_mapping[rows:].fill_(-1)
        self.block_tables[rows:].zero_()


class _TracedStep:
    """A traced forward whose tensor constants (weights, rotary tables) are inputs passed at each call.

    torch keeps every traced function in its global compilation unit for the life of the process, and
    a constant with its function: an engine closed in a process that goes on (a notebook making several
    ``LLM``s, a test run, a level-2 sleep) would leave its weights' memory behind. So the trace's graph
    is rewritten in place (the global copy holds no tensor any more) and run as a function of a private
    compilation unit, freed with this object.
    """

    def __init__(self, traced: Any) -> None:
        graph = traced.graph
        self.constants: list[torch.Tensor] = []
        for node in list(graph.nodes()):
            if node.kind() == "prim::Constant" and node.output().type().kind() == "TensorType":
                lifted = graph.addInput()
                lifted.setType(node.output().type())
                node.output().replaceAllUsesWith(lifted)
                self.constants.append(node.t("value"))
                node.destroy()
        self.function = torch._C.CompilationUnit().create_function("decode_step", graph.copy())

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.function(*inputs, *self.constants)


def _replay(traced: _TracedStep, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    # the plain interpreter: TorchScript's optimising executor would spend tens of seconds on its second run
    # re-optimising a graph of thousands of nodes, to run it no faster
    with torch.jit.optimized_execution(False):
        return traced(*inputs)
