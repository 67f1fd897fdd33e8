"""Resolving the model an engine serves, once, into a :class:`~llmp.api.ResolvedModel`.

``LLM``, ``AsyncLLM`` (in the caller's process) and ``llmp serve`` call
:func:`resolve_model`; the engine, its executor, workers and model runners
take the record as is, so lookup, GGUF conversion and model selection happen
once per engine, not once per process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmp import registry
from llmp.api import ModelSpec, ModelTask, PoolingConfig, ResolvedModel
from llmp.model_files.config import (
    PlainConfig,
    architectures,
    has_sentence_transformers_config,
    load_plain_config,
    sentence_transformers_pooling,
    with_overrides,
)
from llmp.model_files.lookup import find_model_dir
from llmp.options import DEFAULT_MODEL, QUANTIZATION_ALIASES

if TYPE_CHECKING:
    from llmp.options import EngineConfig

DTYPES = ("bfloat16", "float16", "float32")
POOLING_TASKS: tuple[ModelTask, ...] = ("embed", "classify", "reward")
# The primary task an architecture's name implies (vLLM's _SUFFIX_TO_DEFAULTS): the first suffix it ends with.
SUFFIX_TASKS: tuple[tuple[str, ModelTask], ...] = (
    ("ForCausalLM", "generate"),
    ("ForConditionalGeneration", "generate"),
    ("ChatModel", "generate"),
    ("LMHeadModel", "generate"),
    ("ForSequenceClassification", "classify"),
    ("ClassificationModel", "classify"),
    ("ForRewardModeling", "reward"),
    ("RewardModel", "reward"),
    ("EmbeddingModel", "embed"),
    ("ForTextEncoding", "embed"),
    ("Model", "embed"),
)
# How a causal LM's vocabulary logits become a classifier (vLLM's seq_cls_model_loader methods)
CLASSIFIER_METHODS = ("from_2_way_softmax", "no_post_processing")
WHAT_IT_DOES = {"embed": "produces embeddings", "classify": "is a classifier", "reward": "is a reward model"}


def resolve_model(config: EngineConfig) -> ResolvedModel:
    """Find the model of ``config`` (converting a GGUF file), read its config (with ``hf_overrides``
    applied) and select the model implementation serving it and the tasks it serves.

    Raises ``ModelLoadError`` (no such model), ``UnknownComponentError`` (no plugin serves
    its architecture) or ``ValueError`` (a task, conversion or ``model_impl`` the model cannot take).
    """
    model_dir = find_model_dir(config.model, config.revision, config.gguf_file)
    tokenizer = str(config.tokenizer or model_dir)
    overrides = dict(config.hf_overrides or {})
    hf_config = with_classifier_tokens(with_overrides(load_plain_config(model_dir), overrides), tokenizer)
    check_quantization(hf_config, model_dir, config.quantization)
    names = architectures(hf_config)
    spec = registry.select_model(names, config.model_impl)
    task = resolve_task(config, spec, names, hf_config, has_sentence_transformers_config(model_dir))
    pooling = resolve_pooling(model_dir, spec, task)
    supported, score_mode = supported_tasks(task, spec, names, hf_config)
    if config.task == "score" and "score" not in supported:
        raise ValueError(
            f"{served_name(spec, names)} cannot score: it has {_num_labels(hf_config)} labels, and scoring "
            "takes a classifier of one (task='classify' serves it)"
        )
    context, source = context_limit(hf_config, model_dir)
    check_context(config, context, source)
    return ResolvedModel(
        name=str(config.model or DEFAULT_MODEL),
        model_dir=model_dir,
        tokenizer=tokenizer,
        config=hf_config,
        architectures=tuple(names),
        spec=spec,
        task=task,
        dtype=resolve_dtype(config.dtype, hf_config, model_dir),
        context_len=context,
        supported_tasks=supported,
        pooling=pooling,
        score_mode=score_mode,
        hf_overrides=overrides,
    )


def context_len(hf_config: Any, model_dir: Path | None = None) -> int:
    """The longest sequence the model takes (:func:`context_limit`)."""
    return context_limit(hf_config, model_dir)[0]


def context_limit(hf_config: Any, model_dir: Path | None = None) -> tuple[int, str]:
    """The longest sequence the model takes, and what sets it: its ``max_position_embeddings`` (4096
    when it names none), less the positions RoBERTa-style encoders reserve below ``pad_token_id + 1``;
    for a sentence-transformers directory at most its ``max_seq_length`` (sentence_bert_config.json),
    as sentence-transformers truncates and vLLM derives max_model_len."""
    positions = getattr(hf_config, "max_position_embeddings", None) or 4096
    if getattr(hf_config, "model_type", None) in OFFSET_POSITION_MODELS:
        positions -= getattr(hf_config, "pad_token_id", None) or 0
        positions -= 1
    seq_len = _max_seq_length(model_dir) if model_dir is not None else None
    if seq_len is not None and seq_len < positions:
        return seq_len, f"max_seq_length = {seq_len} in sentence_bert_config.json"
    return positions, f"max_position_embeddings = {positions}"


def _max_seq_length(model_dir: Path) -> int | None:
    try:
        value = json.loads((model_dir / "sentence_bert_config.json").read_text()).get("max_seq_length")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


# encoders whose position ids start at pad_token_id + 1 (transformers' create_position_ids_from_input_ids)
OFFSET_POSITION_MODELS = ("roberta", "xlm-roberta", "camembert")


def model_context_len(model: str | None) -> int:
    """:func:`context_len` of a model as it is named (``None``: the default model), from its config.json;
    a Hub model only when it is in the cache (this check downloads nothing)."""
    model_dir = find_model_dir(model, download=False)
    return context_len(load_plain_config(model_dir), model_dir)


def context_problem(max_model_len: int | None, context: int, source: str | None = None) -> str | None:
    """What is wrong with ``max_model_len`` for a model of ``context`` tokens (``source``: what sets
    it, :func:`context_limit`), or ``None``: the one rule, checked by resolution (naming the field)
    and by the commands (naming the flag)."""
    if max_model_len is not None and max_model_len > context:
        return f"{max_model_len} exceeds the model's context ({source or f'max_position_embeddings = {context}'})"
    return None


def check_context(config: EngineConfig, context: int, source: str | None = None) -> None:
    """``ValueError`` naming ``max_model_len`` when ``config`` asks for more than the model's context."""
    problem = context_problem(config.max_model_len, context, source)
    if problem:
        raise ValueError(f"max_model_len {problem}")


