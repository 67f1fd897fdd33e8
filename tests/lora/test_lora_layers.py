"""LoRA on the model's layers (llmp.modeling.lora): each adapted layer against the per-row formula
``y = base(x) + x A^T B^T`` with rows of several slots and of none, tensor-parallel slicing of the
slots, the gated MLP's row blocks, and the model runner: a step mixing adapters gives each row the
logits it gets alone, and an adapter built with PEFT gives PEFT's logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from llmp import LoRARequest, registry
from llmp.api import AttentionMetadata, ModelLoadError
from llmp.engine.model_runner import LoRAStepInputs, ModelRunner, StepInputs
from llmp.model_files.resolve import resolve_model
from llmp.modeling import layers, parallel
from llmp.modeling.layers import (
    CausalLM,
    GatedMLP,
    MergedLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    column_slice,
    kv_head_slice,
)
from llmp.modeling.lora import (
    EmbeddingWithLoRA,
    LMHeadWithLoRA,
    LoRAContext,
    LoRATarget,
    LoRAWeights,
    MergedLinearWithLoRA,
    ModuleLoRA,
    RowParallelLinearWithLoRA,
    install_lora,
    lora_mapping,
    lora_targets,
)
from llmp.options import EngineConfig
from llmp.testing import LORA_TARGETS_ALL, save_peft_lora, save_tiny_model

KERNEL_SETS = ("torch", "cpu")
SLOTS, MAX_RANK, HIDDEN = 3, 16, 64
# rows of a step: every slot, the base model (-1), and the same slot on rows far apart
ROW_SLOTS = [1, -1, 0, 2, 0, -1, 1, 1, 2, -1, 0]


def kernel_set(name: str) -> object:
    return registry.get_component("kernels", name).load()()


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():  # as the model runner runs layers (under inference_mode)
        yield


@pytest.fixture(params=KERNEL_SETS)
def kernels(request: pytest.FixtureRequest) -> object:
    return kernel_set(request.param)


def pair(generator: torch.Generator, rank: int, in_features: int, out_features: int) -> tuple[torch.Tensor, ...]:
    """A ``[rank, in]`` and B ``[out, rank]`` whose product moves outputs visibly."""
    a = torch.randn(rank, in_features, generator=generator) * in_features**-0.5
    return a, torch.randn(out_features, rank, generator=generator) * 0.3


def context_for(slots: list[int]) -> LoRAContext:
    context = LoRAContext()
    context.set_rows(np.asarray(slots), "cpu")
    return context


def rowwise(x: torch.Tensor, slots: list[int], delta: dict[int, torch.Tensor]) -> torch.Tensor:
    """Each row's adapter term by the formula, one row at a time (zero for a row without a slot)."""
    width = next(iter(delta.values())).shape[0]  # each delta is B A: [out, in]
    out = torch.zeros(x.shape[0], width)
    for row, slot in enumerate(slots):
        if slot >= 0 and slot in delta:
            out[row] = x[row] @ delta[slot].T
    return out


@pytest.fixture
def tensor_parallel(monkeypatch: pytest.MonkeyPatch):
    """Set this process's tensor-parallel rank and size (the layers read them when built); the
    collectives become the identity, so each rank's own partial or local result is seen."""

    def set_rank(rank: int, size: int) -> None:
        monkeypatch.setattr(parallel._state, "rank", rank)
        monkeypatch.setattr(parallel._state, "size", size)

    monkeypatch.setattr(layers, "all_reduce", lambda x: x)
    monkeypatch.setattr(layers, "all_gather", lambda x, dim=-1: x)
    return set_rank


def test_mapping_groups_rows_by_slot_in_row_order():
    mapping = lora_mapping(torch.tensor(ROW_SLOTS, dtype=torch.int32), "cpu")
    assert mapping.token_slots.dtype == torch.int64 and mapping.token_slots.tolist() == ROW_SLOTS
    assert mapping.rows.tolist() == [2, 4, 10, 0, 6, 7, 3, 8]
    assert mapping.group_slots == (0, 1, 2) and mapping.group_sizes == (3, 3, 2)
    assert lora_mapping(np.full(5, -1), "cpu") is None
    assert lora_mapping(np.zeros(0, dtype=np.int64), "cpu") is None


