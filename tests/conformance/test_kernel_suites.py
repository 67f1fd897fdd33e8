"""The kernel-set suite: a set whose attention ignores the sliding window fails naming the kernel, the
case's shapes and the largest error; one that reads cache slots nobody wrote is caught by the NaN
they hold; the float64 formulas the torch set is checked against are themselves right.

The in-repo sets pass it in their own tests (``plugins/kernels/*/tests/test_conformance.py``).
Broken sets are registered in-process, their classes in a module made here.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from llmp import hookimpl, registry
from llmp.api import KernelSetSpec
from llmp.conformance import CheckResult, kernels
from llmp.conformance.runner import Context, _run_check
from llmp.testing import registered

BROKEN_MODULE = "llmp_conformance_broken_kernels"


def broken_kernels_module() -> types.ModuleType:
    from llmp_kernels_torch.kernels import TorchKernels

    class NoWindowKernels(TorchKernels):
        """Attends to every earlier position: the sliding window is dropped."""

        name = "no-window"

        def paged_attention(self, q, k_cache, v_cache, metadata, scale, softcap=None):
            metadata = dataclasses.replace(metadata, sliding_window=None)
            return super().paged_attention(q, k_cache, v_cache, metadata, scale, softcap)

    class StaleSlotKernels(TorchKernels):
        """Writes slot -1 (the cache's last slot) instead of skipping it."""

        name = "stale-slot"

        def write_kv(self, k, v, k_cache, v_cache, slot_mapping):
            k_cache.view(-1, *k_cache.shape[2:])[slot_mapping] = k.to(k_cache.dtype)
            v_cache.view(-1, *v_cache.shape[2:])[slot_mapping] = v.to(v_cache.dtype)

    class LossyBlocksKernels(TorchKernels):
        """Computes Q8_0 blocks with its weights rounded to bfloat16 first."""

        name = "lossy-blocks"

        def pack_quantized(self, weight):
            from llmp.quantization import dequantize

            if weight.format.name != "Q8_0":
                return None
            w = dequantize(weight.blocks, weight.format).to(torch.bfloat16).float()
            return lambda x: (x.float() @ w.T).to(x.dtype)

    class BatchDependentKernels(TorchKernels):
        """Computes Q4_0 blocks with a BLAS matmul, whose summation order follows the batch size."""

        name = "batch-dependent"

        def pack_quantized(self, weight):
            from llmp.quantization import dequantize

            if weight.format.name != "Q4_0":
                return None
            w = dequantize(weight.blocks, weight.format)
            # exact in every order for one row; a batch sums in halves: another rounding
            return lambda x: (
                x.float() @ w.T
                if len(x) == 1
                else x.float()[:, :128] @ w[:, :128].T + x.float()[:, 128:] @ w[:, 128:].T
            ).to(x.dtype)

    module = types.ModuleType(BROKEN_MODULE)
    module.NoWindowKernels, module.StaleSlotKernels = NoWindowKernels, StaleSlotKernels
    module.LossyBlocksKernels, module.BatchDependentKernels = LossyBlocksKernels, BatchDependentKernels
    return module


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(sys.modules, BROKEN_MODULE, broken_kernels_module())
    specs = [
        KernelSetSpec(name="no-window", impl=f"{BROKEN_MODULE}:NoWindowKernels", devices=("cpu",), priority=-1),
        KernelSetSpec(name="stale-slot", impl=f"{BROKEN_MODULE}:StaleSlotKernels", devices=("cpu",), priority=-1),
        KernelSetSpec(name="lossy-blocks", impl=f"{BROKEN_MODULE}:LossyBlocksKernels", devices=("cpu",), priority=-1),
        KernelSetSpec(
            name="batch-dependent", impl=f"{BROKEN_MODULE}:BatchDependentKernels", devices=("cpu",), priority=-1
        ),
    ]
    plugin = type("Plugin", (), {"llmp_register_kernels": hookimpl(lambda self: specs)})()
    with registered(plugin, "broken-kernels"):
        yield


def run_check(component: str, check: str) -> CheckResult:
    with tempfile.TemporaryDirectory() as workdir:
        spec = registry.get_component("kernels", component)
        for found in kernels.suite(spec, Context(Path(workdir))):
            if found.name == check:
                return _run_check("kernels", component, found)
    raise LookupError(check)


def test_attention_without_its_window_fails_naming_the_case_and_the_error(broken):
    result = run_check("no-window", "paged_attention matches the torch set")
    assert result.status == "failed"
    assert re.match(
        r"paged_attention mixed, window 5 \(requests \(cached, new\) \[\(0, 7\), \(5, 6\), \(9, 1\), \(3, 1\)\], "
        r"H=4 Hkv=2 D=16, block 4, window 5, softcap None, float32\): max abs error [\d.e-]+ "
        r"\(at \(\d+, \d+, \d+\): got [-\d.e]+, expected [-\d.e]+\); tolerance atol 1e-05 \+ rtol 1e-05",
        result.detail,
    ), result.detail
    assert run_check("no-window", "rms_norm matches the torch set").status == "passed"


def test_a_write_to_the_skipped_slot_is_caught(broken):
    result = run_check("stale-slot", "write_kv matches the torch set")
    assert result.status == "failed"
    assert result.detail.startswith("write_kv k, v [4, 2, 8] into caches [3, 4, 2, 8] at slots [5, -1, 10, 0]")
    assert "a number where it should leave NaN" in result.detail


QUANTIZED = "pack_quantized computes matmul_reference, a row alike alone and in a batch"


def test_quantised_matmuls_that_lose_precision_or_depend_on_the_batch_fail(broken):
    lossy = run_check("lossy-blocks", QUANTIZED)
    assert lossy.status == "failed"
    assert lossy.detail.startswith("pack_quantized Q8_0 [40, 256], x [64, 256], float32: max abs error")
    batched = run_check("batch-dependent", QUANTIZED)
    assert batched.status == "failed" and "(row invariance)" in batched.detail, batched.detail
    with pytest.raises(LookupError):  # a set without pack_quantized has no such check
        run_check("stale-slot", QUANTIZED)


def test_the_formulas_agree_with_first_principles():
    # the torch set's reference: spot checks against closed forms
    formulas = kernels.FormulaKernels()
    x = torch.tensor([[3.0, -4.0]])
    torch.testing.assert_close(formulas.rms_norm(x, torch.ones(2), 0.0), x / (12.5**0.5))
    torch.testing.assert_close(formulas.silu_and_mul(torch.tensor([[0.0, 5.0]])), torch.tensor([[0.0]]))
    # a quarter turn at position 1 of a two-dimensional head: (1, 0) -> (cos 1, sin 1)
    table = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # [position, cos | sin]: angle 0, then pi / 2
    q, _ = formulas.rotary(torch.tensor([1]), torch.tensor([[[1.0, 0.0]]]), torch.zeros(1, 1, 2), table)
    torch.testing.assert_close(q, torch.tensor([[[0.0, 1.0]]]))