def check_resolved(model: ResolvedModel, config: EngineConfig) -> None:
    """``ValueError`` naming the first option of ``config`` that ``model`` was not resolved with
    (a record resolved under other options must not be served under these), or a ``max_model_len``
    beyond its context."""
    check_context(config, model.context_len)
    for name, value in _resolved_options(model).items():
        wanted = getattr(config, name)
        if wanted in ("auto", None) or wanted == value:
            continue
        if name == "task" and wanted == "score" and "score" in model.supported_tasks:
            continue
        if name == "convert" and wanted == model.task:  # converting a model to what it does natively is no change
            continue
        raise ValueError(
            f"the resolved model has {name} {value!r} but the options ask for {wanted!r}: "
            "resolve the model with the same options (resolve_model(config))"
        )


def _resolved_options(model: ResolvedModel) -> dict[str, Any]:
    """The options ``model`` was resolved under, as ``EngineConfig`` spells them."""
    native = getattr(model.spec, "tasks", ("generate",))
    converted = model.task != "generate" and model.task not in native and "generate" in native
    return {
        "dtype": model.dtype,
        "task": model.task,
        "runner": "generate" if model.task == "generate" else "pooling",
        "convert": model.task if converted else "none",
        "model_impl": getattr(model.spec, "model_impl", "native"),
        "tokenizer": model.tokenizer,
        "hf_overrides": model.hf_overrides,
    }


def conflicting_options(task: str, runner: str, convert: str) -> tuple[str, str] | None:
    """The two of ``task``, ``runner`` and ``convert`` (``EngineConfig`` values) that ask for different
    things (``runner="generate"`` with ``convert="classify"``), or ``None``: the one rule, checked by
    resolution (naming the fields) and by the commands (naming the flags)."""
    pooling_task = task in ("embed", "classify", "score", "reward")
    converting = convert in POOLING_TASKS
    if runner == "generate" and pooling_task:
        return ("runner", "task")
    if runner == "generate" and converting:
        return ("runner", "convert")
    if runner == "pooling" and task == "generate":
        return ("runner", "task")
    if converting and task == "generate":
        return ("task", "convert")
    if converting and pooling_task and task != convert and not (task == "score" and convert != "reward"):
        return ("task", "convert")
    return None