# -- each wrapper against the formula --------------------------------------------


@pytest.mark.parametrize(("tp", "kv_heads"), [(1, 2), (2, 2), (2, 1)])
def test_merged_linear_adds_each_rows_adapter_per_shard(kernels, tensor_parallel, tp, kv_heads):
    """qkv_proj: adapters of all shards (rank 8), of one shard (rank 4) and of the fused module
    (shard "*", rank 16); each tensor-parallel rank (KV heads split or replicated) gets its rows."""
    head_dim, q_rows, kv_rows = 16, 64, kv_heads * 16
    g = torch.Generator().manual_seed(0)
    full = {"q": torch.randn(q_rows, HIDDEN, generator=g), "k": torch.randn(kv_rows, HIDDEN, generator=g)}
    full["v"] = torch.randn(kv_rows, HIDDEN, generator=g)
    bias = {s: torch.randn(w.shape[0], generator=g) for s, w in full.items()}
    adapters = {0: ModuleLoRA(), 1: ModuleLoRA(), 2: ModuleLoRA()}
    for s in "qkv":
        adapters[0].a[s], adapters[0].b[s] = pair(g, 8, HIDDEN, full[s].shape[0])
    adapters[1].a["k"], adapters[1].b["k"] = pair(g, 4, HIDDEN, kv_rows)
    adapters[2].a["*"], adapters[2].b["*"] = pair(g, 16, HIDDEN, q_rows + 2 * kv_rows)
    x = torch.randn(len(ROW_SLOTS), HIDDEN, generator=g)
    # the whole layer's expected output, per shard: base + the row's adapter term
    expected = {s: x @ full[s].T + bias[s] for s in "qkv"}
    fused_out = rowwise(x, ROW_SLOTS, {2: adapters[2].b["*"] @ adapters[2].a["*"]})
    fused = dict(zip("qkv", fused_out.split([q_rows, kv_rows, kv_rows], dim=1), strict=True))
    for s in "qkv":
        terms = {slot: w.b[s] @ w.a[s] for slot, w in adapters.items() if s in w.a}
        expected[s] = expected[s] + rowwise(x, ROW_SLOTS, terms) + fused[s]
    for rank in range(tp):
        tensor_parallel(rank, tp)
        shards = {
            "q": column_slice(q_rows),
            "k": kv_head_slice(kv_heads, head_dim),
            "v": kv_head_slice(kv_heads, head_dim),
        }
        base = MergedLinear(HIDDEN, shards, bias=True)
        for s in "qkv":
            base.load_shard(s, "weight", full[s])
            base.load_shard(s, "bias", bias[s])
        layer = MergedLinearWithLoRA(
            base, context_for(ROW_SLOTS), kernels, max_loras=SLOTS, max_rank=MAX_RANK, dtype=torch.float32, device="cpu"
        )
        for slot, weights in adapters.items():
            layer.set_slot(slot, weights)
        local = torch.cat([expected[s][:, start : start + length] for s, (_, start, length) in shards.items()], dim=1)
        got = layer(x)
        torch.testing.assert_close(got, local, atol=1e-5, rtol=1e-5)
        base_rows = [i for i, slot in enumerate(ROW_SLOTS) if slot < 0]
        assert torch.equal(got[base_rows], base(x)[base_rows])  # no slot: exactly the base layer's numbers


