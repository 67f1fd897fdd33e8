"""CPU decode steps replayed from TorchScript traces (llmp.engine.decode_graphs, trace mode): the tokens
are transformers' greedy ones, the first step's trace runs every batch size where it holds at another size
(else each small size is traced alone), the embedding lookup stays eager, a trace that does not give the
eager model's bits is dropped, and --enforce-eager turns it off."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from llmp import LLM, SamplingParams, registry
from llmp.api import AttentionMetadata
from llmp.engine.decode_graphs import CPU_TRACE_SIZES, DecodeGraphs
from llmp.modeling.layers import VocabParallelEmbedding
from llmp.testing import assert_greedy_parity, engine_greedy, mixed_prompts, save_tiny_llama

BLOCK = 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("traced-llama")
    return path, save_tiny_llama(path)


def traceable_set() -> str:
    """cpu-native (built by ./dev setup), whose kernels are all torch ops: its decode steps may be traced."""
    assert registry.load_component("kernels", "cpu-native").traceable_decode
    return "cpu-native"


def test_decode_steps_replay_one_trace_at_every_size_with_transformers_tokens(tiny):
    path, model = tiny
    prompts = mixed_prompts(3, shared_prefix=5, seed=7)
    got, llm = engine_greedy(path, prompts, kernels=traceable_set())
    assert_greedy_parity(model, prompts, got)
    graphs = llm.engine.executor.runner.graphs
    assert graphs is not None and graphs.trace_graphs
    # 3 requests decode together (all end together here: same max_tokens); their first step was traced, and the
    # trace, checked at another size too, runs every size
    assert graphs.any_size is not None and graphs.traces == {3: graphs.any_size}, graphs.traces
    assert graphs.steps_by_size.get(3, 0) > 10, graphs.steps_by_size
    # batches of other sizes, above CPU_TRACE_SIZES too: the same trace, transformers' tokens
    for count, seed in ((2, 8), (CPU_TRACE_SIZES[-1] + 2, 9)):
        batch = mixed_prompts(count, seed=seed)
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        assert_greedy_parity(model, batch, [o.outputs[0].token_ids for o in outputs], max_tokens=12)
        assert graphs.steps_by_size.get(count, 0) > 5, graphs.steps_by_size
    assert graphs.traces == {3: graphs.any_size}  # traced once


def test_an_engine_whose_first_step_is_decode_shaped_traces_no_lazy_initialisation(tiny):
    """One-token prompts: the first step is traced before any prefill ran, so the warm-up must build the rotary
    table eagerly, or every replay would recompute the whole table (cos, sin of every position, every layer)."""
    path, model = tiny
    prompts = [[5], [9]]
    got, llm = engine_greedy(path, prompts, max_tokens=6, kernels=traceable_set())
    assert_greedy_parity(model, prompts, got, max_tokens=6)
    runner = llm.engine.executor.runner
    ops = {node.kind() for node in runner.graphs.traces[2].function.graph.nodes()}
    assert not ops & {"aten::cos", "aten::sin", "aten::outer"}, sorted(ops)
    from llmp.modeling.layers import RotaryEmbedding

    tables = {id(m._table) for m in runner.model.modules() if isinstance(m, RotaryEmbedding)}
    assert len(tables) == 1  # one table shared by the layers


def test_enforce_eager_traces_nothing(tiny):
    path, model = tiny
    prompts = mixed_prompts(2, seed=10)
    got, llm = engine_greedy(path, prompts, max_tokens=8, kernels=traceable_set(), enforce_eager=True)
    assert_greedy_parity(model, prompts, got, max_tokens=8)
    assert llm.engine.executor.runner.graphs is None


# -- the trace itself, on small models ---------------------------------------------------------------


class Toy(torch.nn.Module):
    """An embedding, a matmul, the positions and sequence lengths; optionally a Python branch on a value."""

    def __init__(self, branch_on_positions: bool = False, bake_the_size: bool = False, untraceable: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.embed_tokens = VocabParallelEmbedding(64, 8)
        torch.nn.init.normal_(self.embed_tokens.weight)
        self.proj = torch.nn.Linear(8, 8)
        self.branch_on_positions = branch_on_positions
        self.bake_the_size = bake_the_size
        self.untraceable = untraceable

    def forward(self, input_ids, positions, metadata):
        hidden = self.proj(self.embed_tokens(input_ids)) + positions[:, None] + metadata.seq_lens[:, None]
        if self.branch_on_positions and bool(positions.max() > 10):  # data-dependent Python: a trace freezes it
            hidden = hidden * 2
        if self.bake_the_size:  # len() is a Python int to the tracer: the trace keeps the size it saw
            hidden = hidden.reshape(len(input_ids), 8) + len(input_ids)  # at another size: the reshape raises
        if self.untraceable:  # an op with a list of optional scalars, which the tracer cannot record
            hidden = torch.ops.mkldnn._linear_pointwise(hidden, self.proj.weight, None, "none", [], "")
        return hidden


def step(ids: list[int], positions: list[int]) -> SimpleNamespace:
    rows = len(ids)
    metadata = AttentionMetadata(
        torch.arange(rows + 1, dtype=torch.int32),
        torch.tensor(positions, dtype=torch.int32) + 1,
        torch.zeros(rows, 1, dtype=torch.int32),
        torch.full((rows,), -1, dtype=torch.long),
        max_query_len=1,
        max_seq_len=BLOCK,
    )
    return SimpleNamespace(input_ids=torch.tensor(ids), positions=torch.tensor(positions), metadata=metadata)


def graphs_of(model: torch.nn.Module) -> DecodeGraphs:
    return DecodeGraphs(model, [1, 2], 64, BLOCK, torch.device("cpu"), capture=False, trace=True)


def eager(model: torch.nn.Module, inputs: SimpleNamespace) -> torch.Tensor:
    with torch.inference_mode():
        return model(inputs.input_ids, inputs.positions, inputs.metadata)


def test_a_trace_replays_new_ids_and_positions_through_the_eager_embedding():
    model = Toy()
    graphs = graphs_of(model)
    first = step([3, 5], [20, 30])
    assert torch.equal(graphs.run(first, 2), eager(model, first))
    traced = graphs.traces[2]
    assert traced is not None
    later = step([60, 1], [31, 7])  # other tokens: their embeddings come from the lookup, not the trace
    assert torch.equal(graphs.run(later, 2), eager(model, later))
    assert graphs.traces[2] is traced  # traced once
    graphs.reset()
    assert not graphs.traces


def test_a_trace_that_holds_only_at_its_own_size_runs_that_size_and_each_small_size_is_traced_alone(caplog):
    model = Toy(bake_the_size=True)
    graphs = DecodeGraphs(model, list(range(1, 11)), 64, BLOCK, torch.device("cpu"), capture=False, trace=True)
    first = step([3, 5], [20, 30])
    with caplog.at_level(logging.INFO, logger="llmp.engine"):
        assert torch.equal(graphs.run(first, 2), eager(model, first))
    assert graphs.any_size is None and graphs.traces[2] is not None
    assert "traced decode steps of 2 sequence(s)" in caplog.text
    three = step([1, 2, 4], [5, 6, 7])
    assert torch.equal(graphs.run(three, 3), eager(model, three))  # its own trace
    assert set(graphs.traces) == {2, 3} and graphs.traces[3] is not graphs.traces[2]
    large = step(list(range(CPU_TRACE_SIZES[-1] + 1)), [4] * (CPU_TRACE_SIZES[-1] + 1))
    assert torch.equal(graphs.run(large, len(large.input_ids)), eager(model, large))  # eager, not traced
    assert set(graphs.traces) == {2, 3}


def test_a_trace_that_differs_from_the_eager_model_is_dropped(caplog):
    model = Toy(branch_on_positions=True)
    graphs = graphs_of(model)
    inputs = step([3], [12])  # traced with the branch taken; the check's inputs (positions halved) do not take it
    with caplog.at_level(logging.WARNING, logger="llmp.engine"):
        assert torch.equal(graphs.run(inputs, 1), eager(model, inputs))
    assert graphs.traces[1] is None
    assert "decode steps of 1 run eagerly: tracing them failed (its output differs" in caplog.text
    other = step([3], [4])
    assert torch.equal(graphs.run(other, 1), eager(model, other))  # eager from then on


def test_a_forward_the_tracer_cannot_record_runs_eagerly_at_every_size_and_is_tried_once(caplog):
    model = Toy(untraceable=True)
    graphs = DecodeGraphs(model, list(range(1, 11)), 64, BLOCK, torch.device("cpu"), capture=False, trace=True)
    with caplog.at_level(logging.WARNING, logger="llmp.engine"):
        for ids in ([3, 5], [1], [2, 4, 6]):
            inputs = step(ids, [7] * len(ids))
            assert torch.equal(graphs.run(inputs, len(ids)), eager(model, inputs))
    assert graphs.untraceable is not None and "Scalar" in graphs.untraceable, graphs.untraceable
    assert graphs.traces == {} and graphs.any_size is None
    assert caplog.text.count("decode steps run eagerly: tracing them failed") == 1, caplog.text
    graphs.reset()  # a new model (wake_up) is tried again
    assert graphs.untraceable is None


def test_onednn_packed_matmuls_replay_one_trace_at_every_size(tmp_path, monkeypatch):
    """cpu-native on an AMX or AVX2-only CPU leaves bfloat16 layers to the cpu set's oneDNN-packed matmuls, whose
    packed weights the tracer cannot hold and whose 32-row blocks are Python: the layer's call is one recorded op,
    and one trace still runs every size, with the eager engine's tokens."""
    import llmp_kernels_cpu.kernels as cpu
    import llmp_kernels_cpu_native.kernels as native

    if not cpu.native_matmul(torch.bfloat16):
        pytest.skip("oneDNN here has no bfloat16 matmul: the cpu set packs float32 copies (UpcastLinear), same path")
    monkeypatch.setattr(native, "dense_chosen", lambda: False)
    save_tiny_llama(tmp_path)
    prompts = mixed_prompts(3, shared_prefix=5, seed=11)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    results = []
    for enforce_eager in (False, True):
        llm = LLM(str(tmp_path), dtype="bfloat16", block_size=4, kernels="cpu-native", enforce_eager=enforce_eager)
        batches = [prompts, prompts[:2], mixed_prompts(CPU_TRACE_SIZES[-1] + 2, seed=12)]
        outputs = [llm.generate([{"prompt_token_ids": p} for p in batch], params) for batch in batches]
        results.append([[o.outputs[0].token_ids for o in batch] for batch in outputs])
        runner = llm.engine.executor.runner
        linears = [m.packed for m in runner.model.modules() if getattr(m, "packed", None) is not None]
        assert linears and all(type(f) in (cpu.PackedLinear, cpu.UpcastLinear) for f in linears)
        if not enforce_eager:
            graphs = runner.graphs
            assert graphs.untraceable is None and graphs.any_size is not None, graphs.traces
            assert graphs.traces == {3: graphs.any_size}
            ops = {node.kind() for node in graphs.any_size.function.graph.nodes()}
            assert "llmp_cpu::packed_linear" in ops and "aten::constant_pad_nd" not in ops, sorted(ops)
        llm.shutdown()
    assert results[0] == results[1]


