"""``ComplexRopeKernels``: llmp's reference kernel set, with rotary embeddings computed as one
complex multiplication, the formulation of Meta's original Llama code.

Rotary embeddings turn each pair of dimensions of a query or key by an angle that depends on the
token's position. Taken as a complex number ``x1 + i·x2`` (the neox layout pairs dimension ``j``
with ``j + R/2``), the pair turns by multiplying with ``cos + i·sin``; the reference set writes
the same rotation out in real arithmetic. Dimensions past the rotated ``R`` pass through
(partial rotary, as Phi and GPT-NeoX use).

Every kernel not defined here is the ``torch`` set's (from llmp-kernels-torch), which defines
what each must compute; ``llmp plugins verify kernels-complex-rope`` checks each against it over
the shapes the engine uses, then a tiny model's greedy output with this set against the torch set's.
"""

import torch
from llmp import registry

# the reference set's class, whichever distribution provides it
TorchKernels = registry.load_component("kernels", "torch")


class ComplexRopeKernels(TorchKernels):
    name = "complex_rope"  # what the engine reports (`kernels` in its start-up line and EngineInfo)

    def rotary(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [T]; q: [T, H, D]; k: [T, Hkv, D]; cos_sin: [max_pos, R] (cos | sin), R <= D
        cos, sin = cos_sin[positions].float().unsqueeze(1).chunk(2, dim=-1)  # [T, 1, R/2] each
        turn = torch.complex(cos, sin)  # e^(i·angle) for each position and pair
        return _turned(q, turn), _turned(k, turn)


def _turned(x: torch.Tensor, turn: torch.Tensor) -> torch.Tensor:
    """``x`` [T, heads, D] with its first ``R = 2 * turn.shape[-1]`` dimensions turned, in float32."""
    rot = 2 * turn.shape[-1]
    x1, x2 = x[..., :rot].float().chunk(2, dim=-1)
    turned = torch.complex(x1, x2) * turn
    rotated = torch.cat((turned.real, turned.imag), dim=-1).to(x.dtype)
    return torch.cat((rotated, x[..., rot:]), dim=-1) if rot < x.shape[-1] else rotated
