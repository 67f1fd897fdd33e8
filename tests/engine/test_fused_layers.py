"""Decoder layers in one call (llmp.api.PacksDecoderLayer, cpu-native's decoder_layer): which layers a set takes,
and the tokens of the layers' parts (a LoRA engine, whose layers run their parts), alone and batched, traced and
eager, on a bfloat16 Llama; layers of another shape, other dtypes and other sets keep their parts."""

from __future__ import annotations

import pytest
import torch

from llmp import LLM, SamplingParams, registry
from llmp.api import PacksDecoderLayer
from llmp.modeling.decoder import DecoderLayer
from llmp.testing import mixed_prompts, save_tiny_llama, save_tiny_model


def fused_decoder_layer_here() -> bool:
    """cpu-native takes layers where its bfloat16 products run on the pairs (vdpbf16ps, or their AVX2 form; not on
    AMX tiles)."""
    kernels = registry.load_component("kernels", "cpu-native")
    return isinstance(kernels(), PacksDecoderLayer) and torch.ops.llmp_native.decoder_layer_supported()


pytestmark = pytest.mark.skipif(
    not fused_decoder_layer_here(), reason="cpu-native's layer in one call runs on its pairs only (not AMX tiles)"
)


def layers(llm: LLM) -> list[DecoderLayer]:
    return [m for m in llm.engine.executor.runner.model.modules() if isinstance(m, DecoderLayer)]


def generate(llm: LLM, batches: list[list[list[int]]]) -> list[list[tuple]]:
    """Each request's greedy tokens and the logprobs of the top 5 at each (the logits' bits, where a tiny random
    model's tokens alone would hide a wrong rotation: its attention is nearly uniform)."""
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=5)
    outputs = [llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False) for batch in batches]
    return [
        [
            (list(c.token_ids), [{t: e.logprob for t, e in step.items()} for step in c.logprobs])
            for c in (o.outputs[0] for o in batch)
        ]
        for batch in outputs
    ]


def test_the_same_tokens_as_the_layers_parts(tmp_path):
    save_tiny_llama(tmp_path, num_key_value_heads=2)
    prompts = mixed_prompts(4, shared_prefix=6, seed=21)
    batches = [prompts[:1], prompts, prompts[1:3]]
    results = {}
    for name, options in (("fused", {}), ("eager", {"enforce_eager": True}), ("parts", {"enable_lora": True})):
        llm = LLM(str(tmp_path), dtype="bfloat16", block_size=4, kernels="cpu-native", **options)
        fused = [layer.fused_decode for layer in layers(llm)]
        assert fused and all((f is None) == (name == "parts") for f in fused), (name, fused)
        results[name] = generate(llm, batches)
        if name == "fused":
            graphs = llm.engine.executor.runner.graphs
            assert graphs.any_size is not None and sum(graphs.steps_by_size.values()) > 20, graphs.steps_by_size
            ops = {node.kind() for node in graphs.any_size.function.graph.nodes()}
            assert "llmp_native::decoder_layer" in ops and "llmp_native::paged_attention" not in ops, sorted(ops)
        llm.shutdown()
    assert results["fused"] == results["parts"]
    assert results["eager"] == results["parts"]


def test_other_shapes_dtypes_and_sets_keep_their_parts(tmp_path):
    llama, qwen3 = tmp_path / "llama", tmp_path / "qwen3"
    save_tiny_llama(llama)
    save_tiny_model(qwen3, "Qwen3ForCausalLM")  # q/k norms: not the plain shape
    for path, dtype, kernels in (
        (llama, "float32", "cpu-native"),
        (llama, "bfloat16", "cpu"),
        (qwen3, "bfloat16", "cpu-native"),
    ):
        llm = LLM(str(path), dtype=dtype, block_size=4, kernels=kernels)
        assert layers(llm) and all(layer.fused_decode is None for layer in layers(llm)), (path.name, dtype, kernels)
        generate(llm, [mixed_prompts(2, seed=3)])
        llm.shutdown()
