"""The engine seed (``LLM(seed=N)``, ``--seed``) governs sampling of requests without their own seed,
as in vLLM: the same requests on a fresh engine give the same text, in separate processes, in the
engine-core process behind ``AsyncLLM`` with the ``mp`` executor as well; a request's own seed wins."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Once upon a time,"]

OFFLINE = """
import json, sys
from llmp import LLM, SamplingParams
seed = int(sys.argv[1])
llm = LLM(seed=seed) if seed >= 0 else LLM()
prompts = json.loads(sys.argv[2])
texts = [o.outputs[0].text for o in llm.generate(prompts, SamplingParams(temperature=0.8), use_tqdm=False)]
own = llm.generate(prompts[0], SamplingParams(temperature=0.8, seed=7), use_tqdm=False)[0].outputs[0].text
print(json.dumps({"texts": texts, "own": own}))
"""

ASYNC = """
import asyncio, json, sys
from llmp import AsyncLLM, SamplingParams

async def main():
    engine = AsyncLLM(seed=int(sys.argv[1]), executor="mp")
    try:
        async for out in engine.generate(sys.argv[2], SamplingParams(temperature=0.8, max_tokens=16)):
            pass
        print(json.dumps(out.outputs[0].text))
    finally:
        engine.shutdown()

asyncio.run(main())
"""


def _run(script: str, *args: str) -> dict | str:
    result = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_llm_seed_repeats_across_processes_and_other_seeds_differ():
    first, again = _run(OFFLINE, "5", json.dumps(PROMPTS)), _run(OFFLINE, "5", json.dumps(PROMPTS))
    assert first["texts"] == again["texts"]
    other = _run(OFFLINE, "6", json.dumps(PROMPTS))
    assert other["texts"] != first["texts"]
    assert other["own"] == first["own"]  # the request's own seed wins over the engine's


def test_default_engine_seed_is_zero_as_in_vllm():
    assert _run(OFFLINE, "-1", json.dumps(PROMPTS))["texts"] == _run(OFFLINE, "0", json.dumps(PROMPTS))["texts"]


def test_async_engine_process_with_mp_workers_uses_the_seed():
    prompt = PROMPTS[1]
    first, again, other = (_run(ASYNC, seed, prompt) for seed in ("5", "5", "6"))
    assert first == again and first != other
