"""LoRA adapters as requests name them: :class:`LoRARequest` (vLLM's record) and the
``--lora-modules`` values (:class:`LoRAModulePath`, :func:`parse_lora_module`).

Plain data: what an adapter's files hold and how they are applied is
:mod:`llmp.model_files.lora` and :mod:`llmp.modeling.lora`; which adapters sit in the
engine's slots is the engine's (``llmp.engine.lora``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["LORA_DISABLED", "LoRAModulePath", "LoRARequest", "parse_lora_module"]

LORA_DISABLED = "LoRA is not enabled: start the engine with enable_lora=True (--enable-lora)"


@dataclass(frozen=True, eq=False)
class LoRARequest:
    """A LoRA adapter a request runs with, as vLLM's ``LoRARequest``.

    ``lora_name`` is how requests name it (the ``model`` of a served adapter),
    ``lora_int_id`` a positive id unique among the adapters of one engine, ``lora_path``
    a PEFT directory (``adapter_config.json`` and ``adapter_model.safetensors``), and
    ``base_model_name`` the served model it was trained on (checked when given).
    Two requests are equal when their names are.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")
        if not self.lora_name:
            raise ValueError("lora_name cannot be empty")
        if not self.lora_path:
            raise ValueError("lora_path cannot be empty")

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def path(self) -> str:
        return self.lora_path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoRARequest) and other.lora_name == self.lora_name

    def __hash__(self) -> int:
        return hash(self.lora_name)


@dataclass(frozen=True)
class LoRAModulePath:
    """One ``--lora-modules`` value: an adapter served under ``name`` from ``path``."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(value: str) -> LoRAModulePath:
    """``NAME=PATH`` or a JSON object ``{"name", "path", "base_model_name"?}`` (vLLM's two forms);
    ``ValueError`` naming the value when it is neither."""
    text = value.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"--lora-modules {value!r} is not valid JSON: {exc}") from None
        unknown = sorted(set(data) - {"name", "path", "base_model_name"}) if isinstance(data, dict) else []
        if not isinstance(data, dict) or unknown or not data.get("name") or not data.get("path"):
            extra = f" (unknown keys: {', '.join(unknown)})" if unknown else ""
            raise ValueError(
                f'--lora-modules {value!r} must be NAME=PATH or {{"name": ..., "path": ..., "base_model_name": ...}}'
                + extra
            )
        return LoRAModulePath(str(data["name"]), str(data["path"]), data.get("base_model_name"))
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise ValueError(f'--lora-modules {value!r} must be NAME=PATH or a JSON object with "name" and "path"')
    return LoRAModulePath(name.strip(), path.strip())
