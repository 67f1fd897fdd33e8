"""The cpu set's LoRA shrink/expand (all slots in one matmul where the stacked rank is small): equal to the
torch reference, and row-invariant (a row's bits are the same alone as in a batch of other rows and adapters)."""

from __future__ import annotations

import pytest
import torch
from llmp_kernels_cpu.kernels import CpuKernels
from llmp_kernels_torch.kernels import TorchKernels

from llmp.api import LoRAKernels, LoRAMapping
from llmp.modeling.lora import lora_mapping

REF = TorchKernels()
IN, OUT = 96, 200
# (slots, rank): the one-matmul path, and past its width the reference's per-adapter calls
SHAPES = [(4, 16), (8, 48)]


def mapping_for(slots: list[int]) -> LoRAMapping:
    mapping = lora_mapping(slots, "cpu")
    assert mapping is not None, "every case has a row with a slot"
    return mapping


def weights(slots: int, rank: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(slots * rank)
    a = torch.randn(slots, rank, IN, generator=generator) / IN**0.5
    b = torch.randn(slots, OUT, rank, generator=generator) / rank**0.5
    a[1, rank // 2 :], b[1, :, rank // 2 :] = 0, 0  # slot 1 holds a lower-rank adapter, zero-padded
    return a.to(dtype), b.to(dtype)


def batch(tokens: int, slots: int, dtype: torch.dtype, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    generator = torch.Generator().manual_seed(seed)
    slot_list = torch.randint(-1, slots, (tokens,), generator=generator).tolist()
    slot_list[0] = max(slot_list[0], 0)  # at least one row with a slot (else no mapping)
    x, y = torch.randn(tokens, IN, generator=generator), torch.randn(tokens, OUT, generator=generator)
    return x.to(dtype), y.to(dtype), slot_list


def lora(kernels, x, y, a, b, mapping) -> tuple[torch.Tensor, torch.Tensor]:
    s = kernels.lora_shrink(x, a, mapping)
    out = y.clone()
    kernels.lora_expand(out, s, b, mapping)
    return s, out


def test_the_cpu_set_has_the_lora_kernels():
    assert isinstance(CpuKernels(), LoRAKernels)


@pytest.mark.parametrize(("slots", "rank"), SHAPES)
@pytest.mark.parametrize("tokens", [1, 9, 45, 100])
def test_equal_to_the_torch_reference_and_a_per_row_formula(slots, rank, tokens):
    a, b = weights(slots, rank, torch.float32)
    x, y, slot_list = batch(tokens, slots, torch.float32, seed=tokens)
    mapping = mapping_for(slot_list)
    s, out = lora(CpuKernels(), x, y, a, b, mapping)
    s_ref, out_ref = lora(REF, x, y, a, b, mapping)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out, out_ref, rtol=1e-6, atol=1e-6)
    for j, row in enumerate(mapping.rows.tolist()):
        slot = slot_list[row]
        expected = y[row].double() + x[row].double() @ a[slot].double().T @ b[slot].double().T
        torch.testing.assert_close(out[row].double(), expected, rtol=1e-5, atol=1e-5)
    base = [r for r, slot in enumerate(slot_list) if slot < 0]
    assert torch.equal(out[base], y[base])


@pytest.mark.parametrize(("slots", "rank"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_has_the_same_bits_alone_as_in_a_mixed_batch(slots, rank, dtype):
    a, b = weights(slots, rank, dtype)
    x, y, slot_list = batch(45, slots, dtype, seed=3)
    kernels = CpuKernels()
    _, together = lora(kernels, x, y, a, b, mapping_for(slot_list))
    for row, slot in enumerate(slot_list):
        if slot >= 0:
            _, alone = lora(kernels, x[row : row + 1], y[row : row + 1], a, b, mapping_for([slot]))
            assert torch.equal(alone[0], together[row]), row


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_slot_loaded_in_place_is_seen_by_the_next_call(dtype):
    # the one-matmul path keeps packed copies of A and B: a slot load (in place) must refresh them
    a, b = weights(4, 16, dtype)
    x, y, slot_list = batch(20, 4, dtype)
    mapping, kernels = mapping_for(slot_list), CpuKernels()
    lora(kernels, x, y, a, b, mapping)
    b[2].copy_(torch.randn(OUT, 16))
    a[2].zero_()
    a[3].copy_(torch.randn(16, IN))
    b[3].mul_(2)
    _, out = lora(kernels, x, y, a, b, mapping)
    _, expected = lora(REF, x, y, a, b, mapping)
    tolerance = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance)
