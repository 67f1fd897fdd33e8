"""LoRA adapters served by name: the ``--lora-modules`` a server starts with, the adapters a
resolver plugin (``llmp_register_lora_resolvers``) finds when a request names one the server
does not serve yet, and the built-in ``filesystem`` resolver.

The table of served adapters is the engine client's (``AsyncLLM.lora_requests``, one per
process, read by every front-end through :class:`~llmp.frontend.FrontendKit`). Loads of one name
are serialised (:func:`adapter_lock`), so two requests naming a new adapter load it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import posixpath
from collections.abc import AsyncIterator, Collection, Sequence
from pathlib import Path
from typing import Any

from llmp.api import EngineDeadError, InvalidLoRAAdapterError, LLMPError, LoRAAdapterNotFoundError, LoRAResolver
from llmp.lora import LoRAModulePath, LoRARequest
from llmp.options import FrontendOptions

log = logging.getLogger("llmp.lora")

__all__ = [
    "FilesystemResolver",
    "adapter_lock",
    "check_base_model",
    "load_lora_modules",
    "load_resolvers",
    "resolve",
]


class FilesystemResolver:
    """Serves ``<--lora-resolver-dir>/<name>/`` when a request names an adapter not loaded yet, as
    vLLM's filesystem resolver: only a PEFT LoRA (``peft_type`` ``LORA``) whose
    ``base_model_name_or_path`` is the served model, and never a name outside the directory
    (absolute, or climbing out with ``..`` or a link). A name must be the directory's canonical
    relative path (no ``.``/``..`` parts, empty parts or trailing ``/``): one directory is served
    under one name, never as ``good``, ``good/`` and ``sub/../good`` at once."""

    def __init__(self, options: FrontendOptions) -> None:
        self.directory = Path(options.lora_resolver_dir).expanduser().resolve() if options.lora_resolver_dir else None

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        if self.directory is None:
            return None
        return await asyncio.to_thread(self._find, base_model_name, lora_name)

    def _find(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        if not lora_name or Path(lora_name).is_absolute() or "\\" in lora_name:
            return None
        if posixpath.normpath(lora_name) != lora_name or ".." in lora_name.split("/"):  # one name per directory
            return None
        path = (self.directory / lora_name).resolve()
        if path == self.directory or not path.is_relative_to(self.directory):
            return None
        try:
            config = json.loads((path / "adapter_config.json").read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(config, dict) or config.get("peft_type") != "LORA":
            return None
        if config.get("base_model_name_or_path") != base_model_name:
            return None
        return LoRARequest(lora_name, 1, str(path))  # the server gives it its own lora_int_id


def load_resolvers(options: FrontendOptions) -> list[LoRAResolver]:
    """Every registered LoRA resolver, built for ``options``, in registry order."""
    from llmp import registry

    return [spec.load()(options) for spec in registry.components("lora_resolver").values()]


_LOCKS: dict[tuple[int, str], tuple[asyncio.Lock, int]] = {}


@contextlib.asynccontextmanager
async def adapter_lock(engine: Any, name: str) -> AsyncIterator[None]:
    """Hold the lock of adapter ``name`` of ``engine``'s table: a load, unload or resolution of
    one name at a time. A lock lives only while someone holds or waits for it."""
    key = (id(engine.lora_requests), name)
    lock, users = _LOCKS.get(key, (None, 0))
    lock = lock or asyncio.Lock()
    _LOCKS[key] = (lock, users + 1)
    try:
        async with lock:
            yield
    finally:
        lock, users = _LOCKS[key]
        if users == 1:
            del _LOCKS[key]
        else:
            _LOCKS[key] = (lock, users - 1)


async def resolve(engine: Any, resolvers: Sequence[LoRAResolver], base_model_name: str, name: str) -> LoRARequest:
    """The adapter ``name``: served already, else the first one a resolver finds that loads (it is
    then served by name). ``LoRAAdapterNotFoundError`` when no resolver knows the name;
    ``InvalidLoRAAdapterError`` when some found it but none of their adapters loads (vLLM's texts)."""
    async with adapter_lock(engine, name):
        served = engine.lora_requests.get(name)
        if served is not None:
            return served
        found = False
        for resolver in resolvers:
            try:
                lora = await resolver.resolve_lora(base_model_name, name)
            except Exception as exc:  # a resolver's own failure (its registry unreachable) is a miss
                log.warning(
                    "LoRA resolver %s failed on %r: %s: %s", type(resolver).__name__, name, type(exc).__name__, exc
                )
                continue
            if lora is None:
                continue
            found = True
            lora = dataclasses.replace(lora, lora_int_id=engine.next_lora_id())
            try:
                await engine.add_lora(lora)
            except EngineDeadError:
                raise
            except (LLMPError, ValueError, TypeError) as exc:
                log.warning("LoRA adapter %r from %s did not load: %s", name, type(resolver).__name__, exc)
                continue
            log.info("LoRA adapter %r resolved by %s from %s", name, type(resolver).__name__, lora.lora_path)
            return lora
        if found:
            raise InvalidLoRAAdapterError("model", f"LoRA adapter '{name}' was found but could not be loaded.")
        raise LoRAAdapterNotFoundError(f"LoRA adapter {name} does not exist")


def check_base_model(name: str, base_model_name: str | None, accepted: Collection[str]) -> None:
    """``InvalidLoRAAdapterError`` when an adapter says it was trained on a model this server does
    not serve (``accepted``: the served names and the model's own name)."""
    if base_model_name is not None and base_model_name not in accepted:
        served = ", ".join(sorted(accepted))
        raise InvalidLoRAAdapterError(
            "model", f"LoRA adapter '{name}' is for the base model {base_model_name!r}; this server serves {served}"
        )


def check_module_names(modules: Sequence[LoRAModulePath], served_names: Sequence[str]) -> None:
    """``--lora-modules`` names must be unique and not a served model's: ``LLMPError`` naming the first
    that is not (checked before anything starts, and again by :func:`load_lora_modules`)."""
    seen: set[str] = set()
    for module in modules:
        if module.name in seen:
            raise LLMPError(f"--lora-modules {module.name}: the name is given twice")
        if module.name in served_names:
            raise LLMPError(
                f"--lora-modules {module.name}: the name is the served model's: give the adapter another name"
            )
        seen.add(module.name)


async def load_lora_modules(engine: Any, modules: Sequence[LoRAModulePath], served_names: Sequence[str]) -> None:
    """Load the ``--lora-modules`` of a server that has just started, each served by its name.
    The first that fails stops start-up: ``LLMPError`` naming it (``--lora-modules NAME: why``)."""
    accepted = {*served_names, engine.info.get("model") or served_names[0]}
    check_module_names(modules, served_names)
    for module in modules:
        try:
            check_base_model(module.name, module.base_model_name, accepted)
            lora = LoRARequest(module.name, engine.next_lora_id(), module.path, module.base_model_name)
            await engine.add_lora(lora)
        except (LLMPError, ValueError, TypeError) as exc:
            raise LLMPError(f"--lora-modules {module.name}: {exc}") from None
        log.info("LoRA adapter %r served from %s", module.name, module.path)
