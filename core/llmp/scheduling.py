"""What a scheduler or KV-cache manager plugin (:class:`llmp.api.Scheduler`,
:class:`llmp.api.KVCacheManager`) builds on.

A scheduler is built as ``Scheduler(config, kv_manager)`` with a :class:`SchedulerConfig`
(the engine's budgets and policy, made from :class:`llmp.options.EngineConfig`); each
``schedule()`` returns a :class:`SchedulerOutput` of :class:`ScheduledRequest` rows. Both
components work on :class:`Request` objects (token ids, computed tokens, block ids, a
:class:`RequestStatus`).

The implementation lives in the engine (``llmp.engine``); this module is its supported face.
"""

from __future__ import annotations

from llmp.engine.request import Request, RequestStatus
from llmp.engine.scheduler import ScheduledRequest, SchedulerConfig, SchedulerOutput

__all__ = ["Request", "RequestStatus", "ScheduledRequest", "SchedulerConfig", "SchedulerOutput"]
