"""The versioned plugin API: records, contracts, payloads and errors.

The supported surface of llmp is the modules in :data:`PUBLIC_MODULES`; a plugin (and
its tests) imports from those and nowhere else in ``llmp``, and everything else may change
without notice:

============================ ================================= ==========================================
module                       for                               what it holds
============================ ================================= ==========================================
``llmp``                     users and every plugin            ``LLM``, ``AsyncLLM``, ``SamplingParams``,
                                                               ``PoolingParams``, ``Prompt``, outputs,
                                                               ``hookimpl``
``llmp.api``                 every plugin                      records, contracts, payloads, typed errors,
                                                               ``ResolvedModel``
``llmp.options``             programs, commands, executors     ``EngineConfig``, ``ServerOptions``,
                                                               ``FrontendOptions``, ``option()``
``llmp.lora``                programs, front-ends              ``LoRARequest``, ``parse_lora_module``
``llmp.cli.options``         command plugins                   ``options_command``, ``Select``
``llmp.frontend``            front-end plugins                 ``FrontendKit``, ``APIError`` and the error
                                                               helpers, HTTP helpers, ``render_chat``
``llmp.parsing``             parser plugins                    text helpers (``held_back`` ...),
                                                               ``MessageStream``
``llmp.modeling``            model plugins                     model building blocks (its submodules:
                                                               ``layers``, ``decoder``, ``moe`` ...)
``llmp.quantization``        kernel and model plugins          GGML block formats in torch: ``dequantize``,
                                                               ``quantize``, ``matmul_reference``
``llmp.executor``            executor plugins                  ``Worker``, ``exit_with_parent``,
                                                               ``call_worker_method``
``llmp.scheduling``          scheduler and KV-manager plugins  ``SchedulerConfig``, ``Request``,
                                                               ``SchedulerOutput`` ...
``llmp.registry``            plugins using other components    looking components up by kind and name
``llmp.plugins``             programs and tests                in-process ``register``/``unregister``
``llmp.testing``             plugin tests                      the test kit
``llmp.conformance``         plugin tests, ``plugins verify``  ``verify``, ``assert_conforms``, ``Report``
============================ ================================= ==========================================

The public modules follow semantic versioning through :data:`API_VERSION`: while the major
version is 0, a minor bump may change a contract, and the changelog in ``docs/plugins.md``
("API versioning") says how. A plugin's entry module starts with
``require_api(">=0.5,<0.6")`` (:func:`require_api`), before importing anything else of llmp,
so an llmp with another API lists it as ``incompatible`` instead of failing on a name that
moved. A name is removed or changed only in a new minor version, after at least one minor
version in which using it raises a ``DeprecationWarning``; additions come in any version.
``tests/api_surface.json`` records the surface of :data:`API_VERSION`
(``scripts/api_surface.py``), and a test fails when it changes while the version does not.

Three kinds of things live here:

* **Records** (``*Spec``): frozen dataclasses a registration hook hands back.
  Each names its implementation lazily as ``"package.module:attribute"``, so
  registering costs an import of nothing heavier than this module; the
  implementation is imported only when the component is selected.
* **Contracts** (``Protocol`` classes): what the object behind a record must
  look like. They are structural; a plugin does not need to subclass them.
* **Errors**: typed exceptions the kernel raises about plugins and requests.

Nothing here imports torch, transformers or triton; tensor types appear only
as ``Any`` so this module stays cheap to import.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from llmp.options import EngineConfig, FrontendOptions

QuantizedWeight = Any  # llmp.quantization.QuantizedWeight, kept as Any so importing the API never imports torch

__all__ = [
    "API_VERSION",
    "AttentionMetadata",
    "CommandSpec",
    "ComponentImportError",
    "ComponentSpec",
    "DecoderLayerParts",
    "DeviceError",
    "DuplicateComponentError",
    "EngineClient",
    "EngineDeadError",
    "EngineInfo",
    "EngineSleepingError",
    "Executor",
    "ExecutorSpec",
    "FinishedRequestStats",
    "Frontend",
    "FrontendSpec",
    "KINDS",
    "KVCacheManager",
    "KVManagerSpec",
    "KernelSet",
    "KernelSetSpec",
    "IncompatiblePluginError",
    "InvalidLoRAAdapterError",
    "LLMPError",
    "LoRAAdapterNotFoundError",
    "LoRAKernels",
    "LoRAMapping",
    "LoRAResolver",
    "LoRAResolverSpec",
    "Model",
    "ModelLoadError",
    "ModelSpec",
    "ModelTask",
    "PUBLIC_MODULES",
    "PacksDecoderLayer",
    "PacksGatedLinear",
    "PacksLinear",
    "PacksQuantized",
    "ParsedToolCall",
    "PoolingConfig",
    "PluginLoadError",
    "ReasoningParse",
    "ReasoningParser",
    "ReasoningParserSpec",
    "RequestValidationError",
    "ResolvedModel",
    "SPEC_TYPES",
    "Scheduler",
    "SchedulerSpec",
    "SchedulerStats",
    "StatLogger",
    "StatLoggerSpec",
    "Tensor",
    "ToolCallParse",
    "ToolParser",
    "ToolParserSpec",
    "UnknownComponentError",
    "is_public_module",
    "require_api",
    "resolve_reference",
]

API_VERSION = "0.5"

PUBLIC_MODULES = (
    "llmp",
    "llmp.api",
    "llmp.options",
    "llmp.lora",
    "llmp.cli.options",
    "llmp.frontend",
    "llmp.parsing",
    "llmp.modeling",
    "llmp.quantization",
    "llmp.executor",
    "llmp.scheduling",
    "llmp.registry",
    "llmp.plugins",
    "llmp.testing",
    "llmp.conformance",
)
"""The modules of llmp's supported surface (``llmp.modeling`` with its submodules)."""


def is_public_module(name: str) -> bool:
    """Whether plugins may import module ``name`` (a dotted module path under ``llmp``)."""
    return name in PUBLIC_MODULES or name.startswith("llmp.modeling.")


# --------------------------------------------------------------------------
# Versioning
# --------------------------------------------------------------------------

_CLAUSE = re.compile(r"(~=|==|!=|<=|>=|<|>)\s*(\d+(?:\.\d+)*)(\.\*)?")


def require_api(specifier: str) -> None:
    """Refuse to load unless :data:`API_VERSION` satisfies ``specifier`` (PEP 440: ``">=0.5,<0.6"``).

    A plugin's entry module calls it first, before importing anything else of llmp, so that an
    llmp with another API reports the plugin as ``incompatible`` instead of failing on a name that
    moved. Clauses are ``~=``, ``==``, ``!=``, ``<=``, ``>=``, ``<`` and ``>`` on release numbers
    (``==0.5.*`` and ``!=0.4.*`` match a prefix), joined by commas; every clause must hold.

    Raises :class:`IncompatiblePluginError` when the version is outside the range, and
    :class:`PluginLoadError` naming the specifier when it is not one.
    """
    clauses = _parse_specifier(specifier)
    if not all(_satisfies(_release(API_VERSION), op, version, prefix) for op, version, prefix in clauses):
        raise IncompatiblePluginError(re.sub(r"\s+", "", specifier), API_VERSION)


