"""The torch set's LoRA shrink/expand: against a per-row formula, and row invariance (a row's bits
are the same alone as in a batch of other rows and adapters)."""

from __future__ import annotations

import pytest
import torch
from llmp_kernels_torch.kernels import TorchKernels

from llmp.api import LoRAKernels, LoRAMapping
from llmp.modeling.lora import lora_mapping

K = TorchKernels()
SLOTS, RANK, IN, OUT = 4, 16, 96, 200


def mapping_for(slots: list[int]) -> LoRAMapping:
    mapping = lora_mapping(slots, "cpu")
    assert mapping is not None, "every case has a row with a slot"
    return mapping


def weights(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(SLOTS, RANK, IN, generator=generator) / IN**0.5
    b = torch.randn(SLOTS, OUT, RANK, generator=generator) / RANK**0.5
    a[2, RANK // 2 :] = 0  # slot 2 holds a lower-rank adapter, zero-padded
    b[2, :, RANK // 2 :] = 0
    return a.to(dtype), b.to(dtype)


def batch(tokens: int, seed: int = 1) -> tuple[torch.Tensor, list[int]]:
    generator = torch.Generator().manual_seed(seed)
    slots = torch.randint(-1, SLOTS, (tokens,), generator=generator).tolist()
    slots[0] = max(slots[0], 0)  # at least one row with a slot (else no mapping)
    return torch.randn(tokens, IN, generator=generator), slots


def test_the_torch_set_has_the_lora_kernels():
    assert isinstance(K, LoRAKernels)


@pytest.mark.parametrize("tokens", [1, 7, 45, 100])
def test_shrink_and_expand_match_a_per_row_formula(tokens):
    a, b = weights(torch.float32)
    x, slots = batch(tokens, seed=tokens)
    y = torch.randn(tokens, OUT)
    mapping = mapping_for(slots)
    s = K.lora_shrink(x, a, mapping)
    assert s.shape == (mapping.rows.shape[0], RANK) and s.dtype == x.dtype
    for j, row in enumerate(mapping.rows.tolist()):
        expected = x[row].double() @ a[slots[row]].double().T
        torch.testing.assert_close(s[j].double(), expected, rtol=1e-5, atol=1e-5)
    out = y.clone()
    K.lora_expand(out, s, b, mapping)
    for j, row in enumerate(mapping.rows.tolist()):
        expected = y[row].double() + s[j].double() @ b[slots[row]].double().T
        torch.testing.assert_close(out[row].double(), expected, rtol=1e-5, atol=1e-5)
    base = [r for r, slot in enumerate(slots) if slot < 0]
    assert torch.equal(out[base], y[base])  # rows of the base model are left alone


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_has_the_same_bits_alone_as_in_a_mixed_batch(dtype):
    a, b = weights(dtype)
    x, slots = batch(45, seed=3)  # > 32 rows: a group may span two matmul blocks
    x = x.to(dtype)
    y = torch.randn(45, OUT).to(dtype)
    mapping = mapping_for(slots)
    together = y.clone()
    K.lora_expand(together, K.lora_shrink(x, a, mapping), b, mapping)
    for row, slot in enumerate(slots):
        if slot < 0:
            continue
        alone_map = mapping_for([slot])
        alone = y[row : row + 1].clone()
        K.lora_expand(alone, K.lora_shrink(x[row : row + 1], a, alone_map), b, alone_map)
        assert torch.equal(alone[0], together[row]), row