@pytest.mark.parametrize("tp", [1, 2])
def test_row_parallel_linear_sums_rank_partials_to_the_formula(kernels, tensor_parallel, tp):
    """o_proj/down_proj: each rank adds B (A_local x_local) before the all-reduce, which sums B A x."""
    in_features, out_features = 128, HIDDEN
    g = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(out_features, in_features, generator=g), torch.randn(out_features, generator=g)
    adapters = {slot: pair(g, rank, in_features, out_features) for slot, rank in [(0, 16), (1, 8), (2, 1)]}
    x = torch.randn(len(ROW_SLOTS), in_features, generator=g)
    expected = x @ weight.T + bias + rowwise(x, ROW_SLOTS, {s: b @ a for s, (a, b) in adapters.items()})
    total = torch.zeros_like(expected)
    for rank in range(tp):
        tensor_parallel(rank, tp)
        base = RowParallelLinear(in_features, out_features, bias=True)
        base.load_weight("weight", weight)
        base.load_weight("bias", bias)
        layer = RowParallelLinearWithLoRA(
            base, context_for(ROW_SLOTS), kernels, max_loras=SLOTS, max_rank=MAX_RANK, dtype=torch.float32, device="cpu"
        )
        for slot, (a, b) in adapters.items():
            layer.set_slot(slot, ModuleLoRA({"": a}, {"": b}))
        total += layer(x.narrow(1, rank * base.in_local, base.in_local))
    torch.testing.assert_close(total - (tp - 1) * bias, expected, atol=1e-4, rtol=1e-5)


def test_embedding_adds_the_tokens_adapter_rows(kernels):
    vocab = 100
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(vocab, HIDDEN, generator=g)
    adapters = {slot: pair(g, rank, vocab, HIDDEN) for slot, rank in [(0, 16), (1, 8), (2, 4)]}
    ids = torch.randint(0, vocab, (len(ROW_SLOTS),), generator=g)
    onehot = torch.nn.functional.one_hot(ids, vocab).float()
    expected = weight[ids] + rowwise(onehot, ROW_SLOTS, {s: b @ a for s, (a, b) in adapters.items()})
    base = VocabParallelEmbedding(vocab, HIDDEN)
    base.load_weight("weight", weight)
    layer = EmbeddingWithLoRA(
        base, context_for(ROW_SLOTS), kernels, max_loras=SLOTS, max_rank=MAX_RANK, dtype=torch.float32, device="cpu"
    )
    for slot, (a, b) in adapters.items():
        layer.set_slot(slot, ModuleLoRA({"": a}, {"": b}))
    torch.testing.assert_close(layer(ids), expected, atol=1e-5, rtol=1e-5)
    assert layer.weight is base.weight


@pytest.mark.parametrize("tp", [1, 2])
def test_lm_head_adds_each_ranks_vocabulary_rows(kernels, tensor_parallel, tp):
    """A vocabulary not divisible by the ranks: the last rank's padding rows stay zero."""
    vocab = 101
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(vocab, HIDDEN, generator=g)
    adapters = {slot: pair(g, rank, HIDDEN, vocab) for slot, rank in [(0, 16), (2, 8)]}
    h = torch.randn(len(ROW_SLOTS), HIDDEN, generator=g)
    expected = h @ weight.T + rowwise(h, ROW_SLOTS, {s: b @ a for s, (a, b) in adapters.items()})
    pieces = []
    for rank in range(tp):
        tensor_parallel(rank, tp)
        base = ParallelLMHead(vocab, HIDDEN)
        base.load_weight("weight", weight)
        layer = LMHeadWithLoRA(
            base, context_for(ROW_SLOTS), kernels, max_loras=SLOTS, max_rank=MAX_RANK, dtype=torch.float32, device="cpu"
        )
        for slot, (a, b) in adapters.items():
            layer.set_slot(slot, ModuleLoRA({"": a}, {"": b}))
        assert layer.vocab_size == vocab and layer.weight is base.weight
        pieces.append(layer(h))  # all_gather is the identity here: this rank's rows
        assert not layer.lora_b[:, vocab - base.start :].any()
    torch.testing.assert_close(torch.cat(pieces, dim=1)[:, :vocab], expected, atol=1e-4, rtol=1e-5)