def resolve_task(
    config: EngineConfig, spec: ModelSpec, names: list[str], hf_config: Any, sentence_transformers: bool
) -> ModelTask:
    """The primary task: the one ``task``, ``convert`` or ``runner`` asks for, else the one the
    architecture's name implies (``*ForSequenceClassification`` classifies, ``*Model`` embeds ...; a
    sentence-transformers directory embeds). ``ValueError`` in one line when the model cannot do it.

    A pooling task a causal LM does not do natively converts it (``llmp.modeling.decoder.as_pooling_model``),
    unless ``convert`` is ``"none"``."""
    conflict = conflicting_options(config.task, config.runner, config.convert)
    if conflict:
        first, second = conflict
        raise ValueError(
            f"{first} {getattr(config, first)!r} contradicts {second} {getattr(config, second)!r}: "
            "they ask for different tasks"
        )
    native: tuple[str, ...] = tuple(getattr(spec, "tasks", ("generate",)))
    name = served_name(spec, names)
    classifier_tokens = getattr(hf_config, "classifier_token_ids", None) is not None
    implied = "embed" if sentence_transformers else architecture_task(name)
    if config.convert in POOLING_TASKS:
        wanted, asked = config.convert, f"convert={config.convert!r}"
    elif config.task == "score":
        classifier = implied == "classify" or "classify" in native or classifier_tokens
        wanted, asked = ("classify" if classifier else "embed"), "task='score'"
    elif config.task != "auto":
        wanted, asked = config.task, f"task={config.task!r}"
    elif config.runner == "generate":
        wanted, asked = "generate", "runner='generate'"
    elif config.runner == "pooling":
        wanted, asked = _pooling_default(native, implied, classifier_tokens), "runner='pooling'"
    else:  # the task the name implies where the record does it natively; a sentence-transformers causal LM embeds
        wanted = "embed" if sentence_transformers else implied if implied in native else native[0]
        asked = f"task={config.task!r}"
    if wanted == "generate":
        if "generate" not in native:
            does = WHAT_IT_DOES.get(native[0], f"does {native[0]}")
            raise ValueError(f"the {name} model {does}; it cannot generate text ({asked})")
        return "generate"
    if wanted in native or (wanted in ("classify", "reward") and {"classify", "reward"} & set(native)):
        return wanted  # type: ignore[return-value]
    if "generate" in native:  # a causal LM: converted by as_pooling_model, which refuses what it cannot
        if config.convert == "none":
            raise ValueError(f"{name} does not {wanted} natively, and convert='none' refuses to convert it ({asked})")
        return wanted  # type: ignore[return-value]
    if wanted == "embed":
        raise ValueError(f"{name} cannot embed: it {WHAT_IT_DOES[native[0]]} (use an embedding checkpoint)")
    verb = "serve as a reward model" if wanted == "reward" else wanted
    raise ValueError(
        f"{name} cannot {verb}: it has no classification head (use a *ForSequenceClassification checkpoint)"
    )


def _pooling_default(native: tuple[str, ...], implied: ModelTask | None, classifier_tokens: bool) -> ModelTask:
    """The pooling task of ``runner="pooling"`` without a task: the model's own, the one its name
    implies, a classifier when its config names classifier tokens, else embed (as vLLM converts)."""
    own = [t for t in native if t in POOLING_TASKS]
    if own:
        return own[0]  # type: ignore[return-value]
    if implied in POOLING_TASKS:
        return implied  # type: ignore[return-value]
    return "classify" if classifier_tokens else "embed"


def architecture_task(architecture: str | None) -> ModelTask | None:
    """The primary task the architecture's name implies (``SUFFIX_TASKS``), or ``None``."""
    for suffix, task in SUFFIX_TASKS:
        if architecture and architecture.endswith(suffix):
            return task
    return None


