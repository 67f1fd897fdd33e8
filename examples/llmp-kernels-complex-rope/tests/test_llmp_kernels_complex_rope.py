"""Tests of the kernel set beyond the conformance kit's (tests/test_conformance.py)."""

import math

import torch
from llmp import registry


def kernels(name: str = "complex_rope"):
    return registry.load_component("kernels", name)()


def test_selected_by_name_and_keeps_the_reference_kernels():
    assert registry.select_kernels("complex_rope", "cpu").plugin == "kernels-complex-rope"
    x = torch.randn(3, 2 * 8)
    assert torch.equal(kernels().silu_and_mul(x), kernels("torch").silu_and_mul(x))  # not overridden


def test_a_quarter_turn_moves_each_pair_by_ninety_degrees():
    # one position at angle pi/2 for both pairs: (x1, x2) -> (-x2, x1)
    cos_sin = torch.tensor([[1.0, 1.0, 0.0, 0.0], [math.cos(math.pi / 2)] * 2 + [1.0, 1.0]])
    q = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])  # pairs (1, 3) and (2, 4)
    turned, _ = kernels().rotary(torch.tensor([1]), q, q.clone(), cos_sin)
    assert torch.allclose(turned, torch.tensor([[[-3.0, -4.0, 1.0, 2.0]]]), atol=1e-6)


def test_partial_rotary_leaves_the_other_dimensions_as_they_are():
    cos_sin = torch.randn(8, 4)  # R = 4 of D = 6
    q, k = torch.randn(2, 3, 6, dtype=torch.bfloat16), torch.randn(2, 1, 6, dtype=torch.bfloat16)
    positions = torch.tensor([5, 7])
    ours, reference = kernels().rotary(positions, q, k, cos_sin), kernels("torch").rotary(positions, q, k, cos_sin)
    for got, expected, x in zip(ours, reference, (q, k)):
        assert got.dtype == torch.bfloat16 and torch.equal(got[..., 4:], x[..., 4:])
        torch.testing.assert_close(got, expected)