def test_only_models_that_say_so_are_traced_and_moe_routing_says_not():
    from llmp.engine.model_runner import _traceable
    from llmp.modeling.layers import CausalLM
    from llmp.modeling.moe import SparseMoE

    model = CausalLM()
    assert _traceable(model)
    model.moe = SparseMoE(8, 16, num_experts=4, top_k=2, renormalize=True, kernels=None)
    assert not _traceable(model)  # its Python loops over the experts a step chose
    assert not _traceable(Toy())  # a plain module does not say it


def test_a_traced_engine_s_kv_cache_and_weights_go_with_it(tiny):
    """Nothing a trace reads stays behind: the cache is an input, and the constants the tracer recorded
    (weights) are lifted into inputs; torch keeps each traced function for the life of the process."""
    import gc
    import weakref

    path, _ = tiny
    _, llm = engine_greedy(path, mixed_prompts(2, seed=11), max_tokens=4, kernels=traceable_set())
    runner = llm.engine.executor.runner
    assert runner.graphs.traces.get(2) is not None
    caches = [weakref.ref(tensor) for pair in runner.kv_caches for tensor in pair]
    weights = [weakref.ref(tensor) for tensor in runner.model.parameters()]
    assert weights and runner.graphs.traces[2].constants
    del runner
    llm.shutdown()
    del llm
    gc.collect()
    assert not [ref for ref in caches if ref() is not None]
    assert not [ref for ref in weights if ref() is not None]
