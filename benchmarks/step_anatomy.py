"""Where an engine step's time goes, by kernel, with the `cpu` or `cpu-native` kernel set.

    .venv/bin/python benchmarks/step_anatomy.py offline            # the engine benchmark's offline workload
    .venv/bin/python benchmarks/step_anatomy.py prefill            # its prompts alone, one new token each
    .venv/bin/python benchmarks/step_anatomy.py decode --batch 32  # B prompts of 128 tokens, 128 new tokens
    .venv/bin/python benchmarks/step_anatomy.py decode --batch 1 --kernels cpu-native

Timers wrap the set's kernels (RMSNorm, rotary, SiLU-and-mul, KV writes, paged attention and, inside
the `cpu` set's, the SDPA calls) and the packed matmuls; they are installed on the classes before the
model is built, so layers that bound a kernel at construction are timed too. `LLMEngine.step()` is driven
in a loop on the Qwen2.5-0.5B-shaped model of engine_throughput.py (bfloat16, 2 threads, same limits).
"the rest" is the step's time outside every timed kernel: embedding, residual adds, sampling,
scheduling, inputs and outputs. Decode figures are per step, averaged over the steps with no prompt
in them; the others are totals. Timers, not the torch profiler, which inflates small ops. Decode steps
run eagerly (`enforce_eager`): the engine replays them from a TorchScript trace, whose kernels no Python
timer sees (`--traced` keeps the trace; its kernels then count as the rest, and the total is the engine's).
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import torch  # noqa: E402
from engine_throughput import build_model, random_prompts  # noqa: E402  (imports llmp before torch)

SECONDS: collections.defaultdict[str, float] = collections.defaultdict(float)
KERNELS = ("rms_norm", "rotary", "silu_and_mul", "write_kv", "paged_attention")
INNER = ("_attend",)  # the cpu set's SDPA calls inside paged_attention: reported, not added to the total
STEP_TOKENS: list[int] = []  # the tokens of the step (KV rows written by its first layer)


def timed(function, label: str):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            SECONDS[label] += time.perf_counter() - start

    return wrapper


def install_timers(kernels: str) -> None:
    import llmp_kernels_cpu.kernels as cpu

    classes = [cpu.CpuKernels]
    if kernels == "cpu-native":
        from llmp_kernels_cpu_native.kernels import DenseGatedLinear, DenseLinear, NativeKernels, QuantizedLinear

        classes.append(NativeKernels)
        for matmul in (DenseLinear, DenseGatedLinear, QuantizedLinear):  # the gated one: SiLU-and-mul included
            matmul.__call__ = timed(matmul.__call__, "matmuls")
    for cls in classes:
        for name in KERNELS:
            if name in vars(cls):  # the class's own, not one it inherits (timed once)
                setattr(cls, name, timed(vars(cls)[name], name))
    write_kv = classes[-1].write_kv  # the chosen set's (timed above)

    def counting_write_kv(self, k, *args):
        if not STEP_TOKENS:
            STEP_TOKENS.append(k.shape[0])
        return write_kv(self, k, *args)

    classes[-1].write_kv = counting_write_kv
    cpu.PackedLinear.__call__ = timed(cpu.PackedLinear.__call__, "matmuls")
    for name in INNER:
        setattr(cpu, name, timed(getattr(cpu, name), "sdpa"))


def workload(name: str, batch: int, rng: random.Random) -> tuple[list[list[int]], list[int]]:
    if name == "decode":
        return random_prompts(rng, [128] * batch), [128] * batch
    lengths = [rng.randint(64, 512) for _ in range(64)]  # engine_throughput.py's offline lengths
    new_tokens = [rng.randint(64, 256) for _ in range(64)]
    return random_prompts(rng, lengths), new_tokens if name == "offline" else [1] * 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=["offline", "prefill", "decode"])
    parser.add_argument("--batch", type=int, default=32, help="decode batch size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kernels", choices=["cpu", "cpu-native"], default="cpu")
    parser.add_argument("--model-dir", type=Path, default=Path.home() / ".cache" / "llmp" / "bench" / "qwen05b-shape")
    parser.add_argument(
        "--traced",
        action="store_true",
        help="replay decode steps from their trace, as the engine does (its kernels are then hidden from the "
        "timers: they count as the rest); by default decode steps run eagerly, so every kernel is timed",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    install_timers(args.kernels)
    from llmp import LLM, SamplingParams

    llm = LLM(
        str(build_model(args.model_dir)),
        dtype="bfloat16",
        kernels=args.kernels,
        max_model_len=1024,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        enforce_eager=not args.traced,
    )
    rng = random.Random(0)
    warmup = random_prompts(rng, [64, 32])
    llm.generate(
        [{"prompt_token_ids": p} for p in warmup], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False
    )
    engine = llm.engine
    prompts, new_tokens = workload(args.workload, args.batch, rng)
    for i, (prompt, new) in enumerate(zip(prompts, new_tokens)):
        engine.add_request(
            f"anatomy-{i}",
            {"prompt_token_ids": prompt},
            SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True),
        )
    steps: list[tuple[float, dict[str, float], int]] = []
    while engine.has_unfinished_requests():
        SECONDS.clear()
        STEP_TOKENS.clear()
        start = time.perf_counter()
        engine.step()
        steps.append((time.perf_counter() - start, dict(SECONDS), sum(STEP_TOKENS)))
    if args.workload == "decode":
        steps = [step for step in steps if step[2] <= args.batch]  # decode-only steps: a token a request
        scale, unit = 1e3 / len(steps), "ms a step"
    else:
        scale, unit = 1.0, "s"
    total = sum(t for t, *_ in steps) * scale
    parts: collections.Counter[str] = collections.Counter()
    for _, seconds, _ in steps:
        parts.update({k: v * scale for k, v in seconds.items()})
    tokens = sum(len(p) for p in prompts)
    print(f"{args.workload} ({args.kernels}): {len(steps)} steps, {tokens} prompt tokens, {total:.2f} {unit}")
    for label, value in parts.most_common():
        inner = label.startswith("sdpa")
        print(f"  {'  ' if inner else ''}{label:20s} {value:9.2f}  {100 * value / total:5.1f}%")
    outside = total - sum(v for k, v in parts.items() if not k.startswith("sdpa"))
    print(f"  {'the rest':20s} {outside:9.2f}  {100 * outside / total:5.1f}%")


if __name__ == "__main__":
    main()