def _parse_specifier(specifier: str) -> list[tuple[str, tuple[int, ...], bool]]:
    """``">=0.5,<0.6"`` as ``[(">=", (0, 5), False), ("<", (0, 6), False)]`` (True: a ``.*`` prefix)."""
    malformed = PluginLoadError(
        f"require_api({specifier!r}): not a version specifier; write one such as '>=0.5,<0.6' "
        "(clauses of ~=, ==, !=, <=, >=, <, > on release numbers, joined by commas)"
    )
    if not isinstance(specifier, str):
        raise malformed
    clauses = []
    for text in specifier.split(","):
        match = _CLAUSE.fullmatch(text.strip())
        if match is None:
            raise malformed
        op, version, prefix = match.groups()
        if (prefix and op not in ("==", "!=")) or (op == "~=" and "." not in version):
            raise malformed  # PEP 440: a .* only after == or !=, and ~= needs two numbers
        clauses.append((op, _release(version), bool(prefix)))
    return clauses


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _satisfies(have: tuple[int, ...], op: str, want: tuple[int, ...], prefix: bool) -> bool:
    if prefix or op == "~=":  # ==0.5.* : the first numbers are these; ~=0.5.2 : >=0.5.2, ==0.5.*
        head = want[:-1] if op == "~=" else want
        matches = (have + (0,) * len(head))[: len(head)] == head
        if op == "~=":
            return matches and _satisfies(have, ">=", want, False)
        return matches if op == "==" else not matches
    width = max(len(have), len(want))  # 0.5 == 0.5.0: missing numbers are zeros
    have, want = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
    return {
        "==": have == want,
        "!=": have != want,
        "<=": have <= want,
        ">=": have >= want,
        "<": have < want,
        ">": have > want,
    }[op]


Tensor = Any  # torch.Tensor, kept as Any so importing the API never imports torch


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


class LLMPError(Exception):
    """Base class of every error llmp raises on purpose."""


class PluginLoadError(LLMPError):
    """A plugin failed to import, register or report its components.

    Raised only in strict mode (``LLMP_STRICT_PLUGINS=1``); otherwise the
    failure is recorded and shown by ``llmp plugins list``.
    """


class IncompatiblePluginError(PluginLoadError):
    """A plugin was made for another version of the plugin API (see :func:`require_api`).

    Raised by ``require_api`` as the plugin's module is imported; the loader then lists the plugin
    as ``incompatible: needs llmp API <specifier> (this llmp has <API_VERSION>)`` and registers
    none of it (in strict mode the loader raises it, naming the plugin).
    """

    def __init__(self, specifier: str, api_version: str | None = None, plugin: str = "") -> None:
        self.specifier, self.api_version, self.plugin = specifier, api_version or API_VERSION, plugin
        super().__init__(f"plugin {plugin} is incompatible: {self.reason}" if plugin else self.reason)

    @property
    def reason(self) -> str:
        """``needs llmp API >=0.6 (this llmp has 0.5)``: what ``llmp plugins list`` shows."""
        return f"needs llmp API {self.specifier} (this llmp has {self.api_version})"

    def __reduce__(self) -> tuple[Any, ...]:  # pickles whole across processes (its __init__ is not (message,))
        return type(self), (self.specifier, self.api_version, self.plugin)


class UnknownComponentError(LLMPError, LookupError):
    """No plugin registers a component of this kind under this name."""

    def __init__(self, kind: str, name: str, available: Mapping[str, str]) -> None:
        self.kind, self.name, self.available = kind, name, dict(available)
        if available:
            choices = ", ".join(f"{n} (from {dist})" for n, dist in sorted(available.items()))
        else:
            choices = "none are installed"
        super().__init__(f"unknown {kind} {name!r}; valid names: {choices}")


class DuplicateComponentError(LLMPError):
    """Two plugins register a component of the same kind under the same name."""

    def __init__(self, kind: str, name: str, first: str, second: str, plugins: tuple[str, ...] = ()) -> None:
        self.kind, self.name, self.first, self.second = kind, name, first, second
        self.plugins = plugins
        super().__init__(
            f"{kind} {name!r} is registered by both {first} and {second}; "
            f"uninstall one, or pass replace=True in the record of the one that should win"
        )


class RequestValidationError(LLMPError, ValueError):
    """A request the engine will not run; ``field`` names the offending field (``top_p``,
    ``priority``), so a front-end answers its protocol's 400 naming that field without
    reading the message.

    ``message`` is the text, or a function making it from the field's name: a front-end
    whose protocol spells the field otherwise (``max_completion_tokens`` for ``max_tokens``)
    gets the message in its own words from :meth:`message_for`.
    """

    def __init__(self, field: str, message: str | Callable[[str], str]) -> None:
        self.field = field
        self._message = message
        super().__init__(self.message_for(field))

    def message_for(self, name: str) -> str:
        """The message, naming the field ``name`` where it names the field."""
        return self._message(name) if callable(self._message) else self._message


class LoRAAdapterNotFoundError(LLMPError, LookupError):
    """A LoRA adapter that is not there: its directory or ``adapter_config.json`` is missing, or
    no served or resolvable adapter has the name. Front-ends answer their protocol's 404."""


class InvalidLoRAAdapterError(RequestValidationError):
    """A LoRA adapter llmp will not serve: rank above ``--max-lora-rank``, another base model,
    targets or features it cannot apply (DoRA, biases, ``modules_to_save``, extra vocabulary),
    a corrupt file, or a name loaded twice. ``field`` is ``"model"`` or ``"lora_path"``; a 400."""


class EngineDeadError(LLMPError):
    """The engine (or one of its workers) has died; no request can complete."""


class EngineSleepingError(LLMPError):
    """The engine is asleep (``sleep()``, ``POST /sleep``): it takes no request until woken
    (``wake_up()``, ``POST /wake_up``). Servers answer 503. Also how a pooling request in flight
    ends when ``pause_generation(mode="abort")`` aborts it (it has no finish reason to say so)."""


class ModelLoadError(LLMPError):
    """A model could not be found or its files could not be read.

    Model plugins raise it from ``load_weights`` (naming the missing or misshapen
    weight) and from ``load_pretrained``; the kernel raises it for a model it cannot find.
    """


class DeviceError(LLMPError, ValueError):
    """The engine cannot run where it was asked to: ``--device cuda`` without a usable GPU, a device
    index the machine lacks, a dtype the GPU lacks, or a model that does not fit its memory. One
    line, at start-up."""


class ComponentImportError(LLMPError, ImportError):
    """A selected component's ``impl`` reference could not be imported."""


# --------------------------------------------------------------------------
# Records handed back by registration hooks
# --------------------------------------------------------------------------


