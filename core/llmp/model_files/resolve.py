"""Resolving the model an engine serves, once, into a :class:`~llmp.api.ResolvedModel`.

``LLM``, ``AsyncLLM`` (in the caller's process) and ``llmp serve`` call
:func:`resolve_model`; the engine, its executor, workers and model runners
take the record as is, so lookup, GGUF conversion and model selection happen
once per engine, not once per process.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmp import registry
from llmp.api import ModelSpec, ModelTask, PoolingConfig, ResolvedModel
from llmp.model_files.config import (
    architectures,
    has_sentence_transformers_config,
    load_plain_config,
    sentence_transformers_pooling,
)
from llmp.model_files.lookup import find_model_dir
from llmp.options import DEFAULT_MODEL

if TYPE_CHECKING:
    from llmp.options import EngineConfig

DTYPES = ("bfloat16", "float16", "float32")


def resolve_model(config: EngineConfig) -> ResolvedModel:
    """Find the model of ``config`` (converting a GGUF file), read its config and select
    the model implementation serving it.

    Raises ``ModelLoadError`` (no such model), ``UnknownComponentError`` (no plugin serves
    its architecture) or ``ValueError`` (a task or ``model_impl`` the model cannot take).
    """
    model_dir = find_model_dir(config.model)
    hf_config = load_plain_config(model_dir)
    names = architectures(hf_config)
    spec = registry.select_model(names, config.model_impl)
    task = resolve_task(config.task, spec, has_sentence_transformers_config(model_dir))
    check_context(config, context_len(hf_config))
    return ResolvedModel(
        name=str(config.model or DEFAULT_MODEL),
        model_dir=model_dir,
        tokenizer=str(config.tokenizer or model_dir),
        config=hf_config,
        architectures=tuple(names),
        spec=spec,
        task=task,
        dtype=resolve_dtype(config.dtype, hf_config),
        context_len=context_len(hf_config),
        pooling=resolve_pooling(model_dir, spec) if task == "embed" else None,
    )


def context_len(hf_config: Any) -> int:
    """The longest sequence the model takes: its ``max_position_embeddings`` (4096 when it names none)."""
    return getattr(hf_config, "max_position_embeddings", None) or 4096


def model_context_len(model: str | None) -> int:
    """:func:`context_len` of a model as it is named (``None``: the default model), from its config.json."""
    return context_len(load_plain_config(find_model_dir(model)))


def context_problem(max_model_len: int | None, context: int) -> str | None:
    """What is wrong with ``max_model_len`` for a model of ``context`` tokens, or ``None``: the one
    rule, checked by resolution (naming the field) and by the commands (naming the flag)."""
    if max_model_len is not None and max_model_len > context:
        return f"{max_model_len} exceeds the model's context (max_position_embeddings = {context})"
    return None


def check_context(config: EngineConfig, context: int) -> None:
    """``ValueError`` naming ``max_model_len`` when ``config`` asks for more than the model's context."""
    problem = context_problem(config.max_model_len, context)
    if problem:
        raise ValueError(f"max_model_len {problem}")


def check_resolved(model: ResolvedModel, config: EngineConfig) -> None:
    """``ValueError`` naming the first option of ``config`` that ``model`` was not resolved with
    (a record resolved under other options must not be served under these), or a ``max_model_len``
    beyond its context."""
    check_context(config, model.context_len)
    resolved = {
        "dtype": model.dtype,
        "task": model.task,
        "model_impl": getattr(model.spec, "model_impl", "native"),
        "tokenizer": model.tokenizer,
    }
    for name, value in resolved.items():
        wanted = getattr(config, name)
        if wanted not in ("auto", None) and wanted != value:
            raise ValueError(
                f"the resolved model has {name} {value!r} but the options ask for {wanted!r}: "
                "resolve the model with the same options (resolve_model(config))"
            )


def resolve_task(requested: str, spec: ModelSpec, sentence_transformers: bool) -> ModelTask:
    """``generate`` or ``embed``: what the engine does with the model.

    ``auto`` embeds with models that only embed and with causal LMs shipped as
    sentence-transformers models (Qwen3-Embedding); otherwise it generates.
    """
    tasks = getattr(spec, "tasks", ("generate",))
    if requested == "auto":
        return "embed" if "generate" not in tasks or sentence_transformers else "generate"
    if requested == "generate" and "generate" not in tasks:
        raise ValueError(f"the {spec.name} model produces embeddings; it cannot generate text (task='generate')")
    return requested  # type: ignore[return-value]  # EngineConfig checked it is generate or embed


def resolve_pooling(model_dir: Path, spec: ModelSpec) -> PoolingConfig:
    """How the embedding model pools: its sentence-transformers configuration, else its class's defaults.

    Loads the model class (and so torch): only for the ``embed`` task. ``ValueError`` if the
    class cannot produce embeddings."""
    from llmp.modeling.pooling import as_pooling_model

    model_cls = as_pooling_model(spec.load(), "embed")
    default = PoolingConfig(
        getattr(model_cls, "default_pooling", "last"), getattr(model_cls, "default_normalize", False)
    )
    return sentence_transformers_pooling(model_dir, default)


def resolve_dtype(requested: str, hf_config: Any) -> str:
    """The dtype of weights and KV cache: the one requested, else the config's (bfloat16 when it names none)."""
    if requested != "auto":
        return requested
    configured = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    configured = str(configured).removeprefix("torch.") if configured is not None else None
    return configured if configured in DTYPES else "bfloat16"
