"""The kernel-set suite: every kernel a set provides against the reference, then the engine with the set.

The reference is the ``torch`` kernel set (``llmp-kernels-torch``); the torch set itself is checked
against float64 formulas (:class:`FormulaKernels`). Each kernel runs over the shapes the engine
gives it: float32 and bfloat16, head sizes 16 and 64, grouped-query ratios 1:2 and 1:4, blocks of 4
and 16 tokens, prefills, chunks after a cached prefix, decodes and mixed batches, sliding windows
and soft-capping. Caches start filled with NaN, so a kernel that reads a slot nobody wrote shows it.
Optional parts are checked when the set has them: ``lora_shrink``/``lora_expand`` (``LoRAKernels``),
``pack_linear`` (``PacksLinear``) and ``pack_quantized`` (``PacksQuantized``: every GGML format the set
computes against ``llmp.quantization.matmul_reference``, and a row alone bit for bit as in a batch).
Last, a tiny Llama's greedy tokens with the set equal those
with the torch set (chunked prefill and prefix-cache hits included).

A set that runs only on CUDA is checked on a machine without one under Triton's interpreter
(``TRITON_INTERPRET=1``, set here before the set is loaded when triton is not imported yet), on a
smaller grid: the interpreter runs a kernel's every program in Python.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from llmp.api import AttentionMetadata, KernelSetSpec
from llmp.conformance.runner import Check, Context, SkipCheck
from llmp.conformance.tiny_models import once_or_raise

__all__ = ["FormulaKernels", "suite"]

DTYPES = ("float32", "bfloat16")
KERNELS = ("rms_norm", "rotary", "silu_and_mul", "gelu_tanh_and_mul", "write_kv", "paged_attention")
# absolute and relative tolerance by dtype name (the in-repo sets' own tests use these)
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}
ENGINE_TOKENS = 8


def suite(spec: KernelSetSpec, context: Context) -> Iterator[Check]:
    checks = _SetChecks(spec, context)
    yield Check("loads and has every kernel of the KernelSet contract", checks.contract)
    for kernel in KERNELS:
        yield Check(f"{kernel} matches {checks.reference_name}", checks.kernel_check(kernel))
    if checks.has("lora_shrink") or checks.has("lora_expand"):
        yield Check(f"lora_shrink and lora_expand match {checks.reference_name}", checks.lora)
    if checks.has("pack_linear"):
        yield Check("pack_linear computes F.linear", checks.pack_linear)
    if checks.has("pack_quantized"):
        yield Check("pack_quantized computes matmul_reference, a row alike alone and in a batch", checks.pack_quantized)
    against = "transformers'" if spec.name == "torch" else "the torch set's"
    yield Check(f"engine greedy tokens of a tiny Llama equal {against}", checks.engine_parity)


# -- the cases --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionCase:
    """A batch of requests, each ``(cached tokens, new tokens)``, over a paged cache."""

    name: str
    requests: tuple[tuple[int, int], ...]
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    block_size: int = 4
    window: int | None = None
    softcap: float | None = None

    def describe(self, dtype: str) -> str:
        return (
            f"{self.name} (requests (cached, new) {list(self.requests)}, H={self.heads} Hkv={self.kv_heads} "
            f"D={self.head_dim}, block {self.block_size}, window {self.window}, softcap {self.softcap}, {dtype})"
        )


PREFILL = ((0, 7), (0, 12))
PREFIX = ((5, 6), (9, 4), (16, 1))
DECODE = ((9, 1), (3, 1), (17, 1), (0, 1))
MIXED = ((0, 7), (5, 6), (9, 1), (3, 1))
ATTENTION_CASES = (
    AttentionCase("prefill", PREFILL),
    AttentionCase("cached prefix", PREFIX),
    AttentionCase("decode", DECODE),
    AttentionCase("mixed", MIXED),
    AttentionCase("mixed, GQA 1:4", MIXED, kv_heads=1),
    AttentionCase("mixed, blocks of 16", MIXED, block_size=16),
    AttentionCase("decode, GQA 1:4, blocks of 16", DECODE, kv_heads=1, block_size=16),
    AttentionCase("mixed, head size 64", MIXED, head_dim=64),
    AttentionCase("mixed, window 5", MIXED, window=5),
    AttentionCase("cached prefix, window 3, blocks of 16", PREFIX, kv_heads=1, block_size=16, window=3),
    AttentionCase("mixed, soft-cap", MIXED, softcap=5.0),
    AttentionCase("mixed, window and soft-cap", MIXED, window=4, softcap=5.0),
    AttentionCase("several key tiles", ((60, 20), (70, 1))),
)
# bfloat16 on the cases whose masks and caps matter most (against the float32 reference)
BF16_ATTENTION = ("mixed", "decode, GQA 1:4, blocks of 16", "mixed, window and soft-cap")
INTERPRETED_ATTENTION = ("mixed", "mixed, GQA 1:4", "decode, GQA 1:4, blocks of 16", "mixed, head size 64")
INTERPRETED_ATTENTION += ("cached prefix, window 3, blocks of 16", "mixed, window and soft-cap", "several key tiles")


class _SetChecks:
    """The checks of one kernel set; the set, loaded once, is shared through the context."""

    def __init__(self, spec: KernelSetSpec, context: Context) -> None:
        self.spec, self.context = spec, context
        self.reference_name = "float64 formulas" if spec.name == "torch" else "the torch set"

    # -- loading --------------------------------------------------------------------------------

    def device(self) -> str:
        import torch

        return "cuda" if "cuda" in self.spec.devices and torch.cuda.is_available() else "cpu"

    def interpreted(self) -> bool:
        """A CUDA-only set on a machine without CUDA: it runs (if at all) under Triton's interpreter."""
        return self.device() == "cpu" and "cpu" not in self.spec.devices

    def kernels(self) -> Any:
        def load() -> Any:
            if self.interpreted() and "triton" not in sys.modules:
                os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported: before the set loads
            try:
                return self.spec.load()()
            except Exception as exc:
                if self.interpreted():
                    raise SkipCheck(
                        f"{self.spec.name} runs on {', '.join(self.spec.devices)} and this machine has no CUDA "
                        f"device; it did not start on the CPU either ({type(exc).__name__}: {exc})"
                    ) from exc
                raise

        return once_or_raise(self.context, f"kernels:{self.spec.plugin}:{self.spec.name}", load)

    def has(self, method: str) -> bool:
        try:
            return callable(getattr(self.kernels(), method, None))
        except Exception:  # the contract check says why it does not load
            return False

    def reference(self) -> Any:
        from llmp import registry

        if self.spec.name == "torch":
            return FormulaKernels()
        if "torch" not in registry.components("kernels"):
            raise SkipCheck("the torch reference kernel set (llmp-kernels-torch) is not installed")
        return registry.load_component("kernels", "torch")()

    def contract(self) -> None:
        kernels = self.kernels()
        missing = [name for name in KERNELS if not callable(getattr(kernels, name, None))]
        if missing:
            raise AssertionError(f"{type(kernels).__name__} lacks {', '.join(missing)} of llmp.api.KernelSet")
        if getattr(kernels, "name", None) != self.spec.name:
            raise AssertionError(
                f"{type(kernels).__name__}.name is {getattr(kernels, 'name', None)!r}; "
                f"the engine reports the set by it: make it {self.spec.name!r}"
            )

    # -- kernels ---------------------------------------------------------------------------------

    def kernel_check(self, kernel: str) -> Callable[[], None]:
        def run() -> None:
            import torch

            ours, reference = self.kernels(), self.reference()
            generator = torch.Generator().manual_seed(0)
            cases = getattr(self, f"_{kernel}_cases")(generator)
            for label, call in cases:
                expected = call(reference)
                _compare(kernel, label, call(ours), expected)

        return run

    def tensor(self, generator: Any, *shape: int, dtype: str = "float32") -> Any:
        import torch

        return torch.randn(*shape, generator=generator).to(self.device(), getattr(torch, dtype))

    def _rms_norm_cases(self, generator: Any) -> Iterator[tuple[str, Callable[[Any], Any]]]:
        shapes = ((5, 64),) if self.interpreted() else ((5, 64), (7, 48))
        for dtype in DTYPES:
            for rows, size in shapes:
                x, residual = (
                    self.tensor(generator, rows, size, dtype=dtype),
                    self.tensor(generator, rows, size, dtype=dtype),
                )
                weight = self.tensor(generator, size, dtype=dtype)
                yield f"x [{rows}, {size}] {dtype}", lambda k, x=x, w=weight: k.rms_norm(x, w, 1e-6)
                label = f"x and residual [{rows}, {size}] {dtype} (returns normed, x + residual)"
                yield label, lambda k, x=x, w=weight, r=residual: k.rms_norm(x, w, 1e-5, r)

    def _rotary_cases(self, generator: Any) -> Iterator[tuple[str, Callable[[Any], Any]]]:
        import torch

        from llmp.modeling.rope import cos_sin_table

        positions = torch.tensor([0, 3, 7, 100, 5], device=self.device())
        for dtype in DTYPES:
            for head_dim, rotary_dim in ((16, 16), (16, 8), (64, 64)):
                # q and k as views of a fused projection's output (rows wider than the heads), as models pass them
                qkv = self.tensor(generator, 5, (4 + 2 + 2) * head_dim, dtype=dtype)
                table = cos_sin_table(rotary_dim, 128, 10000.0).to(self.device())

                def call(kernels: Any, qkv: Any = qkv, d: int = head_dim, table: Any = table) -> Any:
                    fused = qkv.clone()  # each set its own copy, in case it rotates in place
                    q, k = fused[:, : 4 * d].view(5, 4, d), fused[:, 4 * d : 6 * d].view(5, 2, d)
                    return kernels.rotary(positions, q, k, table)

                yield (
                    f"q [5, 4, {head_dim}], k [5, 2, {head_dim}] (strided views), rotary dim {rotary_dim}, {dtype}",
                    call,
                )

    def _activation_cases(self, kernel: str, generator: Any) -> Iterator[tuple[str, Callable[[Any], Any]]]:
        shapes = ((3, 40),) if self.interpreted() else ((3, 40), (2, 3000))  # one row, several column blocks
        for dtype in DTYPES:
            for rows, width in shapes:
                x = self.tensor(generator, rows, width, dtype=dtype) * 3
                yield f"x [{rows}, {width}] {dtype}", lambda kernels, x=x: getattr(kernels, kernel)(x)

    def _silu_and_mul_cases(self, generator: Any) -> Iterator[tuple[str, Callable[[Any], Any]]]:
        return self._activation_cases("silu_and_mul", generator)

    def _gelu_tanh_and_mul_cases(self, generator: Any) -> Iterator[tuple[str, Callable[[Any], Any]]]:
        return self._activation_cases("gelu_tanh_and_mul", generator)

    def _write_kv_cases(self, generator: Any) -> Iterator[tuple[str, Callable[[Any], Any]]]:
        import torch

        # (k and v's dtype, the caches'): a float32 model's 16-bit cache (--kv-cache-dtype) rounds each value once
        for dtype, cache_dtype in (*((d, d) for d in DTYPES), ("float32", "bfloat16"), ("float32", "float16")):
            for blocks, block_size in ((3, 4), (2, 16)):
                k, v = self.tensor(generator, 4, 2, 8, dtype=dtype), self.tensor(generator, 4, 2, 8, dtype=dtype)
                slots = torch.tensor(
                    [5, -1, blocks * block_size - 2, 0], device=self.device()
                )  # the last slot stays NaN

                def call(
                    kernels: Any,
                    k: Any = k,
                    v: Any = v,
                    slots: Any = slots,
                    shape: Any = (blocks, block_size),
                    cache_dtype: Any = getattr(torch, cache_dtype),
                ) -> Any:
                    full = (*shape, 2, 8)
                    caches = [torch.full(full, float("nan"), dtype=cache_dtype, device=k.device) for _ in "kv"]
                    kernels.write_kv(k, v, caches[0], caches[1], slots)
                    return tuple(caches)

                into = dtype if cache_dtype == dtype else f"{dtype} into a {cache_dtype} cache"
                yield (
                    f"k, v [4, 2, 8] into caches [{blocks}, {block_size}, 2, 8] at slots {slots.tolist()}, {into}",
                    call,
                )

    def _paged_attention_cases(self, generator: Any) -> Iterator[tuple[str, Callable[[Any], Any]]]:
        cases = [c for c in ATTENTION_CASES if not self.interpreted() or c.name in INTERPRETED_ATTENTION]
        bf16 = BF16_ATTENTION[:1] if self.interpreted() else BF16_ATTENTION
        for case in cases:
            for dtype in ("float32", "bfloat16") if case.name in bf16 else ("float32",):
                q, k_cache, v_cache, metadata = _attention_batch(case, dtype, self.device(), generator)
                scale = 4 / math.sqrt(case.head_dim)  # sharper than uniform: masks and caps change the output
                inputs = (q, k_cache, v_cache, metadata, scale, case.softcap)

                def call(kernels: Any, inputs: tuple = inputs) -> Any:
                    q, k_cache, v_cache, metadata, scale, softcap = inputs
                    if kernels is self.kernels():
                        return kernels.paged_attention(q, k_cache, v_cache, metadata, scale, softcap=softcap)
                    # the reference in float32 on the same values: half precision's own rounding is the tested set's
                    upcast = (t.float() for t in (q, k_cache, v_cache))
                    return kernels.paged_attention(*upcast, metadata, scale, softcap=softcap).to(q.dtype)

                yield case.describe(dtype), call
            if case.name in bf16[:1]:  # float32 queries over a 16-bit cache (--kv-cache-dtype): its values widen
                q, k_cache, v_cache, metadata = _attention_batch(case, "bfloat16", self.device(), generator)
                inputs = (q.float(), k_cache, v_cache, metadata, 4 / math.sqrt(case.head_dim), case.softcap)

                def mixed(kernels: Any, inputs: tuple = inputs) -> Any:
                    q, k_cache, v_cache, metadata, scale, softcap = inputs
                    if kernels is not self.kernels():
                        k_cache, v_cache = k_cache.float(), v_cache.float()
                    return kernels.paged_attention(q, k_cache, v_cache, metadata, scale, softcap=softcap)

                yield case.describe("float32") + " over a bfloat16 cache", mixed

    # -- optional parts --------------------------------------------------------------------------

    def lora(self) -> None:
        import torch

        from llmp.modeling.lora import lora_mapping

        ours, reference = self.kernels(), self.reference()
        if not hasattr(reference, "lora_shrink"):
            raise SkipCheck("the reference set has no LoRA kernels")
        generator = torch.Generator().manual_seed(1)
        slots_count, rank, size_in, size_out = 4, 16, 96, 200
        token_counts = (7,) if self.interpreted() else (1, 7, 45)
        for dtype in DTYPES:
            a = self.tensor(generator, slots_count, rank, size_in, dtype=dtype) / size_in**0.5
            b = self.tensor(generator, slots_count, size_out, rank, dtype=dtype) / rank**0.5
            a[2, rank // 2 :] = 0  # slot 2 holds a lower-rank adapter, zero-padded
            b[2, :, rank // 2 :] = 0
            for tokens in token_counts:
                slots = torch.randint(-1, slots_count, (tokens,), generator=generator).tolist()
                slots[0] = max(slots[0], 0)  # a row with an adapter (else there is nothing to do)
                mapping = lora_mapping(slots, self.device())
                x, y = (
                    self.tensor(generator, tokens, size_in, dtype=dtype),
                    self.tensor(generator, tokens, size_out, dtype=dtype),
                )
                label = f"x [{tokens}, {size_in}], A [{slots_count}, {rank}, {size_in}], slots {slots}, {dtype}"
                shrunk = reference.lora_shrink(x, a, mapping)
                _compare("lora_shrink", label, ours.lora_shrink(x, a, mapping), shrunk)
                expanded = [y.clone(), y.clone()]
                ours.lora_expand(expanded[0], shrunk, b, mapping)
                reference.lora_expand(expanded[1], shrunk, b, mapping)
                label = f"y [{tokens}, {size_out}] += s [{len(mapping.rows)}, {rank}] @ B[slot].T, {dtype}"
                _compare("lora_expand", label, expanded[0], expanded[1])

    def pack_linear(self) -> None:
        import torch
        import torch.nn.functional as F

        kernels = self.kernels()
        generator = torch.Generator().manual_seed(2)
        for dtype in DTYPES:
            for bias in (False, True):
                weight = self.tensor(generator, 96, 64, dtype=dtype)
                b = self.tensor(generator, 96, dtype=dtype) if bias else None
                packed = kernels.pack_linear(weight, b)
                if packed is None:
                    continue  # the set leaves this layer on F.linear
                for rows in (1, 3, 32, 300):
                    x = self.tensor(generator, rows, 64, dtype=dtype)
                    expected = F.linear(x.float(), weight.float(), None if b is None else b.float()).to(x.dtype)
                    label = f"weight [96, 64]{' with bias' if bias else ''}, x [{rows}, 64], {dtype}"
                    _compare("pack_linear", label, packed(x), expected, atol=0.1 if dtype != "float32" else None)

    def pack_quantized(self) -> None:
        import torch

        from llmp.quantization import GGML_FORMATS, QuantizedWeight, dequantize, matmul_reference, quantize

        kernels = self.kernels()
        generator = torch.Generator().manual_seed(3)
        rows = (1, 3, 9) if self.interpreted() else (1, 3, 17, 64)
        computed = []
        for name, fmt in GGML_FORMATS.items():
            in_features = 256  # a whole number of blocks of every format
            dense = torch.randn(40, in_features, generator=generator)
            weight = QuantizedWeight(quantize(dense, fmt).to(self.device()), fmt, in_features)
            matmul = kernels.pack_quantized(weight)
            if matmul is None:
                continue  # the layer dequantises this format
            computed.append(name)
            w = dequantize(weight.blocks.cpu(), fmt).double()
            batch = None
            for dtype in DTYPES:
                x = self.tensor(generator, max(rows), in_features, dtype=dtype)
                got = matmul(x)
                expected = matmul_reference(x.float().cpu(), weight.blocks.cpu(), fmt)  # not yet rounded to x's
                label = f"{name} [40, {in_features}], x [{max(rows)}, {in_features}], {dtype}"
                if got.shape != expected.shape or got.dtype != x.dtype:
                    raise AssertionError(
                        f"pack_quantized {label}: returned {got.dtype} {list(got.shape)}, "
                        f"expected {x.dtype} {list(expected.shape)}"
                    )
                # float32 sums of in_features products in any fixed order, then one rounding to x's dtype
                magnitude = x.double().cpu().abs() @ w.abs().T
                unit = torch.finfo(x.dtype).eps / 2
                bound = 2 * in_features * 2.0**-24 * magnitude + unit * expected.double().abs() + 1e-30
                error = (got.double().cpu() - expected.double()).abs()
                if bool((error > bound).any()):
                    raise AssertionError(
                        f"pack_quantized {label}: max abs error {error.max().item():.3g} beyond float32 accumulation"
                    )
                if dtype == "float32":
                    batch = (x, got)
            x, whole = batch
            for count in rows:  # the contract: a row's result does not depend on its batch
                for start in (0, max(rows) - count):
                    alone = matmul(x[start : start + count])
                    if not torch.equal(alone, whole[start : start + count]):
                        raise AssertionError(
                            f"pack_quantized {name}: rows {start}..{start + count - 1} computed as a batch of "
                            f"{count} differ from the same rows in a batch of {max(rows)} (row invariance)"
                        )
        if not computed:
            raise SkipCheck("pack_quantized computes no GGML format on this machine (every one is dequantised)")

    # -- the engine ------------------------------------------------------------------------------

    def engine_parity(self) -> None:
        from llmp import registry
        from llmp.conformance.tiny_models import first_divergence, run_greedy, save_tiny_architecture

        self.kernels()  # skips, saying why, where the set cannot run here
        if registry.components("model").get("LlamaForCausalLM") is None:
            raise SkipCheck("no plugin serves LlamaForCausalLM (llmp-models-llama is not installed)")
        tiny = once_or_raise(
            self.context,
            "kernels:tiny-llama",
            lambda: save_tiny_architecture(self.context.workdir / "kernels-llama", "LlamaForCausalLM"),
        )
        if self.interpreted():  # every step costs seconds: two short prompts, whole, a few tokens, one run
            prompts = [p[:12] for p in tiny.prompts(2, shared_prefix=8, seed=3)]
            new_tokens, options, batches = 3, dict(device=self.device()), [prompts]
        else:  # a shared prefix (hits in the second run) and 16-token steps: chunks after cached blocks
            prompts = tiny.prompts(3, shared_prefix=8, seed=3)
            new_tokens, options = ENGINE_TOKENS, dict(device=self.device(), max_num_batched_tokens=16)
            batches = [prompts, prompts]
        runs = run_greedy(tiny.path, batches, new_tokens, kernels=self.spec.name, **options)
        first = runs[0]
        if first.kernels != self.spec.name:
            raise AssertionError(f"the engine asked for kernels={self.spec.name!r} ran {first.kernels!r}")
        if self.spec.name == "torch":
            from llmp.testing import hf_greedy

            expected, against = [hf_greedy(tiny.reference, p, new_tokens) for p in prompts], "transformers"
        else:
            if "torch" not in registry.components("kernels"):
                raise SkipCheck("the torch reference kernel set (llmp-kernels-torch) is not installed")
            [reference] = run_greedy(tiny.path, [prompts], new_tokens, kernels="torch", **options)
            expected, against = reference.tokens, "the torch set"
        for run, what in zip(runs, ("the first run", "the second run (prefix-cache hits)"), strict=False):
            message = first_divergence(
                prompts, run.tokens, expected, what=f"{what} with {self.spec.name}", against=against
            )
            if message:
                raise AssertionError(message)


# -- helpers ----------------------------------------------------------------------------------


def _attention_batch(case: AttentionCase, dtype: str, device: str, generator: Any) -> tuple[Any, Any, Any, Any]:
    """q, NaN-filled caches holding every request's keys and values in scattered blocks, and the metadata.
    Table columns past a request's blocks point at a block nobody writes (NaN)."""
    import torch

    torch_dtype = getattr(torch, dtype)
    size = case.block_size
    blocks_of = [-(-(cached + new) // size) for cached, new in case.requests]
    num_blocks = sum(blocks_of) + 3
    shape = (num_blocks, size, case.kv_heads, case.head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=torch_dtype)
    v_cache = torch.full(shape, float("nan"), dtype=torch_dtype)
    free = torch.randperm(num_blocks, generator=generator).tolist()
    unused = free.pop()
    tables, seq_lens, starts, slots, queries = [], [], [0], [], []
    for (cached, new), count in zip(case.requests, blocks_of, strict=True):
        total = cached + new
        blocks = [free.pop() for _ in range(count)]
        for position in range(total):
            block, offset = blocks[position // size], position % size
            k_cache[block, offset] = torch.randn(case.kv_heads, case.head_dim, generator=generator).to(torch_dtype)
            v_cache[block, offset] = torch.randn(case.kv_heads, case.head_dim, generator=generator).to(torch_dtype)
        slots += [blocks[p // size] * size + p % size for p in range(cached, total)]
        queries.append(torch.randn(new, case.heads, case.head_dim, generator=generator).to(torch_dtype))
        tables.append(blocks + [unused] * (max(blocks_of) + 1 - count))
        seq_lens.append(total)
        starts.append(starts[-1] + new)
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        max_query_len=max(new for _, new in case.requests),
        max_seq_len=max(seq_lens),
        sliding_window=case.window,
    )
    return torch.cat(queries).to(device), k_cache.to(device), v_cache.to(device), metadata


# kernels whose output is their inputs' values, each rounded once to the output's dtype: the same bits as the reference
EXACT_KERNELS = ("write_kv",)


def _compare(kernel: str, case: str, got: Any, expected: Any, *, atol: float | None = None) -> None:
    """Raise AssertionError naming the kernel, the case (its shapes) and the largest error (any, for
    :data:`EXACT_KERNELS`)."""
    import torch

    if isinstance(expected, tuple):
        if not isinstance(got, tuple) or len(got) != len(expected):
            raise AssertionError(f"{kernel} {case}: returned {type(got).__name__}, expected a tuple of {len(expected)}")
        for index, (part, reference) in enumerate(zip(got, expected, strict=True)):
            _compare(kernel, f"{case}, output {index}", part, reference, atol=atol)
        return
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{kernel} {case}: returned {type(got).__name__}, expected a tensor")
    if got.shape != expected.shape or got.dtype != expected.dtype:
        raise AssertionError(
            f"{kernel} {case}: returned {got.dtype} {list(got.shape)}, expected {expected.dtype} {list(expected.shape)}"
        )
    nan_got, nan_expected = got.isnan(), expected.isnan()
    if not torch.equal(nan_got, nan_expected):
        where = tuple(int(i) for i in torch.nonzero(nan_got != nan_expected)[0])
        what = "NaN (a read of a cache slot nobody wrote?)" if nan_got[where] else "a number where it should leave NaN"
        raise AssertionError(f"{kernel} {case}: {what} at index {where}")
    dtype = str(expected.dtype).removeprefix("torch.")
    tolerance = 0.0 if kernel in EXACT_KERNELS else TOLERANCE.get(dtype, 2e-3)
    absolute = tolerance if atol is None else atol
    got64, expected64 = got.double().nan_to_num(), expected.double().nan_to_num()
    error = (got64 - expected64).abs()
    bound = absolute + tolerance * expected64.abs()
    if bool((error > bound).any()):
        index = tuple(int(i) for i in torch.nonzero(error - bound == (error - bound).max())[0])
        raise AssertionError(
            f"{kernel} {case}: max abs error {error.max().item():.3g} (at {index}: got {got64[index].item():.6g}, "
            f"expected {expected64[index].item():.6g}); tolerance atol {absolute:g} + rtol {tolerance:g}·|expected|"
        )


# -- the torch set's own reference ----------------------------------------------------------------


class FormulaKernels:
    """Every kernel from its formula, in float64 (results in the inputs' dtype): what the torch set,
    the reference of every other set, is checked against."""

    name = "formulas"

    def rms_norm(self, x: Any, weight: Any, eps: float, residual: Any = None) -> Any:
        import torch

        summed = x + residual if residual is not None else x  # the residual stream in x's dtype, as models add it
        x64 = summed.double()
        out = (weight.double() * x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps)).to(x.dtype)
        return out if residual is None else (out, summed)

    def rotary(self, positions: Any, q: Any, k: Any, cos_sin: Any) -> tuple[Any, Any]:
        # neox layout: the rotated dims are two halves; dims past the table's width pass through
        cos, sin = cos_sin[positions].double().unsqueeze(1).chunk(2, dim=-1)

        def rotate(x: Any) -> Any:
            import torch

            half = cos.shape[-1]
            x1, x2, rest = x[..., :half].double(), x[..., half : 2 * half].double(), x[..., 2 * half :]
            rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
            return torch.cat((rotated, rest), dim=-1)

        return rotate(q), rotate(k)

    def silu_and_mul(self, x: Any) -> Any:
        gate, up = x.double().chunk(2, dim=-1)
        return (gate / (1 + (-gate).exp()) * up).to(x.dtype)

    def gelu_tanh_and_mul(self, x: Any) -> Any:
        gate, up = x.double().chunk(2, dim=-1)
        inner = math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)
        return (0.5 * gate * (1 + inner.tanh()) * up).to(x.dtype)

    def write_kv(self, k: Any, v: Any, k_cache: Any, v_cache: Any, slot_mapping: Any) -> None:
        size = k_cache.shape[1]
        for row, slot in enumerate(slot_mapping.tolist()):
            if slot >= 0:
                k_cache[slot // size, slot % size] = k[row]
                v_cache[slot // size, slot % size] = v[row]

    def paged_attention(
        self, q: Any, k_cache: Any, v_cache: Any, metadata: AttentionMetadata, scale: float, softcap: Any = None
    ) -> Any:
        import torch

        out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
        size, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
        starts, lens = metadata.query_start_loc.tolist(), metadata.seq_lens.tolist()
        for request, seq_len in enumerate(lens):
            table = metadata.block_tables[request].tolist()
            slots = [(table[p // size], p % size) for p in range(seq_len)]
            keys = torch.stack([k_cache[b, o] for b, o in slots]).double().repeat_interleave(group, dim=1)
            values = torch.stack([v_cache[b, o] for b, o in slots]).double().repeat_interleave(group, dim=1)
            rows = range(starts[request], starts[request + 1])
            first = seq_len - len(rows)
            for offset, row in enumerate(rows):
                position = first + offset
                low = 0 if metadata.sliding_window is None else max(0, position - metadata.sliding_window + 1)
                scores = torch.einsum("hd,lhd->hl", q[row].double(), keys[low : position + 1]) * scale
                if softcap is not None:
                    scores = softcap * torch.tanh(scores / softcap)
                out[row] = torch.einsum("hl,lhd->hd", scores.softmax(-1), values[low : position + 1])
        return out.to(q.dtype)

    def lora_shrink(self, x: Any, a: Any, mapping: Any) -> Any:
        rows, slots = mapping.rows.tolist(), _row_slots(mapping)
        out = x.new_empty(len(rows), a.shape[1])
        for j, (row, slot) in enumerate(zip(rows, slots, strict=True)):
            out[j] = (x[row].double() @ a[slot].double().T).to(x.dtype)
        return out

    def lora_expand(self, y: Any, s: Any, b: Any, mapping: Any) -> None:
        for j, (row, slot) in enumerate(zip(mapping.rows.tolist(), _row_slots(mapping), strict=True)):
            y[row] = (y[row].double() + s[j].double() @ b[slot].double().T).to(y.dtype)


def _row_slots(mapping: Any) -> Sequence[int]:
    """The slot of each of ``mapping.rows``, in order."""
    return [slot for slot, count in zip(mapping.group_slots, mapping.group_sizes, strict=True) for _ in range(count)]