def resolve_reference(reference: str) -> Any:
    """Import ``"package.module:attribute"`` (attribute may be dotted) and return it."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise ComponentImportError(f"{reference!r} is not of the form 'package.module:attribute'")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ComponentImportError(f"cannot import {reference!r}: {exc}") from exc
    return obj


@dataclass(frozen=True, kw_only=True)
class ComponentSpec:
    """Common fields of every registration record.

    Plugins fill ``name``, ``impl`` and optionally ``description`` and
    ``replace``; the kernel stamps ``plugin``, ``distribution`` and
    ``version`` when it collects the record.
    """

    kind: ClassVar[str] = "component"

    name: str
    impl: str
    description: str = ""
    replace: bool = False
    plugin: str = ""
    distribution: str = ""
    version: str = ""

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"{type(self).__name__}.name must be a non-empty string")
        if ":" not in self.impl:
            raise ValueError(
                f"{type(self).__name__}({self.name!r}).impl must be 'package.module:attribute', got {self.impl!r}"
            )

    def load(self) -> Any:
        """Import and return the implementation (class, factory or object)."""
        return resolve_reference(self.impl)

    def stamped(self, plugin: str, distribution: str, version: str) -> ComponentSpec:
        return dataclasses.replace(self, plugin=plugin, distribution=distribution, version=version)


ModelTask = Literal["generate", "embed", "classify", "reward"]
"""What a model class does natively (``ModelSpec.tasks``) and the primary task an engine serves
(``ResolvedModel.task``): generate text, embed, classify a sequence (cross-encoders, classifier
heads) or reward every token (reward models)."""


@dataclass(frozen=True, kw_only=True)
class ModelSpec(ComponentSpec):
    """A model implementation, named by the Hugging Face architecture it serves.

    ``name`` is the ``architectures`` entry of ``config.json``, e.g.
    ``"LlamaForCausalLM"``. ``model_impl`` is ``"native"`` for models on the
    paged KV cache and ``"transformers"`` for the fallback; a spec named
    ``"*"`` serves any architecture no other spec claims.
    """

    kind: ClassVar[str] = "model"
    tasks: tuple[ModelTask, ...] = ("generate",)
    model_impl: Literal["native", "transformers"] = "native"


@dataclass(frozen=True, kw_only=True)
class KernelSetSpec(ComponentSpec):
    """A set of tensor kernels (see :class:`KernelSet`).

    When no set is named, the kernel with the highest ``priority`` among
    those whose ``devices`` include the engine's device is chosen.
    """

    kind: ClassVar[str] = "kernels"
    devices: tuple[str, ...] = ("cpu",)
    priority: int = 0


@dataclass(frozen=True, kw_only=True)
class ExecutorSpec(ComponentSpec):
    """An executor: how model workers are started and driven."""

    kind: ClassVar[str] = "executor"
    distributed: bool = False


@dataclass(frozen=True, kw_only=True)
class FrontendSpec(ComponentSpec):
    """A protocol front-end served over the engine (see :class:`Frontend`).

    ``requires`` names the front-ends whose routes this one calls (the web chat page calls the
    OpenAI routes): ``llmp serve`` mounts them too, before this one, when they are not listed.

    ``probe`` (optional) tells the conformance kit (``llmp plugins verify``) how to ask this
    front-end's protocol for a generation: ``"package.module:attribute"``, lazily, naming an object
    (or a class made without arguments) of :class:`llmp.conformance.FrontendProbe`. Without one, the
    kit checks what needs no request of the protocol (start and stop, the API key, body limits, bad
    bodies on every route) and skips the rest, saying so.
    """

    kind: ClassVar[str] = "frontend"
    requires: tuple[str, ...] = ()
    probe: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.probe is not None and ":" not in self.probe:
            raise ValueError(
                f"FrontendSpec({self.name!r}).probe must be 'package.module:attribute', got {self.probe!r}"
            )


@dataclass(frozen=True, kw_only=True)
class LoRAResolverSpec(ComponentSpec):
    """A LoRA resolver: finds an adapter a request names that the server does not serve yet
    (see :class:`LoRAResolver`). ``impl`` is a factory ``(options: FrontendOptions) -> LoRAResolver``.
    Resolvers run only with ``--enable-lora-runtime-updates``, in registry order."""

    kind: ClassVar[str] = "lora_resolver"


@dataclass(frozen=True, kw_only=True)
class ToolParserSpec(ComponentSpec):
    """A tool-call parser, selected with ``--tool-call-parser NAME``."""

    kind: ClassVar[str] = "tool_parser"


@dataclass(frozen=True, kw_only=True)
class ReasoningParserSpec(ComponentSpec):
    """A reasoning parser, selected with ``--reasoning-parser NAME``."""

    kind: ClassVar[str] = "reasoning_parser"


@dataclass(frozen=True, kw_only=True)
class SchedulerSpec(ComponentSpec):
    """A request scheduler (see :class:`Scheduler`)."""

    kind: ClassVar[str] = "scheduler"


@dataclass(frozen=True, kw_only=True)
class KVManagerSpec(ComponentSpec):
    """A KV-cache manager (see :class:`KVCacheManager`)."""

    kind: ClassVar[str] = "kv_manager"


@dataclass(frozen=True, kw_only=True)
class StatLoggerSpec(ComponentSpec):
    """A stat logger the engine feeds with step and request figures."""

    kind: ClassVar[str] = "stat_logger"


@dataclass(frozen=True, kw_only=True)
class CommandSpec(ComponentSpec):
    """A ``llmp`` sub-command.

    ``impl`` resolves to a ``typer.Typer`` (a command group) or a plain
    function (one command, its parameters declared the typer way). The
    module named by ``impl`` is imported when the command is listed or run,
    so keep its top level light and import heavy libraries inside functions.
    """

    kind: ClassVar[str] = "command"
    help: str = ""


SPEC_TYPES: dict[str, type[ComponentSpec]] = {
    cls.kind: cls
    for cls in (
        ModelSpec,
        KernelSetSpec,
        ExecutorSpec,
        FrontendSpec,
        LoRAResolverSpec,
        ToolParserSpec,
        ReasoningParserSpec,
        SchedulerSpec,
        KVManagerSpec,
        StatLoggerSpec,
        CommandSpec,
    )
}
"""Every component kind, keyed by the name used in ``--kind`` and error messages."""

KINDS: tuple[str, ...] = tuple(SPEC_TYPES)


# --------------------------------------------------------------------------
# The model an engine serves, resolved once
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PoolingConfig:
    """How an embedding model's hidden states become its embedding: the sentence-transformers
    configuration of the model directory (``modules.json``), else the model class's
    ``default_pooling`` and ``default_normalize``."""

    pooling_type: str  # a pooler of llmp.modeling.pooling.POOLERS: "cls", "mean", "last", "all", "step"
    normalize: bool  # the default of a request that does not say


@dataclass(frozen=True, kw_only=True)
class ResolvedModel:
    """The model an engine serves, resolved once where the engine is asked for
    (``LLM``, ``AsyncLLM``, ``llmp serve``) and handed down to the engine, the
    executor, every worker and every model runner, which use it as is.

    Plain, picklable data: an executor sends it to its worker processes or actors.
    ``llmp.model_files.resolve.resolve_model(config)`` makes it.
    """

    name: str  # the model as the caller named it (a path, a Hub or packaged name): EngineInfo.model
    model_dir: pathlib.Path  # the Hugging Face directory (for a GGUF file, its converted copy)
    tokenizer: str  # the tokenizer's directory or Hub name (the model directory unless overridden)
    config: Any  # ``llmp.model_files.config.PlainConfig``: every attribute of transformers' config
    architectures: tuple[str, ...]  # from config.json, or the causal LM its model_type maps to
    spec: ModelSpec  # the model implementation serving it, as the registry selected it
    task: ModelTask  # the primary task: what the engine does with a request that does not say
    dtype: Literal["bfloat16", "float16", "float32"]  # of the weights (and of the KV cache, unless kv_cache_dtype)
    context_len: int  # the model's context (max_position_embeddings; 4096 when config.json has none)
    # every task the engine takes: "generate" and the pooling tasks of llmp.pooling_params.POOLING_TASKS
    # ("embed", "classify", "score", "token_embed", "token_classify")
    supported_tasks: tuple[str, ...] = ("generate",)
    pooling: PoolingConfig | None = None  # the pooler of the primary pooling task (None: a generate-only model)
    score_mode: Literal["cross-encoder", "bi-encoder"] | None = None  # how "score" is computed, if supported
    hf_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)  # applied to ``config`` already


# --------------------------------------------------------------------------
# Observer payloads
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What an engine was started with, passed to life-cycle hooks."""

    model: str
    executor: str
    kernels: str
    scheduler: str
    kv_manager: str
    device: str
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FinishedRequestStats:
    """Figures of one request that ended (finished or aborted), handed to stat loggers."""

    request_id: str
    finish_reason: str | None
    num_prompt_tokens: int
    num_generation_tokens: int
    num_cached_tokens: int
    queued_seconds: float
    time_to_first_token_seconds: float | None
    end_to_end_seconds: float


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """Figures of one engine step, handed to stat loggers."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    num_prompt_tokens: int = 0  # prompt tokens computed in this step (prefill chunks, recomputes included)
    num_generation_tokens: int = 0  # tokens sampled in this step


# --------------------------------------------------------------------------
# Contracts of the components behind the records
# --------------------------------------------------------------------------


@dataclass(slots=True)
class AttentionMetadata:
    """How a flattened batch of ``R`` requests maps onto the paged KV cache.

    The new tokens of request ``r`` are rows ``query_start_loc[r]:query_start_loc[r+1]``
    of the batch; they are the *last* tokens of its sequence, which holds
    ``seq_lens[r]`` tokens once they are written (cached prefix + new tokens).
    A prefill chunk and a decode step differ only in their query length.
    """

    query_start_loc: Tensor  # [R + 1] int32, cumulative query lengths
    seq_lens: Tensor  # [R] int32, tokens in context after this step
    block_tables: Tensor  # [R, max_blocks] int32, physical block ids in order
    slot_mapping: Tensor  # [T] int64, flat cache slot of each new token (-1 = don't write)
    max_query_len: int
    max_seq_len: int
    sliding_window: int | None = None  # attend only to the last N positions when set


@runtime_checkable
class KernelSet(Protocol):
    """Tensor kernels a model calls; the ``torch`` set is the reference.

    Shapes: ``T`` tokens in the flattened batch, ``H`` query heads, ``Hkv``
    KV heads, ``D`` head size, ``N`` hidden size, ``B`` blocks, ``S`` block size.

    Optional attribute: ``mlp_block_rows`` (int). Gated MLPs then run a batch
    longer than that in blocks of that many rows, so a long prefill's
    intermediate activations stay in cache (the ``cpu`` set uses 256).

    Optional attribute: ``traceable_decode`` (bool, default False). True says
    every kernel of a step is torch ops whose work depends only on tensor
    values and shapes (no Python branch on a tensor's value, no host copy):
    on the CPU the engine may then replay decode steps from a TorchScript
    trace, checked against the eager model before use (``docs/architecture.md``).

    Optional method: ``isa_path(device, dtype)`` -> str, one phrase naming the instruction path the
    set's kernels take on ``device`` (``"cpu"``, ``"cuda:0"``) for ``dtype`` weights (``"bfloat16"``):
    its loops' ISA first, then what multiplies ``bfloat16``/``float16`` matrices (say nothing of
    matmuls for ``float32``). The engine's start-up line and ``llmp collect-env`` show it; a set
    without one is described by torch's path (``llmp.progress.isa_path``: ATen's vector ISA, AMX,
    oneDNN's native or emulated half-precision matmul), right for sets that multiply with torch.

    Optional method: ``argmax(logits)``, logits ``[R, V]`` in the model's dtype (or float32) ->
    ``[R]`` int64, the first index of each row's largest value, a NaN counting as the largest
    (``torch.argmax``'s answer). The sampler takes greedy tokens with it where the set has one.
    """

    name: str

    def rms_norm(
        self, x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None
    ) -> Tensor | tuple[Tensor, Tensor]:
        """RMSNorm of ``x`` [T, N]; with ``residual``, normalise ``x + residual``
        and return ``(normed, x + residual)``."""
        ...

    def rotary(self, positions: Tensor, q: Tensor, k: Tensor, cos_sin: Tensor) -> tuple[Tensor, Tensor]:
        """Apply rotary embeddings (neox layout) to q [T, H, D] and k [T, Hkv, D]
        using ``cos_sin`` [max_pos, D] (cos half, sin half) rows at ``positions`` [T].
        A set may rotate q and k in place and return them: callers use the returned
        tensors and must not keep the unrotated ones."""
        ...

    def silu_and_mul(self, x: Tensor) -> Tensor:
        """``silu(x[..., :d]) * x[..., d:]`` for x [T, 2d]."""
        ...

    def gelu_tanh_and_mul(self, x: Tensor) -> Tensor:
        """``gelu_tanh(x[..., :d]) * x[..., d:]`` for x [T, 2d] (Gemma's gated MLP)."""
        ...

    def write_kv(self, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
        """Store k, v [T, Hkv, D] into caches [B, S, Hkv, D] at flat slots [T] (-1 = skip). The caches may be
        of another dtype than k and v (``EngineConfig.kv_cache_dtype``: a float32 model's 16-bit cache): each
        value is rounded to the cache's dtype as ``Tensor.to`` rounds it."""
        ...

    def paged_attention(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        metadata: AttentionMetadata,
        scale: float,
        softcap: float | None = None,
    ) -> Tensor:
        """Causal attention of q [T, H, D] over the paged cache for a mixed
        prefill/decode batch described by ``metadata``; returns [T, H, D].
        With ``softcap`` the scores are capped as ``softcap * tanh(scores / softcap)``
        before the softmax (Gemma 2). The caches may be of another dtype than q (``kv_cache_dtype``): their
        values are converted to q's dtype (exactly for float32 q and a 16-bit cache, a float32 model's) and
        the result is q's dtype."""
        ...


@runtime_checkable
class PacksLinear(Protocol):
    """Optional part of a :class:`KernelSet`: linear layers computed from a re-laid-out weight.

    The model runner calls ``pack_linear`` once per linear layer after the
    weights are loaded. The set returns a function computing
    ``x @ weight.T (+ bias)`` for x [T, in] -> [T, out], free to keep the weight
    in whatever layout its matmul reads fastest (oneDNN's blocked layouts,
    quantized copies ...), or ``None`` to leave the layer on ``F.linear``.
    The layer drops its dense weight afterwards unless another module shares it.

    The layer calls the function in blocks of exactly ``llmp.modeling.layers.INVARIANT_ROWS`` rows (the
    last padded), so that a row's result never depends on the batch whatever the matmul library does with
    other row counts. A function whose rows are independent by construction (one fixed summation order
    per row, whatever ``T``) says so with the attribute ``row_invariant = True``; it is then called on the
    batch as it is, without the padding (a decode step of one sequence multiplies one row, not 32).
    """

    def pack_linear(self, weight: Tensor, bias: Tensor | None) -> Callable[[Tensor], Tensor] | None: ...


@runtime_checkable
class PacksGatedLinear(Protocol):
    """Optional part of a :class:`KernelSet` with ``pack_linear``: a gated MLP's gate|up matmul and its
    activation in one pass, the ``[T, 2I]`` product never stored.

    The model runner calls ``pack_gated_linear`` once per gated MLP (``llmp.modeling.layers.GatedMLP``) whose
    fused gate|up weight ``[2I, in]`` (the gate's ``I`` rows, then the up's) is dense, before ``pack_linear``;
    ``activation`` is ``"silu"`` or ``"gelu_tanh"``. The set returns ``(plain, gated)``, two functions of x
    ``[T, in]`` sharing one copy of the weight: ``plain(x)`` is ``x @ weight.T (+ bias)`` ``[T, 2I]`` as
    ``pack_linear``'s function would give it, ``gated(x)`` is ``act(gate) * up`` ``[T, I]`` of that product with
    the bits of the set's own ``silu_and_mul``/``gelu_tanh_and_mul`` on it; or ``None`` to leave the layer to
    ``pack_linear`` and the activation kernel. The layer calls ``gated`` unless LoRA adapts it (the adapters'
    deltas are added to the plain product first). Both are called on the batch as it is, and so must be row
    invariant (``row_invariant = True``, :class:`PacksLinear`).
    """

    def pack_gated_linear(
        self, weight: Tensor, bias: Tensor | None, activation: str
    ) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]] | None: ...


@dataclass(frozen=True, kw_only=True)
class DecoderLayerParts:
    """A Llama-shaped decoder layer, as :class:`PacksDecoderLayer` receives it.

    The layer computes ``x, residual = norm(hidden + residual)`` (the first layer: ``x = norm(hidden)``, the
    residual ``hidden``); ``q|k|v = qkv(x)``; the set's ``rotary`` on q and k over the whole head from the table
    passed per call (its ``[max_positions, head_dim]`` float32 cos|sin rows); the set's ``write_kv`` of k and v;
    ``a = paged_attention(q, ...)`` with ``scale``, ``softcap`` and ``sliding_window`` (None: none);
    ``x, residual = norm(o(a) + residual)``; and returns ``(down(gate_up_act(x)), residual)``. The norms are the
    set's ``rms_norm`` with the weights ``[N]`` and ``eps`` given. ``qkv``, ``o`` and ``down`` are the functions
    this set's ``pack_linear`` returned for the layer (``qkv`` adds its bias; ``o`` and ``down`` have none) and
    ``gate_up_act`` the ``gated`` function of its ``pack_gated_linear`` (SiLU).
    """

    input_norm: Any  # Tensor [N]
    post_attention_norm: Any  # Tensor [N]
    eps: float
    qkv: Callable[[Any], Any]
    o: Callable[[Any], Any]
    gate_up_act: Callable[[Any], Any]
    down: Callable[[Any], Any]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    softcap: float | None
    sliding_window: int | None


@runtime_checkable
class PacksDecoderLayer(Protocol):
    """Optional part of a :class:`KernelSet` with :class:`PacksGatedLinear`: a decode step's decoder layer in
    one call, where calling its kernels one at a time costs more than their arithmetic (each a dispatch and, on
    the CPU, a parallel region whose threads wait for each other at its end; a layer of a small model at batch 1
    is a few tens of microseconds of work).

    The model runner calls ``pack_decoder_layer`` once per layer of the shared decoder
    (``llmp.modeling.decoder.DecoderLayer``) whose parts are the plain Llama shape (RMSNorm, no q/k norm,
    rotary over the whole head, a gated SiLU MLP whose activation the set fused, no bias on o and down, one
    tensor-parallel rank), after ``pack_linear``; LoRA takes the function away again (its adapters are added
    between the parts). The set returns a function, or ``None`` to leave the layer to its parts.

    The layer calls ``fused(positions, hidden, residual, metadata, k_cache, v_cache, cos_sin)`` for the steps
    whose every request has one new token (``metadata.max_query_len == 1``; the traced decode steps too):
    positions ``[T]``, hidden and residual ``[T, N]`` (residual None in the first layer), this layer's cache
    tensors, the rotary table. It returns ``(out, residual)`` as the layer's parts give them, with their very
    bits (a token must not depend on which path computed it), and writes k and v into the caches; or ``None``
    where it does not compute these inputs (another dtype, a cache it cannot write), and the layer then runs
    its parts.
    """

    def pack_decoder_layer(self, parts: DecoderLayerParts) -> Callable[..., Any] | None: ...


@runtime_checkable
class PacksQuantized(Protocol):
    """Optional part of a :class:`KernelSet`: linear layers computed from weights kept quantised.

    A model loaded from a GGUF file keeps its linear layers' weights in GGML blocks
    (:class:`llmp.quantization.QuantizedWeight`: ``Q4_K``, ``Q6_K``, ``Q8_0`` ...). The model runner
    calls ``pack_quantized`` once per such weight after loading (a fused q|k|v of mixed formats: once
    per format's rows). The set returns a function computing ``x @ W.T`` for x ``[T, in]`` in the
    model's dtype -> ``[T, out]`` in x's dtype, ``W`` the weight as
    :func:`llmp.quantization.dequantize` gives it (no bias: the layer adds its own), or ``None`` for a
    format it does not compute; the layer then dequantises that weight once, to the model's dtype,
    and computes it as a dense one (``pack_linear`` or ``F.linear``). A row's result must depend only on
    that row (fixed summation order whatever ``T``), so greedy output never depends on the batch.
    The conformance kit (``llmp plugins verify``) checks the function against
    :func:`llmp.quantization.matmul_reference` and a row alone against the same row in a batch.
    """

    def pack_quantized(self, weight: QuantizedWeight) -> Callable[[Tensor], Tensor] | None: ...


@dataclass(slots=True)
class LoRAMapping:
    """Which rows of a forward call run with which LoRA slot: built once per call by the model runner
    (``llmp.modeling.lora``) and read by every adapted layer and by :class:`LoRAKernels`."""

    token_slots: Tensor  # [T] int64 on the device: each row's slot, -1 = the base model only
    rows: Tensor  # [N] int64 on the device: the rows with a slot, grouped by slot ascending, row order kept
    group_slots: tuple[int, ...]  # the slot of each group
    group_sizes: tuple[int, ...]  # rows per group (sum = N)


@runtime_checkable
class LoRAKernels(Protocol):
    """Optional part of a :class:`KernelSet`: the two batched matmuls of multi-LoRA (vLLM's punica
    shrink and expand). ``--enable-lora`` needs a kernel set with them.

    ``a`` stacks every slot's A ``[L, R, in]`` and ``b`` every slot's B ``[L, out, R]`` (scaling
    already in B; a slot of lower rank is zero-padded to R). Rows are those of ``mapping.rows``.
    A row's result must depend only on that row and its slot's weights (on the CPU, matmuls in
    ``llmp.modeling.layers.row_invariant`` blocks), so greedy output never depends on the batch.
    """

    def lora_shrink(self, x: Tensor, a: Tensor, mapping: LoRAMapping) -> Tensor:
        """``s[j] = x[rows[j]] @ a[slot(j)].T``: x [T, in] -> s [N, R] in x's dtype."""
        ...

    def lora_expand(self, y: Tensor, s: Tensor, b: Tensor, mapping: LoRAMapping) -> None:
        """``y[rows[j]] += s[j] @ b[slot(j)].T`` in place: y [T, out], s [N, R]."""
        ...


class LoRAResolver(Protocol):
    """Finds a LoRA adapter by the name a request gives (``model``), for ``llmp_register_lora_resolvers``.

    Returns a :class:`llmp.LoRARequest` (its ``lora_int_id`` is replaced by the server's own) or
    ``None`` when this resolver does not know the name; the first resolver whose adapter loads wins.
    """

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> Any: ...


class Model(Protocol):
    """A causal LM the model runner drives (``llmp.modeling.layers.CausalLM`` implements
    everything but ``__init__`` and ``forward``).

    The runner builds it under ``torch.device("meta")``, gives it empty tensors
    on the device (as ``to_empty`` does), calls ``tie_weights()`` if present, then ``load_weights``.
    A class with a ``load_pretrained(model_dir, config, kernels, dtype, device)``
    classmethod builds and loads itself instead (the transformers fallback).

    ``config`` holds every attribute of transformers' config for the model
    directory, aliases included. A native model (``ModelSpec.model_impl ==
    "native"``) gets it as ``llmp.model_files.config.PlainConfig``, read
    from llmp's cache without importing transformers; a ``"transformers"``
    model gets transformers' own config object.

    Pooling (embed, classify, score, reward), all optional:

    - ``is_pooling_model = True``: a model without an LM head (an encoder, a classifier);
      the runner never calls ``compute_logits`` on it.
    - ``default_pooling``: the pooler (a name in ``llmp.modeling.pooling.POOLERS``: ``"cls"``,
      ``"mean"``, ``"last"``) for its sequence tasks; ``default_normalize`` for embeddings.
    - ``classify(pooled: Tensor[N, H]) -> Tensor[N, num_labels]``: the classification head,
      applied by the runner after pooling for ``classify``, ``score`` (a cross-encoder:
      ``num_labels == 1``) and, row by row, ``token_classify`` (reward models). The runner
      applies the activation (sigmoid, softmax, identity: ``llmp.modeling.pooling``) itself.
      A causal LM may have both ``compute_logits`` and ``classify`` (an LLM reranker scoring
      with its yes/no token logits) and then serves generation and scores in one batch.
    - ``accepts_token_type_ids = True``: ``forward`` also takes ``token_type_ids=Tensor[T]``
      (the segment ids of text pairs, all zeros when no request has them).
    - ``num_labels`` (an int), ``default_use_activation`` (a bool), ``default_step_tag_id`` (a
      token id): an architecture's fixed head size and its request defaults where a request leaves
      ``use_activation`` or ``step_tag_id`` unset (a reward model's raw rewards, a process reward
      model's step tag), as vLLM's per-architecture pooler configuration.
    - ``per_token_outputs = False``: its rows do not hold per-token results (a wrapped model that
      pools inside its own forward), so the token tasks (``token_embed``, ``token_classify``) are
      not offered for it.
    - ``accepts_output_rows = True``: ``forward`` may be given ``output_rows=Tensor[R]``
      (increasing rows) when those are all the step reads, and then returns ``[R, N]`` hidden
      states of just those rows: one row per request (each request's first row for ``cls``, its
      last for ``last``) when those are all the step's poolers read, or the sampled rows (each
      request's last) of a step with prompt rows whose logits nobody reads (no prompt logprobs,
      no pooling, no LoRA). An encoder skips the other rows' queries and MLP in its last layer; a
      decoder writes every row's keys and values there but attends and runs the MLP on those rows.
    """

    def __init__(self, config: Any, kernels: KernelSet) -> None: ...

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Consume ``(hf_name, tensor)`` pairs from the checkpoint; raise
        :class:`ModelLoadError` naming a missing or misshapen weight."""
        ...

    def attention_layers(self) -> Sequence[Any]:
        """Layers needing a KV cache, in order; each has ``num_kv_heads``, ``head_dim``
        and a ``kv_cache`` attribute the runner sets to ``(k_cache, v_cache)``."""
        ...

    def forward(self, input_ids: Tensor, positions: Tensor, attn_metadata: AttentionMetadata) -> Tensor:
        """Hidden states [T, N] for the flattened batch."""
        ...

    def compute_logits(self, hidden_states: Tensor) -> Tensor:
        """Logits [R, V] for the rows the sampler needs."""
        ...


class Scheduler(Protocol):
    """Decides which requests run in each engine step, within a token budget.

    Built as ``Scheduler(config, kv_manager)`` with a
    ``llmp.scheduling.SchedulerConfig``; requests are
    ``llmp.scheduling.Request`` objects (see :mod:`llmp.scheduling`).

    LoRA (``--enable-lora``) needs ``lora_counts() -> (running, waiting)``, each a
    ``{lora_id: requests}`` dict, and a schedule that never runs more distinct adapters
    (``request.lora_id`` > 0) at once than ``config.max_loras``.
    """

    num_preemptions: int

    def add_request(self, request: Any) -> None: ...

    def abort_requests(self, request_ids: Iterable[str]) -> list[Any]: ...

    def finish(self, request: Any, status: Any, stop_reason: int | str | None = None) -> None:
        """End a request early (a stop string found by the output processor) and free its blocks."""
        ...

    def schedule(self) -> Any:
        """The work of one step: a ``SchedulerOutput`` of (request, start, num_tokens) items."""
        ...

    def update_from_output(self, scheduled: Any, sampled: list[int | None]) -> list[Any]:
        """Append sampled tokens (None for a partial prefill chunk), finish requests
        on EOS, stop tokens, ``max_tokens`` or the context limit; return the updated requests."""
        ...

    def has_unfinished_requests(self) -> bool: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...


class KVCacheManager(Protocol):
    """Owns KV blocks: allocation, freeing and prefix caching.

    Built as ``KVCacheManager(num_blocks, block_size, enable_prefix_caching)``; it works on
    ``llmp.scheduling.Request`` objects.

    LoRA (``--enable-lora``) needs ``supports_lora = True``: a manager saying so keys its prefix
    cache by ``request.lora_id`` (0 = the base model), so two adapters never share a block.
    A prompt with a ``cache_salt`` (with prefix caching on) needs ``supports_cache_salt = True``:
    the manager keys its prefix cache by ``request.cache_salt`` too (None = unsalted), so
    prompts of different salts never share a block.
    """

    prefix_cache_queries: int  # prompt tokens looked up, cumulative
    prefix_cache_hits: int  # of which found in the cache

    def get_computed_blocks(self, request: Any) -> tuple[list[int], int]:
        """Cached blocks matching the request's prefix and how many tokens they hold
        (always leaving at least one token to compute)."""
        ...

    def allocate_slots(
        self, request: Any, num_new_tokens: int, computed_blocks: Sequence[int] = ()
    ) -> list[int] | None:
        """Take ``computed_blocks`` and room for ``num_new_tokens`` more tokens; return the
        new blocks, or ``None`` (changing nothing) when out of blocks."""
        ...

    def free(self, request: Any) -> None: ...

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1."""
        ...

    # optional: ``reset_prefix_cache() -> bool`` forgets every cached block no request holds and
    # says whether it did (False while some are held); the engine's ``reset_prefix_cache()`` and
    # ``sleep()`` need it


class Executor(Protocol):
    """Starts model workers and runs forward passes on them.

    Built as ``Executor(config, model)`` (the engine's
    :class:`~llmp.options.EngineConfig` and the :class:`ResolvedModel`, which it
    hands to every worker as is: workers never look the model up again; see
    :mod:`llmp.executor` for the worker). The engine prepares each step's
    inputs and samples from the returned logits, so an executor only runs the model.
    """

    kernels_name: str  # the kernel set the workers selected
    # optional: the path it takes (``Worker.describe()["isa_path"]``), for the start-up line; the engine
    # describes torch's path where an executor has no such attribute
    kernels_isa_path: str

    def __init__(self, config: EngineConfig, model: ResolvedModel) -> None: ...

    def bytes_per_block(self) -> int:
        """KV-cache bytes one block takes on one worker."""
        ...

    def allocate_kv_cache(self, num_blocks: int) -> None: ...

    def execute_model(self, inputs: Any) -> Any:
        """Run one step on every worker: ``inputs`` is the engine's step record, picklable and
        opaque to the executor, handed to each ``Worker.execute_model`` as is; return what rank 0's
        worker returns."""
        ...

    def check_health(self) -> None:
        """Raise ``EngineDeadError`` if any worker is dead."""
        ...

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Run ``method`` on every worker and return the results, one per rank in rank order.

        ``method`` names a public method of :class:`llmp.executor.Worker` (no leading underscore),
        or is a function called as ``method(worker, *args, **kwargs)`` (picklable by reference,
        for workers in other processes). Run it on each rank with
        :func:`llmp.executor.call_worker_method`, which refuses an unknown or private name with a
        ``ValueError``; a call that raises on a rank must not stop that rank: raise
        ``ValueError("collective_rpc ... failed on rank R: ...")`` here instead. ``timeout``
        (seconds; None: no limit) bounds the wait: past it raise ``TimeoutError``, and make sure a
        late answer is never taken for the reply to a later call. The engine drives sleep
        (``sleep``/``wake_up``) and profiles (``start_profile``/``stop_profile``) through this
        method, so an executor without it serves requests but not those."""
        ...

    def shutdown(self) -> None:
        """Stop every worker; idempotent."""
        ...


class EngineClient(Protocol):
    """What a front-end sees of the engine: ``AsyncLLM``, with every request measured for ``/metrics``.

    ``info`` holds what the engine was started with: ``model_dir``,
    ``max_model_len``, ``vocab_size``, ``task`` (the primary task: ``"generate"``, ``"embed"``,
    ``"classify"`` or ``"reward"``), ``supported_tasks`` (every task it takes, as ``ResolvedModel``).
    ``generate``/``encode`` check the request when called (raising
    ``RequestValidationError``), before the first iteration, so a front-end can
    answer 400 before it starts a stream. Leaving their loop early aborts the
    request in the engine. A prompt is an ``llmp.Prompt`` (the front-end kit's
    ``prompt_inputs`` and ``conversation_prompt`` make them) or text.
    """

    info: Mapping[str, Any]

    def generate(
        self, prompt: Any, params: Any, request_id: str | None = None, *, priority: int = 0, delta: bool = False
    ) -> AsyncIterator[Any]: ...

    def encode(
        self, prompt: Any, pooling_params: Any = None, request_id: str | None = None, *, priority: int = 0
    ) -> AsyncIterator[Any]: ...

    async def abort(self, request_id: str) -> None: ...

    async def check_health(self) -> None: ...

    def get_tokenizer(self) -> Any: ...


class Frontend(Protocol):
    """A protocol front-end over one engine (``llmp serve --frontend NAME``).

    Built once the engine is ready, with the engine client and the server's
    :class:`~llmp.options.FrontendOptions`, a frozen typed record holding every
    default: ``served_model_names`` (the first is echoed in responses),
    ``model_root``, ``max_model_len``, ``task``, the request-handling options of
    ``llmp serve`` (``chat_template``, ``max_logprobs``, ``max_n`` ...), and for
    front-ends that listen on their own port, ``host``, ``grpc_port`` and
    ``api_keys`` (the server's ``--api-key`` values, which must guard it too).
    HTTP front-ends return a FastAPI ``APIRouter`` from
    ``http_router``; the shared server mounts it behind its API key, CORS,
    request-id and body-limit middleware, and renders ``llmp.frontend.APIError``
    (and a :class:`RequestValidationError`, from the engine or ``SamplingParams``,
    as a 400 naming its ``field``).
    Others (gRPC) return ``None``. Every front-end's ``serve`` runs as a task
    for the server's lifetime and is cancelled at shutdown: a front-end with its
    own server (gRPC) runs it there, binding its port first (the server says it
    is ready 0.2 s later, unless that failed), an HTTP one may keep background
    work there or return at once; if it raises, the server shuts down with
    status 1. A front-end with its own server is cancelled at the first SIGINT or
    SIGTERM: it refuses new calls and gives those in flight ``shutdown_timeout``
    seconds (the engine aborts any left then); the engine stops only once every
    ``serve`` has returned.

    A front-end whose protocol has its own error shape (Anthropic's
    ``{"type": "error", "error": {...}}``, with 529 for overload) lists its path
    prefixes in ``error_paths`` and implements ``render_error(error: APIError)
    -> (status, body)``: the server then renders every error on those paths
    with it, the gate's refusals (401, 413, 503 and overload) included. Make it
    a ``staticmethod`` (it needs no state) and it also shapes the refusals
    while the model loads, before the front-end is built.

    Optional class attributes shape what an HTTP front-end's router may claim:

    - ``public_paths``: paths answered without the API key, each exact (``"/"``, always exact) or
      a prefix ending in ``/`` (``"/webui/"``). Only for content that holds no data and runs no model
      (a static page and its assets; the page's own API calls carry the key).
    - ``root_priority`` (an int, default 0): when several mounted front-ends route ``/``, the
      one with the highest keeps every method of ``/`` and the others' ``/`` routes are
      dropped (a web page, 10, wins over Ollama's "Ollama is running" banner, 1).
    - ``any_body_type_paths``: path prefixes whose POST bodies are read as JSON whatever their
      ``Content-Type`` (Ollama's API, whose documented ``curl -d`` examples send a form type).
      Elsewhere, and for any request carrying an ``Origin`` header (a browser page, which could
      otherwise post cross-site without a CORS preflight), a type other than JSON is a 400.
    - ``upload_paths``: a mapping of exact paths to byte limits whose POST bodies may be
      ``multipart/form-data`` (file uploads: OpenAI's ``/v1/files``), read up to that limit
      instead of ``--max-request-body-bytes``, with no JSON checks. A value may also be
      ``(limit, message)``: the message of the 413 for a larger body (naming the option that sets it).
    - ``self_admitted_paths``: path prefixes whose POSTs the server's admission does not count or
      refuse at capacity, because the front-end admits its model requests itself (the engine client
      refuses a request over ``--max-num-seqs`` plus ``--max-queue-len`` with the overload
      ``APIError``): MCP's ``/mcp``, where one path carries tool calls and messages needing no model.
    - ``admin_paths``: exact paths that are management routes (OpenAI's ``/v1/chat/completions/render``):
      dropped (404) unless ``llmp serve --enable-admin-api``, and then behind ``--admin-api-key`` when set.
    - ``fallback_paths``: exact paths the front-end routes only when no other mounted front-end routes
      them (Anthropic's ``/v1/models``, which the OpenAI front-end answers in its shape when both are
      mounted).
    """

    def __init__(self, engine: EngineClient, options: FrontendOptions) -> None: ...

    def http_router(self) -> Any | None: ...

    async def serve(self) -> None: ...


@dataclass(slots=True)
class ParsedToolCall:
    """One function call found in model text: its name and its arguments as JSON text."""

    name: str
    arguments: str  # JSON object text; while streaming, the part generated so far


@dataclass(slots=True)
class ToolCallParse:
    """What a tool parser found in (a prefix of) a completion."""

    content: str  # the text outside tool calls
    calls: list[ParsedToolCall] = field(default_factory=list)


@dataclass(slots=True)
class ReasoningParse:
    """What a reasoning parser found in (a prefix of) a completion."""

    reasoning: str | None  # None: the completion has no reasoning section
    content: str  # the answer after the reasoning


class ToolParser(Protocol):
    """Turns model text into tool calls (``--tool-call-parser NAME``).

    One instance serves every request of a server; ``parse`` must not keep
    per-request state. The server streams by calling ``parse`` on each longer
    prefix of the completion and sending the differences between successive
    results (``llmp.parsing.MessageStream``), so the streamed deltas always add
    up to the non-streamed message. That asks two things of ``parse``:

    * ``final=False`` (a prefix, more text may follow): report only what later
      text cannot change. ``content`` must hold back a tail that could still
      become a tool-call marker (``llmp.parsing.held_back``); a call appears
      once its name is complete; its ``arguments`` are the argument text
      generated so far.
    * Results only grow: each later result's ``content``, list of calls and
      each call's ``arguments`` extend the earlier ones (names never change).

    ``final=True`` is the whole completion. A call cut off by ``max_tokens``
    stays a call with the arguments generated so far (the ``length`` finish
    reason tells the client), as it was streamed: raw arguments stay as cut;
    a parser that builds the JSON itself may close it, appending only.

    ``tools`` are the request's OpenAI tool definitions (parsers that convert
    argument types read the parameter schemas there).
    """

    #: the parser reads special tokens (its markers are special tokens of its
    #: models' tokenizers): the server detokenizes with them when tools are given
    keep_special_tokens: bool

    def __init__(self, tokenizer: Any) -> None: ...

    def parse(self, text: str, *, final: bool, tools: Sequence[Mapping[str, Any]] = ()) -> ToolCallParse: ...


class ReasoningParser(Protocol):
    """Separates the reasoning from the answer (``--reasoning-parser NAME``).

    Same streaming contract as :class:`ToolParser`: ``parse`` on a prefix
    (``final=False``) reports only what later text cannot change (a possible
    start of the end marker is held back) and later results extend earlier ones.

    ``in_reasoning`` is what the prompt says (see ``prompt_state``): ``True``
    when the chat template opened the reasoning (DeepSeek-R1 and Qwen3
    thinking templates end the prompt with ``<think>``), so the completion
    starts inside it even without a start marker of its own.

    ``end_token_ids`` are the tokens of the marker that ends the reasoning;
    structured-output constraints apply to the answer generated after them.
    ``start_token_ids`` (optional) are those of the marker that opens it: with
    both, a request's ``thinking_token_budget`` counts the reasoning and the
    engine writes ``end_token_ids`` when it is spent.
    """

    end_token_ids: Sequence[int]
    #: the markers are special tokens (Magistral's ``[THINK]``): the server keeps them in the text
    keep_special_tokens: bool

    def __init__(self, tokenizer: Any) -> None: ...

    def parse(self, text: str, *, final: bool, in_reasoning: bool | None = None) -> ReasoningParse: ...

    def prompt_state(self, prompt_token_ids: Sequence[int]) -> bool | None:
        """``True``: the prompt opened reasoning it did not close; ``False``: the prompt closed it
        (thinking turned off in the template: the completion is all answer); ``None``: neither."""
        ...


class StatLogger(Protocol):
    """Receives figures from the engine; called directly, never through pluggy."""

    def record_step(self, stats: SchedulerStats) -> None:
        """After every engine step, and once with no tokens after requests are aborted between steps
        (an idle engine runs no step). Not for `llmp serve`'s warm-up request."""
        ...

    def record_finished(self, stats: FinishedRequestStats) -> None:
        """Once for every request that ends: finished (``stop``, ``length``) or aborted (``abort``)."""
        ...
