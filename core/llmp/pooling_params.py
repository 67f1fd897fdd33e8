"""Parameters of an embedding (pooling) request, with vLLM's names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class PoolingParams:
    normalize: bool | None = None  # None = the model's default (a sentence-transformers Normalize module)
    dimensions: int | None = None  # keep the first N dimensions (Matryoshka), before normalising

    def __post_init__(self) -> None:
        if self.dimensions is not None and (
            isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int) or self.dimensions < 1
        ):
            raise ValueError(f"dimensions must be an integer >= 1, got {self.dimensions!r}")
