"""The engine's LoRA adapters: which are known, which are held in CPU memory, which sit in the
model runner's slots this step.

The engine (not the workers) owns this, so planning is deterministic and a worker only copies
the ``loads`` of a step into its slot buffers. Every disk read happens in :meth:`LoRAManager.register`
and :meth:`LoRAManager.acquire`, i.e. when a request is added or an adapter is loaded: a missing or
corrupt adapter fails that one call, never a step.

Keys: ``lora_int_id`` is the caller's id (vLLM's); ``lora_id`` is the engine's key of one load of
it (``Request.lora_id``), from a counter, so an id removed and added again, replaced in place, or
whose files changed on disk before a re-read never meets the prefix-cache blocks or the slot of an
earlier load.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llmp.api import InvalidLoRAAdapterError, LLMPError, LoRAAdapterNotFoundError, LoRAKernels, ResolvedModel
from llmp.engine.model_runner import TORCH_DTYPES, LoRAStepInputs
from llmp.engine.scheduler import SchedulerOutput
from llmp.lora import LoRARequest
from llmp.model_files.lora import CONFIG_FILE, WEIGHT_FILES, local_adapter_path
from llmp.modeling.lora import LoRAWeights
from llmp.options import EngineConfig

log = logging.getLogger("llmp.engine")

# reads and checks one adapter: (request, lora_id) -> its weights; raises the typed LoRA errors
AdapterLoader = Callable[[LoRARequest, int], LoRAWeights]
# what a read of an adapter's files saw: (file name, mtime_ns, size) of each of them there
FilesIdentity = tuple[tuple[str, int, int], ...]


def files_identity(request: LoRARequest) -> FilesIdentity:
    """The identity of ``request``'s ``adapter_config.json`` and weight file as they are now: a
    re-read that sees another one reads other weights, which must not inherit the old load's key."""
    path = Path(request.lora_path).expanduser()
    seen = []
    for name in (CONFIG_FILE, *WEIGHT_FILES):
        try:
            stat = (path / name).stat()
        except OSError:
            continue
        seen.append((name, stat.st_mtime_ns, stat.st_size))
    return tuple(seen)


@dataclass(slots=True)
class _Adapter:
    """One load of an adapter: its request, its weights while in the CPU cache, its requests."""

    request: LoRARequest
    lora_id: int
    weights: LoRAWeights | None
    files: FilesIdentity  # the files its weights were read from
    pinned: bool = False
    removed: bool = False  # no longer served: forgotten once its last request is done
    running: int = 0
    waiting: int = 0
    pending: int = 0  # requests acquired since the scheduler's last counts

    @property
    def in_use(self) -> bool:
        return bool(self.running or self.waiting or self.pending)


def adapter_loader(config: EngineConfig, model: ResolvedModel) -> AdapterLoader:
    """The loader of adapters for ``model``: the modules it can adapt come from a meta-device build
    of its class (no weights), so a model or kernel set LoRA cannot run on fails here, at start-up."""
    from llmp import registry
    from llmp.model_files.lora import load_lora_weights
    from llmp.modeling.decoder import as_pooling_model
    from llmp.modeling.lora import lora_targets

    model_cls = as_pooling_model(model.spec.load(), model.task)
    if model.spec.model_impl != "native" or hasattr(model_cls, "load_pretrained"):
        raise ValueError(
            f"LoRA needs a native decoder model; {model.architectures[0]} runs through the transformers "
            "fallback (--enable-lora cannot serve it)"
        )
    kernels_spec = registry.select_kernels(config.kernels, torch.device(config.device).type)
    kernels = kernels_spec.load()()
    if not isinstance(kernels, LoRAKernels):
        raise ValueError(
            f"the kernel set {kernels_spec.name!r} has no LoRA kernels (lora_shrink, lora_expand): "
            "pick another with --kernels to use --enable-lora"
        )
    with torch.device("meta"):
        targets = lora_targets(model_cls(model.config, kernels))
    if not targets:
        raise ValueError(f"{model.architectures[0]} has no module a LoRA adapter can adapt")
    stacked_params = getattr(model_cls, "stacked_params", {})
    dtype = TORCH_DTYPES[model.dtype]

    def load(request: LoRARequest, lora_id: int) -> LoRAWeights:
        return load_lora_weights(request, lora_id, targets, stacked_params, config.max_lora_rank, dtype)

    return load