def test_gated_mlp_row_blocks_follow_the_mapping(kernels):
    """A kernel set's MLP row blocks (mlp_block_rows; 4 here) each run with their own rows' slots."""
    intermediate = 96
    g = torch.Generator().manual_seed(4)
    mlp = GatedMLP(HIDDEN, intermediate, bias=False, kernels=kernels)
    mlp.gate_up_proj.load_shard("gate", "weight", torch.randn(intermediate, HIDDEN, generator=g) * 0.1)
    mlp.gate_up_proj.load_shard("up", "weight", torch.randn(intermediate, HIDDEN, generator=g) * 0.1)
    mlp.down_proj.load_weight("weight", torch.randn(HIDDEN, intermediate, generator=g) * 0.1)
    context = context_for(ROW_SLOTS)
    options = dict(max_loras=SLOTS, max_rank=MAX_RANK, dtype=torch.float32, device="cpu")
    gate_up = MergedLinearWithLoRA(mlp.gate_up_proj, context, kernels, **options)
    down = RowParallelLinearWithLoRA(mlp.down_proj, context, kernels, **options)
    for slot in range(SLOTS):
        (ga, gb), (ua, ub) = pair(g, 8, HIDDEN, intermediate), pair(g, 8, HIDDEN, intermediate)
        da, db = pair(g, 8, intermediate, HIDDEN)
        gate_up.set_slot(slot, ModuleLoRA({"gate": ga, "up": ua}, {"gate": gb, "up": ub}))
        down.set_slot(slot, ModuleLoRA({"": da}, {"": db}))
    mlp.gate_up_proj, mlp.down_proj, mlp.lora_context = gate_up, down, context
    x = torch.randn(len(ROW_SLOTS), HIDDEN, generator=g)
    mlp.block_rows = None
    whole = mlp(x)
    mlp.block_rows = 4
    torch.testing.assert_close(mlp(x), whole, atol=1e-6, rtol=1e-6)
    alone = torch.cat([_run_alone(mlp, context, x[i : i + 1], slot) for i, slot in enumerate(ROW_SLOTS)])
    torch.testing.assert_close(whole, alone, atol=1e-6, rtol=1e-6)


def _run_alone(module: torch.nn.Module, context: LoRAContext, x: torch.Tensor, slot: int) -> torch.Tensor:
    context.set_rows(np.asarray([slot]), "cpu")
    try:
        return module(x)
    finally:
        context.set_rows(np.asarray(ROW_SLOTS), "cpu")


def test_a_layer_given_other_rows_than_the_mapping_refuses(kernels):
    base = RowParallelLinear(32, 16, bias=False)
    base.load_weight("weight", torch.randn(16, 32))
    layer = RowParallelLinearWithLoRA(
        base, context_for([0, -1, 0]), kernels, max_loras=1, max_rank=8, dtype=torch.float32, device="cpu"
    )
    with pytest.raises(RuntimeError, match="got 2 rows, but the LoRA mapping in effect has 3"):
        layer(torch.randn(2, 32))


# -- install_lora on a whole model -------------------------------------------------


def native_model(path: Path, kernels: object) -> CausalLM:
    from llmp.testing import load_native_model

    resolved = resolve_model(EngineConfig(model=str(path)))
    return load_native_model(resolved.spec.load(), path, kernels)


def llama_targets(layers_count: int = 2) -> dict[str, LoRATarget]:
    hidden, heads_dim, kv, inter, vocab = 64, 64, 32, 128, 512
    out = {
        "model.embed_tokens": LoRATarget("embedding", vocab, {"": hidden}),
        "lm_head": LoRATarget("lm_head", hidden, {"": vocab}),
    }
    for i in range(layers_count):
        p = f"model.layers.{i}"
        out[f"{p}.self_attn.qkv_proj"] = LoRATarget("linear", hidden, {"q": heads_dim, "k": kv, "v": kv})
        out[f"{p}.self_attn.o_proj"] = LoRATarget("linear", heads_dim, {"": hidden})
        out[f"{p}.mlp.gate_up_proj"] = LoRATarget("linear", hidden, {"gate": inter, "up": inter})
        out[f"{p}.mlp.down_proj"] = LoRATarget("linear", inter, {"": hidden})
    return out


