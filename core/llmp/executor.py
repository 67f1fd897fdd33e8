"""What an executor plugin (:class:`llmp.api.Executor`) builds on.

An executor is built as ``Executor(config, model)`` with the engine's
:class:`llmp.options.EngineConfig` and the :class:`llmp.api.ResolvedModel` (picklable: send
both to the workers as they are). Each tensor-parallel rank runs one :class:`Worker`, in a
process (``mp``) or an actor (``ray``): ``Worker(config, model, rank, world_size, init_method)``
joins the group and loads its slice of the model; then ``describe()``,
``allocate_kv_cache(num_blocks)`` and ``execute_model(inputs)`` (every rank runs the step, rank 0
returns the logits), and ``sleep(level)``, ``wake_up(tags)``, ``start_profile(directory)`` and
``stop_profile()``, which the engine calls through the executor's ``collective_rpc``. A worker
process should run :func:`exit_with_parent` in a daemon thread, so that it never outlives a
killed engine.

``collective_rpc`` runs on each rank :func:`rpc_outcome` (``(True, result)`` or ``(False,
"Type: message")``: :func:`call_worker_method` with the method's name, or a function, and its
arguments; a failing call never stops a rank) and turns the ranks' outcomes into results with
:func:`raise_rpc_failures`.

The implementation lives in the engine (``llmp.engine``); this module is its supported face.
"""

from __future__ import annotations

from llmp.engine.core_proc import exit_with_parent
from llmp.engine.worker import Worker, call_worker_method, raise_rpc_failures, rpc_outcome

__all__ = ["Worker", "call_worker_method", "exit_with_parent", "raise_rpc_failures", "rpc_outcome"]