def served_name(spec: ModelSpec, names: list[str]) -> str:
    """The architecture ``spec`` serves, as messages name it (a pattern record serves the config's)."""
    return spec.name if spec.name in names or not names else names[0]


def supported_tasks(
    task: ModelTask, spec: ModelSpec, names: list[str], hf_config: Any
) -> tuple[tuple[str, ...], str | None]:
    """Every task the engine takes with primary ``task``, and how it scores (``ResolvedModel.score_mode``).

    A classifier scores (as a cross-encoder) when it has one label; an embedding model scores as a
    bi-encoder (the cosine of two embeddings). A causal LM whose config names classifier tokens
    (``classifier_from_token``) also classifies, and scores, with its live LM head."""
    if task == "embed":
        return ("embed", "token_embed", "score"), "bi-encoder"
    if task == "reward":
        return ("token_classify", "classify"), None
    if task == "generate":
        if getattr(hf_config, "classifier_token_ids", None) is None:
            return ("generate",), None
        if not hasattr(spec.load(), "classify"):
            raise ValueError(
                f"{served_name(spec, names)} cannot classify with classifier_from_token: its implementation "
                f"({spec.distribution}) has no classify hook"
            )
    if task == "generate":
        tasks: tuple[str, ...] = ("generate", "classify")
    elif getattr(spec.load(), "per_token_outputs", True):
        tasks = ("classify", "token_classify")
    else:  # a model whose outputs are the sequence's (the transformers fallback): no per-token tasks
        tasks = ("classify",)
    return (tasks + ("score",), "cross-encoder") if _num_labels(hf_config) == 1 else (tasks, None)


def _num_labels(hf_config: Any) -> int:
    from llmp.modeling.pooling import num_labels

    return num_labels(hf_config)


def with_classifier_tokens(hf_config: PlainConfig, tokenizer: str) -> PlainConfig:
    """``hf_config`` with ``classifier_token_ids`` (and ``num_labels``, ``id2label``) set when it
    names ``classifier_from_token``: a causal LM's logits of those tokens become a classifier
    (vLLM's LLM-as-reranker recipe; models need no tokenizer). ``method`` ``from_2_way_softmax``
    gives one label, the logit of the second token ("yes") minus that of the first ("no"); Qwen3's
    ``is_original_qwen3_reranker: true`` sets it. ``no_post_processing`` (and no method) gives one
    label per token. ``ValueError`` in one line for a token the tokenizer does not have."""
    tokens = getattr(hf_config, "classifier_from_token", None)
    method = getattr(hf_config, "method", None)
    if getattr(hf_config, "is_original_qwen3_reranker", False):
        if not isinstance(tokens, list | tuple) or len(tokens) != 2:
            raise ValueError(
                "is_original_qwen3_reranker needs classifier_from_token naming two tokens "
                '(hf_overrides {"classifier_from_token": ["no", "yes"], ...})'
            )
        method = "from_2_way_softmax"
    if tokens is None:
        return hf_config
    if not isinstance(tokens, list | tuple) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"classifier_from_token must be a list of tokens, got {tokens!r}")
    if method is not None and method not in CLASSIFIER_METHODS:
        raise ValueError(
            f"method must be {' or '.join(CLASSIFIER_METHODS)} (with classifier_from_token), got {method!r}"
        )
    if method == "from_2_way_softmax" and len(tokens) != 2:
        raise ValueError(f"method from_2_way_softmax takes two classifier_from_token (no, yes), got {tokens!r}")
    labels = 1 if method == "from_2_way_softmax" else len(tokens)
    id2label = getattr(hf_config, "id2label", None) or {}
    if len(id2label) != labels:
        id2label = {str(i): f"LABEL_{i}" for i in range(labels)}
    derived = {
        **({"method": method} if method else {}),
        "classifier_token_ids": token_ids(tokenizer, tokens),
        "num_labels": labels,
        "id2label": id2label,
        "label2id": {label: int(i) for i, label in id2label.items()},
    }
    return with_overrides(hf_config, derived)


