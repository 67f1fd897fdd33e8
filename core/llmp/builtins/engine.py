"""Built-in engine components: the default scheduler and KV-cache manager, the uniproc executor,
the ``logging`` stat logger, the ``filesystem`` LoRA resolver.

They are registered through the same hooks a third-party replacement uses.
"""

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import ExecutorSpec, KVManagerSpec, LoRAResolverSpec, SchedulerSpec, StatLoggerSpec

# the periodic statistics line's logger: the one --disable-log-stats leaves out
LOGGING_STAT_LOGGER = "logging"


@hookimpl
def llmp_register_schedulers() -> Iterator[SchedulerSpec]:
    yield SchedulerSpec(
        name="default",
        impl="llmp.engine.scheduler:Scheduler",
        description="One token budget per step: chunked prefill, mixed prefill and decode, "
        "preemption by recompute; FCFS or priority policy.",
    )


@hookimpl
def llmp_register_kv_managers() -> Iterator[KVManagerSpec]:
    yield KVManagerSpec(
        name="default",
        impl="llmp.engine.kv_cache:BlockKVCacheManager",
        description="Fixed-size KV blocks with automatic prefix caching (chained block hashes, LRU eviction).",
    )


@hookimpl
def llmp_register_executors() -> Iterator[ExecutorSpec]:
    yield ExecutorSpec(
        name="uniproc",
        impl="llmp.engine.executor:UniprocExecutor",
        description="The model runs in the engine process (no tensor parallelism).",
    )


@hookimpl
def llmp_register_stat_loggers() -> Iterator[StatLoggerSpec]:
    yield StatLoggerSpec(
        name=LOGGING_STAT_LOGGER,
        impl="llmp.engine.log_stats:LoggingStatLogger",
        description="Logs prompt and generation throughput, running and waiting requests, KV-cache usage and "
        "prefix-cache hit rate every 10 s while the engine works (--disable-log-stats turns it off).",
    )


@hookimpl
def llmp_register_lora_resolvers() -> Iterator[LoRAResolverSpec]:
    yield LoRAResolverSpec(
        name="filesystem",
        impl="llmp.frontend.lora:FilesystemResolver",
        description="Serves <--lora-resolver-dir>/<name>/ when a request names an adapter not loaded yet "
        "(a PEFT LoRA trained on the served model; with --enable-lora-runtime-updates).",
    )
