"""Runs workloads on vLLM's CPU build for engine_throughput.py, inside vLLM's own venv.

    VLLM_CPU_OMP_THREADS_BIND=0-1 VENV/bin/python benchmarks/vllm_worker.py SPEC.json

SPEC.json: {"model", "dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens"}.
Prints {"startup": seconds of LLM()} once loaded, then reads one JSON request per stdin
line, {"prompts": [[ids...]], "new_tokens": [n...]}, and answers each with {"seconds": ...}.
Staying alive lets the caller alternate llmp and vLLM on each workload, so both are
timed under the same machine conditions. Only the standard library and vLLM are imported.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    out = os.fdopen(os.dup(1), "w")  # answers go here; vLLM and its processes print to stderr
    os.dup2(2, 1)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        max_model_len=spec["max_model_len"],
        max_num_seqs=spec["max_num_seqs"],
        max_num_batched_tokens=spec["max_num_batched_tokens"],
        seed=0,
    )
    print(json.dumps({"startup": time.perf_counter() - start}), file=out, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        params = [
            SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True) for n in request["new_tokens"]
        ]
        began = time.perf_counter()
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in request["prompts"]], params, use_tqdm=False)
        seconds = time.perf_counter() - began
        assert [len(o.outputs[0].token_ids) for o in outputs] == request["new_tokens"]
        print(json.dumps({"seconds": seconds}), file=out, flush=True)


if __name__ == "__main__":  # vLLM starts worker processes that re-import this module
    main()
