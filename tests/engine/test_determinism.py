"""Greedy decoding gives the same tokens, and the same logprobs, whatever the prefix cache holds and
whatever else shares the step: cold, warm (prefix-cached), chunked, alone and in a mixed batch.

The logprobs are compared exactly: a token's logits must be computed with the same numbers, not
merely land on the same argmax (a random model's wide margins would hide a different reduction order).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from llmp import LLM, SamplingParams
from llmp.testing import save_tiny_llama

BLOCK = 16
# Wide enough that oneDNN/MKL choose their kernels by row count as they do for real models,
# small enough for a test; bfloat16, where reduction order shows soonest.
TINY = dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, num_hidden_layers=3)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
CHAT = [{"role": "user", "content": "What is the capital of France?"}]  # the README's chat example


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-bf16")
    save_tiny_llama(path, logit_scale=1.0, **TINY)
    return path


def _prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(length)]


def _result(output) -> tuple[list[int], list[list[tuple[int, float]]]]:
    completion = output.outputs[0]
    steps = [sorted((t, lp.logprob) for t, lp in step.items()) for step in completion.logprobs]
    return list(completion.token_ids), steps


def _run(llm: LLM, prompts: list[list[int]]) -> list[tuple[list[int], list]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return [_result(o) for o in outputs]


def _tiny(path: Path, kernels: str, **options) -> LLM:
    return LLM(str(path), dtype="bfloat16", kernels=kernels, block_size=BLOCK, num_threads=2, **options)


@pytest.mark.parametrize("kernels", ["torch", "cpu", "cpu-native"])
def test_same_tokens_cold_warm_alone_mixed_and_chunked(tiny_dir: Path, kernels: str) -> None:
    target = _prompt(1, 83)  # 5 full blocks and 3 tokens
    boundary = _prompt(2, 4 * BLOCK)  # ends on a block boundary
    others = [_prompt(10 + i, n) for i, n in enumerate((5, 40, 130, 17, 71))]

    # references: each request alone on a fresh engine with nothing cached
    cold = {}
    for name, prompt in (("target", target), ("boundary", boundary)):
        llm = _tiny(tiny_dir, kernels)
        [cold[name]] = _run(llm, [prompt])
        del llm

    llm = _tiny(tiny_dir, kernels)
    [first] = _run(llm, [target])
    assert first == cold["target"], "a fresh engine's answer changed"
    [warm] = _run(llm, [target])  # every full block cached: 3 tokens recomputed
    assert warm == cold["target"], "prefix-cached prefill computed different numbers"
    [warm_boundary] = _run(llm, [boundary])  # cold here, then cached up to its last block
    [warm_boundary] = _run(llm, [boundary])
    assert warm_boundary == cold["boundary"], "a hit ending on a block boundary computed different numbers"
    del llm

    # a cache hit covering all but a few tokens, left by a different request sharing the prefix
    llm = _tiny(tiny_dir, kernels)
    _run(llm, [target[: 5 * BLOCK] + _prompt(3, 20)])
    [partial] = _run(llm, [target])
    assert partial == cold["target"], "a partial prefix hit computed different numbers"
    del llm

    # in a batch with requests of other lengths: prefills and decodes share steps
    llm = _tiny(tiny_dir, kernels, enable_prefix_caching=False)
    mixed = _run(llm, [others[0], others[1], target, others[2], boundary, others[3]])
    assert mixed[2] == cold["target"] and mixed[4] == cold["boundary"], "the batch changed a request's numbers"
    # joining while others decode (they were admitted a step earlier)
    late = _run(llm, [*others[:3], target])
    assert late[3] == cold["target"]
    del llm

    # prefill in chunks of 32 tokens, beside other requests
    llm = _tiny(tiny_dir, kernels, max_num_batched_tokens=32, max_model_len=256)
    chunked = _run(llm, [others[4], target, others[1]])
    assert chunked[1] == cold["target"], "chunked prefill computed different numbers"


# the tile path in scalar code (a CPU without AMX) is slow: a narrower model there, the same scenario
EMULATED = dict(
    hidden_size=128, intermediate_size=384, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2
)
AMX_TILES_RUN = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from test_determinism import test_same_tokens_cold_warm_alone_mixed_and_chunked
from llmp.testing import save_tiny_llama
from llmp_kernels_cpu_native.library import dense_path
save_tiny_llama(Path(sys.argv[2]), logit_scale=1.0, **json.loads(sys.argv[3]))
test_same_tokens_cold_warm_alone_mixed_and_chunked(Path(sys.argv[2]), "cpu-native")
print(dense_path())
"""


def test_same_tokens_cold_warm_alone_mixed_and_chunked_on_amx_tiles(tmp_path: Path) -> None:
    """cpu-native's bfloat16 matmul on its AMX tile path (on the instructions where the CPU has them, else emulated in
    scalar code): the library chooses its path once, at load, so the cases above run in a fresh process."""
    from llmp_kernels_cpu_native.library import dense_path, dense_supported

    if not dense_supported() or dense_path() == "avx2 pairs":
        pytest.skip("no AVX-512 BF16: no AMX tile path here, emulated or not")
    import torch

    amx = torch.ops.llmp_native.has_amx()
    env = {**os.environ, "LLMP_NATIVE_AMX": "1" if amx else "emulate"}
    config = json.dumps(TINY if amx else EMULATED)
    run = [sys.executable, "-c", AMX_TILES_RUN, str(Path(__file__).parent), str(tmp_path), config]
    result = subprocess.run(run, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[-2] in ("amx tiles", "emulated amx tiles"), result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["cpu", "torch", "cpu-native"])
def test_default_model_answers_the_readme_chat_the_same_cold_and_warm(kernels: str) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=40)
    llm = LLM(kernels=kernels)  # the README's default: SmolLM2-135M, float32
    answers = [llm.chat(CHAT, params, use_tqdm=False)[0].outputs[0].text for _ in range(3)]
    assert answers[1:] == answers[:1] * 2, answers
    batch = [CHAT, [{"role": "user", "content": "Name three colors."}], [{"role": "user", "content": "Hi" * 40}]]
    mixed = [o.outputs[0].text for o in llm.chat(batch, params, use_tqdm=False)]
    assert mixed[0] == answers[0]
    del llm
    fresh = LLM(kernels=kernels, enable_prefix_caching=False)
    assert fresh.chat(CHAT, params, use_tqdm=False)[0].outputs[0].text == answers[0]
