"""The whole engine with the triton set equals transformers' greedy ``generate``, token for token, on
tiny random checkpoints of real architectures: Llama; Qwen2 (QKV bias, a sliding-window layer beside a
full one); Qwen3 (q/k norm, head size 32 != hidden / heads); Mistral (sliding window); Gemma 2 (sliding
window, attention and final soft-capping, GELU); a mixed batch with prefix-cache hits and chunked
prefills beside decodes; tensor parallelism 2 with the ``mp`` executor (gloo on CPU).

Every test runs on each device present: ``cpu``, where the kernels run under Triton's interpreter
(conftest.py sets ``TRITON_INTERPRET=1`` before triton is imported; the mp executor's worker processes
inherit it), and ``cuda`` when there is one, with the compiled kernels: the same code, ``device=`` apart.
The interpreter is slow, so the models are tiny (2 layers, hidden 64) and the prompts short; the
windows (8 tokens) are still shorter than every sequence, and the caps and q/k scales make them matter.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from llmp_kernels_triton._common import INTERPRET

from llmp import LLM, SamplingParams, registry
from llmp.conformance import TinyModel, save_tiny_architecture
from llmp.testing import hf_greedy

DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(
            not INTERPRET,
            reason="triton compiles for CUDA in this process: the interpreter (TRITON_INTERPRET=1) is "
            "chosen per process, before triton is imported",
        ),
    ),
    *([pytest.param("cuda", marks=pytest.mark.gpu)] if torch.cuda.is_available() else []),
]

ARCHITECTURES = [
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
    "Gemma2ForCausalLM",
]
NEW_TOKENS = 5
PREFIX = [7, 300, 41, 152, 9, 488, 23, 311]  # two blocks of 4: whole blocks the prefix cache can hold


def prompts(seed: int, lengths: list[int], prefix: list[int] | None = None) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [(prefix or []) + torch.randint(3, 500, (n,), generator=generator).tolist() for n in lengths]


def greedy(llm: LLM, batch: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def assert_equals_transformers(tiny: TinyModel, batch: list[list[int]], got: list[list[int]]) -> None:
    for index, (prompt, tokens) in enumerate(zip(batch, got, strict=True)):
        expected = hf_greedy(tiny.reference, prompt, len(tokens))
        assert tokens == expected, f"prompt {index} ({len(prompt)} tokens): got {tokens}, transformers {expected}"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], TinyModel]:
    """``tiny_model(architecture)``: the saved checkpoint, built once per module (devices share it)."""
    saved: dict[str, TinyModel] = {}

    def get(architecture: str) -> TinyModel:
        if registry.components("model").get(architecture) is None:
            pytest.skip(f"no installed plugin serves {architecture}")
        if architecture not in saved:
            path = tmp_path_factory.mktemp(architecture)
            saved[architecture] = save_tiny_architecture(path, architecture, seed=len(architecture))
        return saved[architecture]

    return get


def make_llm(path: Path, device: str, **options: object) -> LLM:
    llm = LLM(
        model=str(path), kernels="triton", dtype="float32", device=device, block_size=4, max_model_len=64, **options
    )
    assert llm.engine.info.kernels == "triton"
    return llm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_greedy_equals_transformers(tiny_model, architecture, device):
    tiny = tiny_model(architecture)
    batch = prompts(1, [13, 6, 10])  # one batch: prefills of different lengths, then decodes together
    llm = make_llm(tiny.path, device)
    try:
        got = greedy(llm, batch)
    finally:
        llm.shutdown()
    assert_equals_transformers(tiny, batch, got)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_batch_with_prefix_cache_hits_and_chunked_prefill(tiny_model, device):
    # Qwen2: a full-attention layer and a sliding-window one, both reading cached prefix blocks
    tiny = tiny_model("Qwen2ForCausalLM")
    warm = prompts(2, [3], PREFIX)
    batch = prompts(3, [2, 14, 5], PREFIX)  # 10, 22 and 13 tokens after the cached 8
    llm = make_llm(tiny.path, device, max_num_batched_tokens=8, enable_prefix_caching=True)
    try:
        first = greedy(llm, warm, new_tokens=2)  # caches the prefix's two blocks
        hits_before = llm.engine.kv_manager.prefix_cache_hits
        got = greedy(llm, batch)  # 8-token steps: chunks after the cached blocks, beside the others' decodes
        hits = llm.engine.kv_manager.prefix_cache_hits - hits_before
        chunks = llm.engine.scheduler.num_prefill_chunks
    finally:
        llm.shutdown()
    assert hits > 0, "no prompt found the shared prefix in the cache"
    assert chunks > 0, "no prompt was prefilled in chunks"
    assert_equals_transformers(tiny, warm, first)
    assert_equals_transformers(tiny, batch, got)


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_parallel_two_ranks_with_the_mp_executor(tiny_model, device):
    if device == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip("tensor parallelism on CUDA needs two devices")
    # Gemma 2: heads, KV heads and the MLP split over the ranks; window, caps and GELU on each slice
    tiny = tiny_model("Gemma2ForCausalLM")
    batch = prompts(4, [12, 5])
    llm = make_llm(tiny.path, device, executor="mp", tensor_parallel_size=2)
    try:
        assert len(llm.engine.executor.worker_pids) == 2
        got = greedy(llm, batch)
    finally:
        llm.shutdown()
    assert_equals_transformers(tiny, batch, got)
