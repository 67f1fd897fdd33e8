"""Runs workloads on llama.cpp (PyPI llama-cpp-python) for gguf_llamacpp.py, inside its own venv.

    VENV/bin/python benchmarks/llamacpp_worker.py SPEC.json

SPEC.json: {"model_path", "n_ctx", "n_threads", "n_batch"}. Prints {"startup": seconds of
Llama(...), "n_vocab", "rss_bytes"} once loaded, then reads one JSON request per stdin line
and answers each with one JSON line:

  {"prompts": [[ids...]], "new_tokens": [n...]}  ->  {"seconds": ...}
      each prompt in turn (llama.cpp serves one sequence): a fresh context state, the prompt
      evaluated and n tokens sampled greedily (temperature 0), EOS ignored;
  {"reload": true}  ->  {"startup": seconds of a fresh Llama(...) of the same file}
  {"rss": true}  ->  {"rss_bytes": ..., "peak_rss_bytes": ...}

Staying alive lets the caller alternate llmp and llama.cpp on each workload, so both are
timed under the same machine conditions. Only the standard library and llama_cpp are imported.
"""

from __future__ import annotations

import json
import os
import sys
import time


def memory() -> dict[str, int]:
    """This process's resident set now and at its peak (VmRSS, VmHWM), in bytes."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
    return {"rss_bytes": fields["VmRSS"], "peak_rss_bytes": fields["VmHWM"]}


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    out = os.fdopen(os.dup(1), "w")  # answers go here; llama.cpp prints to stderr
    os.dup2(2, 1)
    from llama_cpp import Llama

    def load() -> tuple[Llama, float]:
        start = time.perf_counter()
        llm = Llama(
            model_path=spec["model_path"],
            n_ctx=spec["n_ctx"],
            n_threads=spec["n_threads"],
            n_threads_batch=spec["n_threads"],
            n_batch=spec["n_batch"],
            seed=0,
            verbose=False,
        )
        return llm, time.perf_counter() - start

    llm, startup = load()
    print(json.dumps({"startup": startup, "n_vocab": llm.n_vocab(), **memory()}), file=out, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("reload"):
            del llm
            llm, startup = load()
            answer = {"startup": startup}
        elif request.get("rss"):
            answer = memory()
        else:
            began = time.perf_counter()
            for prompt, wanted in zip(request["prompts"], request["new_tokens"]):
                llm.reset()  # no reuse of the previous sequence's KV cache
                produced = 0
                for _ in llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
                    produced += 1
                    if produced == wanted:
                        break
            answer = {"seconds": time.perf_counter() - began}
        print(json.dumps(answer), file=out, flush=True)


if __name__ == "__main__":
    main()
