"""The bfloat16 matmul paths of the CPU kernel sets side by side, on the Qwen2.5-0.5B shapes of the engine benchmark.

    .venv/bin/python benchmarks/matmul_paths.py                 # rows 1, 8, 32, 256, 2048; 2 threads
    .venv/bin/python benchmarks/matmul_paths.py --rows 1,2048 --rounds 5 --json out.json

Each path computes one layer's four matmuls (q|k|v 1152x896, o 896x896, gate|up 9728x896, down 896x4864) on
the same rows, the paths taking turns, best of rounds; the weights of 24 layers are cycled through so that
they come from memory as in a model step. Printed: ms per layer and GFLOP/s per path and row count, and each
path against oneDNN called on all rows at once (what vLLM's CPU build does, whose rows are not batch-invariant):

- ``onednn``: the cpu set's packed oneDNN matmul on all rows at once (not row-invariant: the reference speed);
- ``onednn 32-row blocks``: the same in padded 32-row blocks, as the cpu set calls it (row-invariant); where
  oneDNN has no bfloat16 matmul (AVX2 CPUs) both multiply the cpu set's float32 copy (``UpcastLinear``);
- ``pairs``: cpu-native's ``vdpbf16ps`` path (AVX-512 BF16 CPUs);
- ``avx2 pairs``: cpu-native's AVX2 form of the pairs (any AVX2 CPU);
- ``amx tiles``: cpu-native's AMX tile path (CPUs with AMX-BF16, after its start-up check).

Record the CPU (``lscpu``) with the figures: docs/benchmarks.md, "bfloat16 matmul paths".
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

SHAPES = [("qkv", 1152, 896), ("o", 896, 896), ("gate_up", 9728, 896), ("down", 896, 4864)]  # (name, N, K)
LAYERS = 24


def paths() -> dict:
    """path name -> function(weight [N, K]) -> (matmul x -> y)."""
    from llmp_kernels_cpu.kernels import PackedLinear, UpcastLinear

    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        found = {
            "onednn": lambda w: PackedLinear(w, None).matmul,  # one call on all rows
            "onednn 32-row blocks": lambda w: PackedLinear(w, None),  # its call makes the blocks
        }
    else:  # the float32 copy, the input widened, the output rounded back
        found = {
            "onednn": lambda w: (lambda m: lambda x: m.matmul(x.float()).to(x.dtype))(UpcastLinear(w, None)),
            "onednn 32-row blocks": lambda w: UpcastLinear(w, None),
        }
    try:
        from llmp_kernels_cpu_native.library import dense_supported
    except Exception:  # the compiled set is not installed or not built: oneDNN only
        return found
    if not dense_supported():
        return found

    def on(path: str):
        def pack(w: torch.Tensor):
            panels, n = torch.ops.llmp_native.dense_pack(w), w.shape[0]
            return lambda x: torch.ops.llmp_native.dense_matmul_with(x, panels, n, None, path)

        return pack

    from llmp_kernels_cpu_native.library import dense_path

    if dense_path() != "avx2 pairs":  # AVX-512 BF16 here
        found["pairs"] = on("avx512-bf16 pairs")
    found["avx2 pairs"] = on("avx2 pairs")
    # the tiles where their start-up check passes (it runs them in a child process: a refused one is a reason)
    why_not = torch.ops.llmp_native.amx_tiles_unusable() or torch.ops.llmp_native.amx_tiles_check()
    if why_not == "":
        found["amx tiles"] = on("amx tiles")
    elif torch.ops.llmp_native.has_amx():
        print(f"amx tiles left out: {why_not}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,8,32,256,2048")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    weights = [[torch.randn(n, k).bfloat16() for _, n, k in SHAPES] for _ in range(LAYERS)]
    found = paths()
    packed = {name: [[pack(w) for w in layer] for layer in weights] for name, pack in found.items()}
    del weights
    rows_list = [int(r) for r in args.rows.split(",")]
    flops_per_row = 2 * sum(n * k for _, n, k in SHAPES)
    print(f"{platform.processor() or platform.machine()}, {args.threads} threads, paths: {', '.join(found)}")
    results: dict[str, dict[str, float]] = {}
    for rows in rows_list:
        inputs = {k: torch.randn(rows, k).bfloat16() for _, _, k in SHAPES}
        best = dict.fromkeys(found, float("inf"))
        for _ in range(args.rounds):
            for name in found:  # turns: each path once a round
                start = time.perf_counter()
                for layer in packed[name]:
                    for (_, _, k), matmul in zip(SHAPES, layer, strict=True):
                        matmul(inputs[k])
                best[name] = min(best[name], (time.perf_counter() - start) / LAYERS)
        results[str(rows)] = best
        for name, seconds in best.items():
            ratio = best["onednn"] / seconds
            gflops = flops_per_row * rows / seconds / 1e9
            print(
                f"rows {rows:5d}  {name:22s} {seconds * 1e3:8.3f} ms a layer  {gflops:7.1f} GFLOP/s",
                f"{ratio:5.2f}x onednn",
            )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {
                    "threads": args.threads,
                    "ms_per_layer": {r: {p: s * 1e3 for p, s in b.items()} for r, b in results.items()},
                },
                out,
                indent=1,
            )


if __name__ == "__main__":
    main()