def token_ids(tokenizer: str, tokens: list[str] | tuple[str, ...]) -> list[int]:
    """The ids of ``tokens`` in the tokenizer at ``tokenizer``; ``ValueError`` naming one it lacks."""
    from llmp.model_files.tokenizer import load_tokenizer

    loaded = load_tokenizer(tokenizer)
    ids = []
    for token in tokens:
        found = loaded.convert_tokens_to_ids(token)
        if found is None or (found == loaded.unk_token_id and token != loaded.unk_token):
            raise ValueError(f"classifier_from_token {token!r} is not a token of the tokenizer ({tokenizer})")
        ids.append(int(found))
    return ids


def resolve_pooling(model_dir: Path, spec: ModelSpec, task: ModelTask) -> PoolingConfig | None:
    """The pooler of the primary pooling task (``None`` for ``generate``): for ``embed`` the
    sentence-transformers configuration of the directory, else the class's ``default_pooling``
    and ``default_normalize``; for ``classify`` the class's ``default_pooling`` (CLS for BERT-likes,
    the last token for decoders); for ``reward`` every token.

    Loads the model class (and so torch), converting a causal LM (``as_pooling_model``, which
    raises ``ValueError`` when it cannot)."""
    if task == "generate":
        return None
    from llmp.modeling.decoder import as_pooling_model
    from llmp.modeling.pooling import default_pooler

    model_cls = as_pooling_model(spec.load(), task)
    if task == "reward":
        return PoolingConfig("all", False)
    default = default_pooler(model_cls, task)
    if task == "classify":
        return PoolingConfig(default, False)
    return sentence_transformers_pooling(
        model_dir, PoolingConfig(default, getattr(model_cls, "default_normalize", False))
    )


def check_quantization(hf_config: Any, model_dir: Path, requested: str | None = None) -> None:
    """Check the checkpoint's ``quantization_config`` (AWQ, GPTQ, compressed-tensors int8: what
    :mod:`llmp.model_files.hf_quantized` loads; ``ModelLoadError`` in one line for anything else) and that
    ``requested`` (``EngineConfig.quantization``) names the method the model has (``ValueError`` in one
    line, as vLLM's ``verify_quantization`` words it; ``gguf`` for a GGUF file)."""
    from llmp.model_files.gguf import gguf_source
    from llmp.model_files.hf_quantized import parse_quantization_config

    quantization = getattr(hf_config, "quantization_config", None)
    if quantization:
        detected: str | None = parse_quantization_config(quantization).method
    else:
        detected = "gguf" if gguf_source(model_dir) is not None else None
    if requested is None or QUANTIZATION_ALIASES.get(requested, requested) == detected:
        return
    if detected is None:
        raise ValueError(
            f"quantization {requested!r} was asked for, but {model_dir} holds unquantised weights (no "
            "quantization_config in config.json, not a GGUF file): drop the `quantization` argument"
        )
    raise ValueError(
        f"Quantization method specified in the model config ({detected}) does not match the quantization method "
        f"specified in the `quantization` argument ({requested})."
    )


def resolve_kv_cache_dtype(requested: str, dtype: str) -> str:
    """The KV cache's dtype: the one requested (``EngineConfig.kv_cache_dtype``), else the weights' (``dtype``)."""
    return dtype if requested == "auto" else requested


def resolve_dtype(requested: str, hf_config: Any, model_dir: Path | None = None) -> str:
    """The dtype of the weights: the one requested, else the config's (bfloat16 when it names none). A
    quantised checkpoint (``quantization_config``) computes in float32, as a GGUF file does, while its
    weights dequantised take at most ``FLOAT32_COMPUTE_BYTES`` in float32: answers then match the float32
    reference of the checkpoint (its config's float16 rounds activations, and flips near-ties)."""
    if requested != "auto":
        return requested
    quantization = getattr(hf_config, "quantization_config", None)
    if quantization and model_dir is not None:
        from llmp.model_files.gguf import FLOAT32_COMPUTE_BYTES
        from llmp.model_files.hf_quantized import dequantized_parameter_count, parse_quantization_config

        weights = dequantized_parameter_count(model_dir, parse_quantization_config(quantization))
        if 0 < 4 * weights <= FLOAT32_COMPUTE_BYTES:
            return "float32"
    configured = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    configured = str(configured).removeprefix("torch.") if configured is not None else None
    return configured if configured in DTYPES else "bfloat16"