def meta_targets(path: Path) -> dict[str, LoRATarget]:
    """The LoRA targets of the model at ``path``, from a meta-device build (as the engine finds them)."""
    resolved = resolve_model(EngineConfig(model=str(path)))
    with torch.device("meta"):
        return lora_targets(resolved.spec.load()(resolved.config, kernel_set("torch")))


def test_targets_and_install_on_a_native_model(tiny_llama):
    kernels = kernel_set("torch")
    assert meta_targets(tiny_llama) == llama_targets()
    model = native_model(tiny_llama, kernels)
    ids = torch.arange(3, 9)
    before = model.compute_logits(model.model.embed_tokens(ids))
    state = install_lora(model, kernels, max_loras=2, max_rank=8, dtype=torch.float32, device="cpu")
    assert set(state.modules) == set(llama_targets())
    assert isinstance(model.lm_head, LMHeadWithLoRA) and isinstance(model.model.embed_tokens, EmbeddingWithLoRA)
    assert isinstance(model.model.layers[1].mlp.gate_up_proj, MergedLinearWithLoRA)
    assert all(layer.mlp.lora_context is state.context for layer in model.model.layers)
    assert state.modules["model.layers.0.self_attn.qkv_proj"].lora_a.shape == (2, 3 * 8, 64)
    # no mapping (no adapted row): the model computes exactly what it did
    assert torch.equal(model.compute_logits(model.model.embed_tokens(ids)), before)
    with pytest.raises(ValueError, match="rank 16, above max_lora_rank 8"):
        state.load(0, LoRAWeights(1, "big", 16))
    with pytest.raises(ValueError, match="modules the model lacks"):
        state.load(0, LoRAWeights(1, "odd", 8, {"model.layers.9.mlp.down_proj": ModuleLoRA()}))
    with pytest.raises(ValueError, match="slot 2 is out of range"):
        state.load(2, None)


def test_install_refuses_non_decoders_and_kernel_sets_without_lora(tiny_llama):
    kernels = kernel_set("torch")
    with pytest.raises(ModelLoadError, match="LoRA needs a native decoder model"):
        install_lora(torch.nn.Linear(2, 2), kernels, max_loras=1, max_rank=8, dtype=torch.float32, device="cpu")

    class NoLoRA:
        silu_and_mul = gelu_tanh_and_mul = rms_norm = rotary = None

    model = native_model(tiny_llama, kernels)
    with pytest.raises(ModelLoadError, match="kernel set NoLoRA has no LoRA kernels"):
        install_lora(model, NoLoRA(), max_loras=1, max_rank=8, dtype=torch.float32, device="cpu")


# -- the model runner: slots, mapping, logits rows ------------------------------------


def random_adapter(targets: dict[str, LoRATarget], lora_id: int, rank: int, seed: int) -> LoRAWeights:
    """A hand-built adapter of every target (each shard its own A and B), scaled to move greedy tokens."""
    g = torch.Generator().manual_seed(seed)
    modules = {}
    for path, target in targets.items():
        module = ModuleLoRA()
        for shard, rows in target.shards.items():
            module.a[shard], module.b[shard] = pair(g, rank, target.in_features, rows)
            if target.kind == "embedding":  # A's column is the token's input: no fan-in to average
                module.a[shard] *= target.in_features**0.5 * 0.1
        modules[path] = module
    return LoRAWeights(lora_id, f"adapter-{lora_id}", rank, modules)


def runner_for(path: Path, kernels: str, dtype: str = "float32", **options: object) -> ModelRunner:
    # a runner takes a resolved device (the engine resolves --device once)
    config = EngineConfig(model=str(path), dtype=dtype, block_size=4, kernels=kernels, device="cpu", **options)
    runner = ModelRunner(config, resolve_model(config))
    runner.allocate_kv_cache(128)
    return runner


