"""--kv-cache-dtype: a float32 model's KV cache in 16 bits (or a bfloat16 model's in float32). The cache is
allocated in that dtype and holds as many more tokens as its elements are smaller; each kernel set writes the
keys and values rounded to it and attends over them; the answers stay within the cache's rounding of the
float32 cache's, traced and eager, alone and batched; a dtype llmp does not have is a clear error."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from llmp import LLM, SamplingParams, registry
from llmp.testing import mixed_prompts, save_tiny_llama

KERNELS = [name for name in ("cpu-native", "cpu", "torch") if name in registry.components("kernels")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path, num_key_value_heads=2)
    return path


def run(llm: LLM, prompts: list[list[int]]) -> list[tuple[list[int], list[dict[int, float]]]]:
    """Each request's greedy tokens and its top-5 logprobs at each step."""
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=5)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [
        (list(c.token_ids), [{t: e.logprob for t, e in step.items()} for step in c.logprobs])
        for c in (o.outputs[0] for o in outputs)
    ]


def caches(llm: LLM) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return llm.engine.executor.runner.kv_caches


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("cache_dtype", ["bfloat16", "float16"])
def test_a_16_bit_cache_of_a_float32_model(model_dir, kernels, cache_dtype, engine_device):
    if engine_device != "cpu" and kernels != "torch":
        pytest.skip("a CPU kernel set")
    prompts = mixed_prompts(3, shared_prefix=5, seed=4)
    common = {"dtype": "float32", "block_size": 4, "kernels": kernels, "kv_cache_memory_bytes": 8 << 20}
    full = LLM(str(model_dir), **common)
    half = LLM(str(model_dir), kv_cache_dtype=cache_dtype, **common)
    assert all(k.dtype == v.dtype == torch.float32 for k, v in caches(full))
    assert all(k.dtype == v.dtype == getattr(torch, cache_dtype) for k, v in caches(half))
    # twice the blocks in the same memory
    assert half.engine.info.options["num_kv_blocks"] == 2 * full.engine.info.options["num_kv_blocks"]
    assert half.engine.info.options["kv_cache_dtype"] == cache_dtype
    assert full.engine.info.options["kv_cache_dtype"] == "float32"

    expected = run(full, prompts)
    batched, alone = run(half, prompts), [run(half, [p])[0] for p in prompts]
    for got in (batched, alone):
        for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, expected, strict=True):
            # the same first token (the prompt's cache rounded; a tiny random model's top tokens are close,
            # so a later one may flip where a step's logits tie within the rounding)
            assert tokens[0] == want_tokens[0]
            first, want = logprobs[0], want_logprobs[0]
            shared = first.keys() & want.keys()
            assert len(shared) >= 4, (first, want)
            assert max(abs(first[t] - want[t]) for t in shared) < 0.02, (first, want)
    # a row's numbers do not depend on the batch or on the trace (cpu-native's decode steps are traced)
    assert batched == alone
    if kernels == "cpu-native":
        assert half.engine.executor.runner.graphs.any_size is not None
    eager = LLM(str(model_dir), kv_cache_dtype=cache_dtype, enforce_eager=True, **common)
    assert run(eager, prompts) == batched
    # every step against the reference set over the same 16-bit cache: the same tokens, logprobs to float32's
    # summation order
    if kernels != "torch":
        reference = run(LLM(str(model_dir), kv_cache_dtype=cache_dtype, **{**common, "kernels": "torch"}), prompts)
        for (tokens, logprobs), (want_tokens, want_logprobs) in zip(batched, reference, strict=True):
            assert tokens == want_tokens
            for step, want in zip(logprobs, want_logprobs, strict=True):
                assert max(abs(step[t] - want[t]) for t in step.keys() & want.keys()) < 1e-3, (step, want)
    # a level-2 sleep frees the cache and builds it again in its dtype
    half.sleep(2)
    assert half.engine.executor.bytes_per_block() == full.engine.executor.bytes_per_block() // 2  # asleep too
    half.wake_up()
    assert all(k.dtype == v.dtype == getattr(torch, cache_dtype) for k, v in caches(half))
    assert run(half, prompts) == batched


def test_a_float32_cache_of_a_bfloat16_model(model_dir, caplog):
    # the keys and values are bfloat16 projections, which a float32 cache holds exactly: the same answers
    common = {"dtype": "bfloat16", "block_size": 4, "kv_cache_memory_bytes": 8 << 20, "kernels": "torch"}
    caplog.set_level("INFO", logger="llmp.engine")
    llm = LLM(str(model_dir), kv_cache_dtype="float32", **common)
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "twice the memory a token for no precision" in warning, warning
    assert all(k.dtype == torch.float32 for k, _ in caches(llm))
    assert llm.engine.info.options["dtype"] == "bfloat16"
    prompts = mixed_prompts(2, seed=1)
    assert run(llm, prompts) == run(LLM(str(model_dir), **common), prompts)


def test_a_float16_cache_of_a_bfloat16_model_warns_of_its_range(model_dir, caplog):
    caplog.set_level("INFO", logger="llmp.engine")
    common = {"dtype": "bfloat16", "block_size": 4, "kv_cache_memory_bytes": 8 << 20, "kernels": "torch"}
    llm = LLM(str(model_dir), kv_cache_dtype="float16", **common)
    assert all(k.dtype == torch.float16 for k, _ in caches(llm))
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "become inf" in warning and "65504" in warning, warning
    caplog.clear()
    LLM(str(model_dir), kv_cache_dtype="bfloat16", **common)  # the same dtype as the weights: nothing to say
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_the_start_up_line_names_a_cache_dtype_other_than_the_weights(model_dir, caplog):
    caplog.set_level("INFO", logger="llmp.engine")
    LLM(str(model_dir), dtype="float32", kv_cache_dtype="bfloat16", block_size=4, kv_cache_memory_bytes=8 << 20)
    ready = [r.getMessage() for r in caplog.records if "engine ready" in r.getMessage()]
    assert ready and ready[-1].endswith("tokens in bfloat16"), ready


def test_a_dtype_llmp_does_not_have_is_one_usage_line():
    # vLLM's fp8 caches are not here: the option's choices say which are
    done = subprocess.run(
        [sys.executable, "-m", "llmp", "serve", "--kv-cache-dtype", "fp8"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--kv-cache-dtype" in lines[0] and "bfloat16" in lines[0], done.stderr
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM("unused", kv_cache_dtype="fp8")
