"""The triton set's LoRA shrink/expand against the torch reference, under Triton's interpreter without CUDA
(conftest.py), on a GPU the compiled kernels; and row invariance (a row alone == in a mixed batch)."""

from __future__ import annotations

import pytest
import torch
from llmp_kernels_torch.kernels import TorchKernels
from llmp_kernels_triton.kernels import TritonKernels

from llmp.api import LoRAKernels, LoRAMapping
from llmp.modeling.lora import lora_mapping

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REF, TRI = TorchKernels(), TritonKernels()
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
SLOTS, IN, OUT = 3, 80, 72  # not multiples of the tiles: the masks are exercised


def mapping_for(slots: list[int]) -> LoRAMapping:
    mapping = lora_mapping(slots, DEVICE)
    assert mapping is not None, "every case has a row with a slot"
    return mapping


def case(tokens: int, rank: int, dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    slots = torch.randint(-1, SLOTS, (tokens,), generator=generator).tolist()
    slots[0] = max(slots[0], 0)  # at least one row with a slot (else no mapping)
    x = torch.randn(tokens, IN, generator=generator)
    y = torch.randn(tokens, OUT, generator=generator)
    a = torch.randn(SLOTS, rank, IN, generator=generator) / IN**0.5
    b = torch.randn(SLOTS, OUT, rank, generator=generator) / rank**0.5
    return (*(t.to(DEVICE, dtype) for t in (x, y, a, b)), slots)


def lora(kernels, x, y, a, b, mapping):
    s = kernels.lora_shrink(x, a, mapping)
    out = y.clone()
    kernels.lora_expand(out, s, b, mapping)
    return s, out


def test_the_triton_set_has_the_lora_kernels():
    assert isinstance(TRI, LoRAKernels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "rank"), [(1, 8), (9, 16), (40, 24)])
def test_matches_the_torch_reference(dtype, tokens, rank):
    x, y, a, b, slots = case(tokens, rank, dtype, seed=tokens)
    mapping = mapping_for(slots)
    s, out = lora(TRI, x, y, a, b, mapping)
    s_ref, out_ref = lora(REF, x, y, a, b, mapping)
    assert s.dtype == dtype and s.shape == s_ref.shape
    torch.testing.assert_close(s, s_ref, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(out, out_ref, atol=TOL[dtype], rtol=TOL[dtype])
    base = [r for r, slot in enumerate(slots) if slot < 0]
    assert torch.equal(out[base], y[base])  # rows of the base model are left alone


def test_a_row_has_the_same_bits_alone_as_in_a_mixed_batch():
    x, y, a, b, slots = case(40, 16, torch.bfloat16, seed=5)  # a group of more than one row block
    _, together = lora(TRI, x, y, a, b, mapping_for(slots))
    for row in (0, 7, 39):
        if slots[row] >= 0:
            _, alone = lora(TRI, x[row : row + 1], y[row : row + 1], a, b, mapping_for([slots[row]]))
            assert torch.equal(alone[0], together[row]), row