def prefill_step(
    prompts: list[list[int]], slots: list[int] | None, loads: dict | None = None, *, all_logits: bool = False
) -> StepInputs:
    """One step prefilling ``prompts`` whole (each in its own blocks of 4), with each prompt's slot;
    logits of each last row, or with ``all_logits`` of every row (as prompt logprobs)."""
    block_size, lengths = 4, [len(p) for p in prompts]
    tables = np.zeros((len(prompts), max(-(-n // block_size) for n in lengths)), dtype=np.int32)
    slot_mapping, block = [], 0
    for i, n in enumerate(lengths):
        blocks = np.arange(block, block + -(-n // block_size))
        tables[i, : len(blocks)] = blocks
        block += len(blocks)
        pos = np.arange(n)
        slot_mapping.append(blocks[pos // block_size] * block_size + pos % block_size)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(lengths, dtype=torch.int32),
        block_tables=torch.from_numpy(tables),
        slot_mapping=torch.from_numpy(np.concatenate(slot_mapping)),
        max_query_len=max(lengths),
        max_seq_len=max(lengths),
    )
    lora = None
    if slots is not None:
        token_slots = torch.from_numpy(np.repeat(np.asarray(slots, dtype=np.int32), lengths))
        lora = LoRAStepInputs(token_slots, dict(loads or {}))
    return StepInputs(
        torch.tensor([t for p in prompts for t in p]),
        torch.from_numpy(np.concatenate([np.arange(n) for n in lengths])),
        metadata,
        [] if all_logits else [int(s) - 1 for s in starts[1:]],
        [(int(s), n) for s, n in zip(starts, lengths)] if all_logits else [],
        lora=lora,
    )


PROMPTS = [[5, 9, 33, 120, 7, 250], [17, 3, 99], [400, 12, 8, 8, 61, 2, 301, 44, 90], [6, 6, 200, 31]]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kernels", KERNEL_SETS)
def test_runner_step_mixing_adapters_gives_each_row_its_logits_alone(tiny_llama, kernels, dtype):
    """Base + three adapters in one step == each prompt alone, bit for bit; adapters change logits;
    a slot reloaded with another adapter keeps nothing of the old one."""
    runner = runner_for(tiny_llama, kernels, dtype, enable_lora=True, max_loras=SLOTS, max_lora_rank=MAX_RANK)
    targets = llama_targets()
    adapters = {slot: random_adapter(targets, slot + 1, rank, seed=slot) for slot, rank in [(0, 8), (1, 16), (2, 4)]}
    torch_dtype = runner.dtype
    for weights in adapters.values():  # on the CPU in the model's dtype, as the adapter loader gives them
        for module in weights.modules.values():
            module.a = {s: t.to(torch_dtype) for s, t in module.a.items()}
            module.b = {s: t.to(torch_dtype) for s, t in module.b.items()}
    slots = [0, -1, 2, 1]
    mixed = runner.forward(prefill_step(PROMPTS, slots, adapters)).logits
    for i, (prompt, slot) in enumerate(zip(PROMPTS, slots, strict=True)):
        alone = runner.forward(prefill_step([prompt], [slot])).logits
        assert torch.equal(mixed[i], alone[0]), f"prompt {i} (slot {slot}) depends on its batch"
    base = runner.forward(prefill_step(PROMPTS, None)).logits
    assert torch.equal(mixed[1], base[1])
    for i in (0, 2, 3):
        assert (mixed[i] - base[i]).abs().max() > 0.1, f"adapter of prompt {i} changed nothing"
    # slot 0 now holds another adapter (rank 4, one shard of one module), then nothing: the old
    # adapter's numbers are gone
    qkv = adapters[2].modules["model.layers.0.self_attn.qkv_proj"]
    only_q = LoRAWeights(
        9, "q-only", 4, {"model.layers.0.self_attn.qkv_proj": ModuleLoRA({"q": qkv.a["q"]}, {"q": qkv.b["q"]})}
    )
    reloaded = runner.forward(prefill_step(PROMPTS[:1], [0], {0: only_q})).logits
    fresh = runner_for(tiny_llama, kernels, dtype, enable_lora=True, max_loras=1, max_lora_rank=MAX_RANK)
    assert torch.equal(reloaded, fresh.forward(prefill_step(PROMPTS[:1], [0], {0: only_q})).logits)
    emptied = runner.forward(prefill_step(PROMPTS[:1], [0], {0: None})).logits
    assert torch.equal(emptied[0], base[0])


def test_runner_without_lora_refuses_a_lora_step(tiny_llama):
    runner = runner_for(tiny_llama, "torch")
    assert runner.lora is None
    with pytest.raises(RuntimeError, match="started without enable_lora"):
        runner.forward(prefill_step(PROMPTS[:1], [0]))


def peft_adapter(peft_model: torch.nn.Module, stacked_params: dict, lora_id: int) -> LoRAWeights:
    """The PEFT model's adapter as llmp's modules (q/k/v and gate/up as shards of the fused
    modules, PEFT's scaling folded into B), built here by hand from the live PEFT layers."""
    modules: dict[str, ModuleLoRA] = {}
    rank = 0
    for name, module in peft_model.named_modules():
        if hasattr(module, "lora_embedding_A") and "default" in module.lora_embedding_A:
            a, b = module.lora_embedding_A["default"], module.lora_embedding_B["default"]
        elif hasattr(module, "lora_A") and "default" in module.lora_A:
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
        else:
            continue
        path, shard = name.removeprefix("base_model.model.") + ".", ""
        for part, (fused, fused_shard) in stacked_params.items():
            if part in path:
                path, shard = path.replace(part, fused), fused_shard
        entry = modules.setdefault(path.rstrip("."), ModuleLoRA())
        entry.a[shard], entry.b[shard] = a.detach().clone(), b.detach() * module.scaling["default"]
        rank = max(rank, a.shape[0])
    return LoRAWeights(lora_id, "peft", rank, modules)


@pytest.mark.parametrize("source", ["peft layers", "adapter files"])
@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Gemma2ForCausalLM"])
def test_runner_logits_equal_peft_with_the_adapter_applied(tmp_path, architecture, source):
    """An adapter PEFT built on every target (attention, MLP, embeddings, LM head), taken from the
    live PEFT layers or read from the files PEFT saved: llmp's logits at every prompt position equal
    transformers + PEFT's, and differ from the base model's."""
    pytest.importorskip("peft")
    extra = dict(head_dim=16, query_pre_attn_scalar=16, attn_implementation="eager") if "Gemma" in architecture else {}
    model = save_tiny_model(tmp_path / "model", architecture, seed=5, qk_scale=4.0, **extra)
    targets = (*LORA_TARGETS_ALL, "embed_tokens", "lm_head")
    peft_model = save_peft_lora(model, tmp_path / "adapter", rank=8, alpha=16, targets=targets, seed=5)
    runner = runner_for(tmp_path / "model", "torch", enable_lora=True, max_loras=2, max_lora_rank=8)
    if source == "peft layers":
        adapter = peft_adapter(peft_model, dict(CausalLM.stacked_params), 1)
    else:
        from llmp.model_files.lora import load_lora_weights

        request = LoRARequest("peft", 1, str(tmp_path / "adapter"))
        targets = meta_targets(tmp_path / "model")
        adapter = load_lora_weights(request, 1, targets, CausalLM.stacked_params, 8, torch.float32)
    assert set(adapter.modules) == set(runner.lora.modules)
    prompt = PROMPTS[2]
    got = runner.forward(prefill_step([prompt], [1], {1: adapter}, all_logits=True)).prompt_logits[0]
    with torch.no_grad():
        expected = peft_model(torch.tensor([prompt])).logits[0]
        with peft_model.disable_adapter():
            base = peft_model(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)
    assert (got - base).abs().max() > 0.1
