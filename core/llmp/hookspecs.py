"""Hook specifications: the plugin author's reference.

A plugin is a module (or object) with functions named after these hooks and
decorated with ``llmp.hookimpl``. It is found through the ``llmp`` entry-point
group of its distribution, or registered in-process with
``llmp.plugins.register(obj)``.

There are two families:

* **Registration hooks** (``llmp_register_*``) take no arguments and return
  an iterable of records from ``llmp.api``. Each record names its
  implementation lazily (``"package.module:attribute"``), so registering
  imports nothing heavy. The kernel calls every implementation once per
  process when a registry is first needed, stamps each record with the plugin
  and distribution that gave it, and rejects two records of the same kind and
  name unless the later one says ``replace=True``.
* **Observer hooks** (``llmp_engine_started``, ``llmp_engine_stopped``) are
  told about the engine's life cycle. The engine's per-step loop never calls
  pluggy: per-step and per-request figures go to stat loggers, which are
  registered with ``llmp_register_stat_loggers`` and called directly.

Every hook is documented in ``docs/plugins.md``; a test keeps it so.
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from llmp.api import (
    CommandSpec,
    EngineInfo,
    ExecutorSpec,
    FrontendSpec,
    KernelSetSpec,
    KVManagerSpec,
    LoRAResolverSpec,
    ModelSpec,
    ReasoningParserSpec,
    SchedulerSpec,
    StatLoggerSpec,
    ToolParserSpec,
)

PROJECT = "llmp"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --------------------------------------------------------------------------
# Registration hooks
# --------------------------------------------------------------------------


@hookspec
def llmp_register_models() -> Iterable[ModelSpec]:
    """Register model implementations by Hugging Face architecture name.

    Called once per process, the first time a model is looked up or the
    plugins are listed.

    :return: :class:`llmp.api.ModelSpec` records; ``name`` is the
        ``architectures`` entry of ``config.json``.

    Example::

        @hookimpl
        def llmp_register_models():
            yield ModelSpec(name="LlamaForCausalLM", impl="llmp_models_llama.model:LlamaForCausalLM")
    """


@hookspec
def llmp_register_kernels() -> Iterable[KernelSetSpec]:
    """Register kernel sets (``--kernels NAME``).

    Called once per process, when a kernel set is looked up or plugins are
    listed. The implementation must satisfy :class:`llmp.api.KernelSet`;
    attention is part of the set (``KernelSet.paged_attention``).

    :return: :class:`llmp.api.KernelSetSpec` records.

    Example::

        @hookimpl
        def llmp_register_kernels():
            yield KernelSetSpec(
                name="triton", impl="llmp_kernels_triton.kernels:TritonKernels", devices=("cuda",), priority=10
            )
    """


@hookspec
def llmp_register_executors() -> Iterable[ExecutorSpec]:
    """Register executors (``--executor NAME``).

    Called once per process, when an executor is looked up or plugins are
    listed. The implementation must satisfy :class:`llmp.api.Executor`; its
    workers are :class:`llmp.executor.Worker` ranks.

    :return: :class:`llmp.api.ExecutorSpec` records.

    Example::

        @hookimpl
        def llmp_register_executors():
            yield ExecutorSpec(name="mp", impl="llmp_executors_mp.executor:MultiprocExecutor", distributed=True)
    """


@hookspec
def llmp_register_frontends() -> Iterable[FrontendSpec]:
    """Register protocol front-ends (``--frontend NAME``).

    Called once per process, when a front-end is looked up or plugins are
    listed. The implementation must satisfy :class:`llmp.api.Frontend`.

    :return: :class:`llmp.api.FrontendSpec` records.

    Example::

        @hookimpl
        def llmp_register_frontends():
            yield FrontendSpec(name="openai", impl="llmp_frontend_openai.frontend:OpenAIFrontend")
    """


@hookspec
def llmp_register_lora_resolvers() -> Iterable[LoRAResolverSpec]:
    """Register LoRA resolvers: where a server finds an adapter a request names that it does not
    serve yet (a directory, a registry, object storage).

    Called once per process, when resolvers are looked up or plugins are listed. ``impl`` is a
    factory ``(options: FrontendOptions) -> LoRAResolver`` (:class:`llmp.api.LoRAResolver`).
    Resolvers run only with ``--enable-lora-runtime-updates``; the built-in ``filesystem``
    resolver serves the sub-directories of ``--lora-resolver-dir``.

    :return: :class:`llmp.api.LoRAResolverSpec` records.

    Example::

        @hookimpl
        def llmp_register_lora_resolvers():
            yield LoRAResolverSpec(name="filesystem", impl="llmp.frontend.lora:FilesystemResolver")
    """


@hookspec
def llmp_register_tool_parsers() -> Iterable[ToolParserSpec]:
    """Register tool-call parsers (``--tool-call-parser NAME``).

    Called once per process, when a parser is looked up or plugins are
    listed. The implementation must satisfy :class:`llmp.api.ToolParser`.

    :return: :class:`llmp.api.ToolParserSpec` records.

    Example::

        @hookimpl
        def llmp_register_tool_parsers():
            yield ToolParserSpec(name="hermes", impl="llmp_parsers_tools.hermes:HermesToolParser")
    """


@hookspec
def llmp_register_reasoning_parsers() -> Iterable[ReasoningParserSpec]:
    """Register reasoning parsers (``--reasoning-parser NAME``).

    Called once per process, when a parser is looked up or plugins are
    listed. The implementation must satisfy :class:`llmp.api.ReasoningParser`.

    :return: :class:`llmp.api.ReasoningParserSpec` records.

    Example::

        @hookimpl
        def llmp_register_reasoning_parsers():
            yield ReasoningParserSpec(name="qwen3", impl="llmp_parsers_reasoning.qwen3:Qwen3ReasoningParser")
    """


@hookspec
def llmp_register_schedulers() -> Iterable[SchedulerSpec]:
    """Register request schedulers (``--scheduler NAME``).

    Called once per process, when a scheduler is looked up or plugins are
    listed. The implementation must satisfy :class:`llmp.api.Scheduler`.

    :return: :class:`llmp.api.SchedulerSpec` records.

    Example::

        @hookimpl
        def llmp_register_schedulers():
            yield SchedulerSpec(name="default", impl="llmp.engine.scheduler:Scheduler")
    """


@hookspec
def llmp_register_kv_managers() -> Iterable[KVManagerSpec]:
    """Register KV-cache managers (``--kv-manager NAME``).

    Called once per process, when a manager is looked up or plugins are
    listed. The implementation must satisfy :class:`llmp.api.KVCacheManager`.

    :return: :class:`llmp.api.KVManagerSpec` records.

    Example::

        @hookimpl
        def llmp_register_kv_managers():
            yield KVManagerSpec(name="default", impl="llmp.engine.kv_cache:BlockKVCacheManager")
    """


@hookspec
def llmp_register_stat_loggers() -> Iterable[StatLoggerSpec]:
    """Register stat loggers; every engine builds each registered one when it starts.

    Called once per process, when an engine starts or plugins are listed.
    The implementation is called once per engine as ``factory(engine_info)``
    and must return an object satisfying :class:`llmp.api.StatLogger`; the
    engine (in the engine process) then calls it directly, never through
    pluggy: ``record_step`` after each step (and once after an abort between steps, so an idle
    engine's counts stay true; never for ``llmp serve``'s warm-up) and ``record_finished`` once for each
    request that ends, aborted ones included (``finish_reason="abort"``, when the
    client goes away or the request is cancelled). Keep both cheap: they run on the engine's loop. A
    logger that raises is logged once and dropped; the engine goes on.

    :return: :class:`llmp.api.StatLoggerSpec` records.

    Example::

        @hookimpl
        def llmp_register_stat_loggers():
            yield StatLoggerSpec(name="step-counter", impl="llmp_example_stats:StepCounter")
    """


@hookspec
def llmp_register_commands() -> Iterable[CommandSpec]:
    """Register ``llmp`` sub-commands.

    Called once per process, when the CLI starts. ``impl`` resolves to a
    ``typer.Typer`` (a group such as ``llmp plugins``) or a function (one
    command). Declare a command's options as an option record (fields made
    with ``llmp.options.option``) and generate the command with
    ``llmp.cli.options.options_command``, so every option also comes from
    ``LLMP_*`` variables and ``--config`` files.

    :return: :class:`llmp.api.CommandSpec` records.

    Example::

        @hookimpl
        def llmp_register_commands():
            yield CommandSpec(name="mcp", impl="llmp_frontend_mcp.cli:mcp", help="Serve over MCP (stdio).")
    """


# --------------------------------------------------------------------------
# Observer hooks
# --------------------------------------------------------------------------


@hookspec
def llmp_engine_started(info: EngineInfo) -> None:
    """Called once when an engine has loaded its model and can take requests.

    :param info: what the engine runs: model, executor, kernels, scheduler,
        KV-cache manager, device and the remaining options.

    Example::

        @hookimpl
        def llmp_engine_started(info):
            print(f"serving {info.model} on {info.device}")
    """


@hookspec
def llmp_engine_stopped(info: EngineInfo) -> None:
    """Called once when an engine has shut down (normally or after a failure).

    :param info: the same object ``llmp_engine_started`` received.

    Example::

        @hookimpl
        def llmp_engine_stopped(info):
            print(f"stopped serving {info.model}")
    """