class LoRAManager:
    """Adapters by id, an LRU cache of their weights in CPU memory (``max_cpu_loras``), and the
    ``max_loras`` slots of the model runner, handed out least-recently-used.

    The CPU bound is soft: an adapter with running or waiting requests, or a pinned one, is never
    dropped, so while more adapters than ``max_cpu_loras`` are in use all of them stay.
    """

    def __init__(self, config: EngineConfig, load: AdapterLoader) -> None:
        self.max_loras = config.max_loras
        self.max_cpu_loras = config.max_cpu_loras or config.max_loras
        self.scheduler_name = config.scheduler
        self._load = load
        self._ids: dict[int, int] = {}  # lora_int_id -> lora_id of its current load
        self._removed_ids: set[int] = set()  # lora_int_ids removed and not added again
        self._adapters: dict[int, _Adapter] = {}  # lora_id -> adapter (removed ones while requests use them)
        self._cpu: OrderedDict[int, None] = OrderedDict()  # lora_ids holding weights; head = least recent
        self.slots: list[int | None] = [None] * self.max_loras  # lora_id in each runner slot
        self._slot_used = [0] * self.max_loras  # the step that used each slot last
        self._next_lora_id = 1
        self._step = 0
        self.disk_loads = 0
        self.cpu_evictions = 0
        self.slot_loads = 0
        self.slot_evictions = 0

    # -- the registry ----------------------------------------------------

    def register(self, request: LoRARequest, *, pin: bool = False, replace: bool = False) -> int:
        """Read and check ``request``'s adapter now and keep it (a no-op for a known id unless
        ``replace``: then the new files serve new requests, and requests in flight finish with the
        old ones). Returns its ``lora_id``; ``LoRAAdapterNotFoundError``/``InvalidLoRAAdapterError``,
        the latter also for a known id given with another name or path (without ``replace``)."""
        path = local_adapter_path(request.lora_path)  # a Hub id: its directory in the Hugging Face cache
        if path != request.lora_path:
            request = dataclasses.replace(request, lora_path=path)
        known = self._ids.get(request.lora_int_id)
        if known is not None and not replace:
            adapter = self._adapters[known]
            _check_same_adapter(adapter.request, request)
            # weights to read again from files changed since: a new load, under a new key
            replace = adapter.weights is None and files_identity(request) != adapter.files
            if not replace:
                adapter.pinned = adapter.pinned or pin
                self._ensure_weights(adapter)
                return known
            log.info("LoRA adapter %r changed on disk since it was read: read again as a new load", request.lora_name)
        lora_id = self._next_lora_id
        files = files_identity(request)  # before the read: a change during it shows on the next one
        weights = self._read(request, lora_id)  # nothing changes if it fails
        self._next_lora_id += 1
        if known is not None:
            self._retire(request.lora_int_id)
        self._removed_ids.discard(request.lora_int_id)
        self._ids[request.lora_int_id] = lora_id
        self._adapters[lora_id] = _Adapter(request, lora_id, weights, files, pinned=pin)
        self._cpu[lora_id] = None
        self._trim_cpu(keep=lora_id)
        return lora_id

    def acquire(self, request: LoRARequest) -> int:
        """The ``lora_id`` a new request with ``request`` runs with: registers an id never seen, and
        reads the adapter again if it left the CPU cache. The request counts as in use from now.
        ``LoRAAdapterNotFoundError`` for an id removed and not added again: a request that named the
        adapter before its unload reached the engine must not bring it back."""
        if request.lora_int_id in self._removed_ids:
            raise LoRAAdapterNotFoundError(
                f"LoRA adapter '{request.lora_name}' (lora_int_id {request.lora_int_id}) has been removed; "
                "add it again (add_lora) to use it"
            )
        lora_id = self.register(request)
        self._adapters[lora_id].pending += 1
        return lora_id

    def remove(self, lora_int_id: int) -> bool:
        """Stop serving the id: its requests in flight finish with it, then its weights and slot go;
        new requests with it are refused until it is added again. False when the id is unknown."""
        if not self._retire(lora_int_id):
            return False
        self._removed_ids.add(lora_int_id)
        return True

    def pin(self, lora_int_id: int) -> bool:
        """Keep the id's weights in the CPU cache for good, and its slot while another slot can be
        evicted instead (a slot is not reserved: when every slot a step could take holds a pinned
        adapter, the least recently used of them goes). False when the id is unknown."""
        lora_id = self._ids.get(lora_int_id)
        if lora_id is None:
            return False
        self._adapters[lora_id].pinned = True
        return True

    def list_ids(self) -> list[int]:
        """The ``lora_int_id`` of every adapter served (in the CPU cache or read again on its next request)."""
        return sorted(self._ids)

    # -- steps -----------------------------------------------------------

    def step_inputs(self, scheduled: SchedulerOutput) -> LoRAStepInputs | None:
        """Each row's slot for the step, and the adapters to copy into slots first; None when no
        scheduled request runs with an adapter."""
        per_request = [item.request.lora_id for item in scheduled.scheduled]
        needed = list(dict.fromkeys(i for i in per_request if i))
        if not needed:
            return None
        if len(needed) > self.max_loras:
            raise RuntimeError(
                f"the scheduler {self.scheduler_name!r} put {len(needed)} LoRA adapters in one step, more than "
                f"max_loras ({self.max_loras}): it must keep to SchedulerConfig.max_loras"
            )
        self._step += 1
        slot_of = {lora_id: slot for slot, lora_id in enumerate(self.slots) if lora_id in needed}
        loads: dict[int, Any] = {}
        for lora_id in needed:
            if lora_id not in slot_of:
                slot = self._free_slot(needed)
                if self.slots[slot] is not None:
                    self.slot_evictions += 1
                adapter = self._adapters[lora_id]
                if adapter.weights is None:  # in use, so never dropped: a bookkeeping bug
                    raise RuntimeError(f"LoRA adapter {adapter.request.lora_name!r} has no weights to load")
                self.slots[slot] = lora_id
                slot_of[lora_id] = slot
                loads[slot] = adapter.weights
                self.slot_loads += 1
        for lora_id in needed:
            self._slot_used[slot_of[lora_id]] = self._step
        rows = np.repeat(
            np.array([slot_of.get(i, -1) for i in per_request], dtype=np.int32),
            [item.num_tokens for item in scheduled.scheduled],
        )
        return LoRAStepInputs(torch.from_numpy(rows), loads)

    def forget_slots(self) -> None:
        """The runner's slots are empty again (its model was loaded again after a level-2 sleep): each
        adapter is copied in again when a step next needs it."""
        self.slots = [None] * self.max_loras
        self._slot_used = [0] * self.max_loras

    def update_counts(self, running: Mapping[int, int], waiting: Mapping[int, int]) -> None:
        """The scheduler's requests per ``lora_id`` (``Scheduler.lora_counts``); forgets removed
        adapters no request uses any more, and trims the CPU cache to its bound."""
        for adapter in list(self._adapters.values()):
            adapter.running = running.get(adapter.lora_id, 0)
            adapter.waiting = waiting.get(adapter.lora_id, 0)
            adapter.pending = 0
            if adapter.removed and not adapter.in_use:
                self._forget(adapter)
        self._trim_cpu()

    def stats(self) -> dict[str, Any]:
        """Figures for metrics: requests per adapter name, and loads and evictions since start-up."""
        running: dict[str, int] = {}
        waiting: dict[str, int] = {}
        for adapter in self._adapters.values():
            name = adapter.request.lora_name
            if adapter.running:
                running[name] = running.get(name, 0) + adapter.running
            if adapter.waiting:
                waiting[name] = waiting.get(name, 0) + adapter.waiting
        return {
            "max_loras": self.max_loras,
            "running": running,
            "waiting": waiting,
            "loaded": sorted(self._adapters[i].request.lora_name for i in self._ids.values()),
            "disk_loads": self.disk_loads,
            "cpu_evictions": self.cpu_evictions,
            "slot_loads": self.slot_loads,
            "slot_evictions": self.slot_evictions,
        }

    # -- internals -------------------------------------------------------

    def _read(self, request: LoRARequest, lora_id: int) -> LoRAWeights:
        try:
            weights = self._load(request, lora_id)
        except LLMPError:
            raise
        except Exception as exc:  # whatever a broken file raises fails this call, never the engine
            raise InvalidLoRAAdapterError(
                "model", f"LoRA adapter '{request.lora_name}' could not be loaded: {type(exc).__name__}: {exc}"
            ) from exc
        self.disk_loads += 1
        log.info("LoRA adapter %r read from %s (rank %d)", request.lora_name, request.lora_path, weights.rank)
        return weights

    def _ensure_weights(self, adapter: _Adapter) -> None:
        if adapter.weights is None:
            adapter.weights = self._read(adapter.request, adapter.lora_id)
        self._cpu[adapter.lora_id] = None
        self._cpu.move_to_end(adapter.lora_id)
        self._trim_cpu(keep=adapter.lora_id)

    def _trim_cpu(self, keep: int = 0) -> None:
        """Drop the least recently used weights past ``max_cpu_loras``, those of adapters in no slot
        first (one in a slot keeps serving from there without a disk read); never those of ``keep``
        (the adapter just read or asked for), of a pinned adapter, or of one with requests."""
        excess = len(self._cpu) - self.max_cpu_loras
        if excess <= 0:
            return
        in_slots = set(self.slots)
        for lora_id in sorted(self._cpu, key=in_slots.__contains__):  # stable: least recent first in each group
            if excess <= 0:
                return
            adapter = self._adapters[lora_id]
            if lora_id == keep or adapter.in_use or adapter.pinned:
                continue
            adapter.weights = None
            del self._cpu[lora_id]
            self.cpu_evictions += 1
            excess -= 1

    def _free_slot(self, needed: list[int]) -> int:
        """An empty slot, else the least recently used one no adapter of this step holds, unpinned first."""
        if None in self.slots:
            return self.slots.index(None)
        candidates = [s for s, lora_id in enumerate(self.slots) if lora_id not in needed]
        return min(candidates, key=lambda s: (self._adapters[self.slots[s]].pinned, self._slot_used[s]))

    def _retire(self, lora_int_id: int) -> bool:
        """Stop serving the id's current load (requests in flight finish with it); False when unknown."""
        lora_id = self._ids.pop(lora_int_id, None)
        if lora_id is None:
            return False
        adapter = self._adapters[lora_id]
        adapter.removed = True
        if not adapter.in_use:
            self._forget(adapter)
        return True

    def _forget(self, adapter: _Adapter) -> None:
        del self._adapters[adapter.lora_id]
        self._cpu.pop(adapter.lora_id, None)
        if adapter.lora_id in self.slots:
            self.slots[self.slots.index(adapter.lora_id)] = None


def _check_same_adapter(known: LoRARequest, given: LoRARequest) -> None:
    """``InvalidLoRAAdapterError`` when ``given`` reuses the ``lora_int_id`` of another adapter:
    serving the known one under it would answer with weights the caller did not ask for."""
    if known.lora_name == given.lora_name and _same_path(known.lora_path, given.lora_path):
        return
    raise InvalidLoRAAdapterError(
        "model",
        f"lora_int_id {given.lora_int_id} is LoRA adapter '{known.lora_name}' ({known.lora_path}); "
        f"it cannot also be '{given.lora_name}' ({given.lora_path}): give each adapter its own lora_int_id, "
        "or remove the first one",
    )


def _same_path(a: str, b: str) -> bool:
    return a == b or Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
