"""Any Hugging Face causal LM on llmp's paged KV cache, through transformers' attention interface,
and any sequence classifier (cross-encoder, reward model) run by transformers as it is.

Transformers runs the model; llmp supplies the attention. The model is loaded with
``attn_implementation="llmp"``, so each attention layer hands its q, k, v (after rotary)
to :func:`paged_attention_forward`, which writes k, v into that layer's cache blocks and
attends over the cache. A step's flattened tokens go to transformers as one sequence of a
batch of one, with no mask and no transformers cache: which token sees which is decided by
the attention metadata alone (``llmp`` is not a mask-building implementation, so
transformers skips making a mask).

A classifier needs no KV cache (each request is computed whole, in one step), so
:class:`TransformersForSequenceClassification` runs transformers' own model and attention on
each request alone, unpadded, and hands back its logits.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn
from transformers import AttentionInterface, AutoModelForCausalLM, AutoModelForSequenceClassification, PreTrainedModel

from llmp.api import AttentionMetadata, KernelSet, ModelLoadError, UnknownComponentError
from llmp.modeling.parallel import tp_size

ATTN_IMPLEMENTATION = "llmp"
# Layer kinds whose only state is a KV cache. Others (mamba, conv, linear or chunked attention)
# carry state this fallback doesn't page, so models with them are refused.
_ATTENTION_LAYER_TYPES = {"full_attention", "sliding_attention", "attention"}
# Attention extras paged attention can't apply (relative position bias, attention sinks).
_UNSUPPORTED_KWARGS = ("position_bias", "s_aux")


class UnsupportedArchitectureError(UnknownComponentError, ModelLoadError):
    """Neither a native plugin nor transformers implements the architecture."""

    def __init__(self, architectures: list[str], native: Mapping[str, str]) -> None:
        super().__init__("model", ", ".join(architectures), native)
        self.args = (
            f"{self.args[0]}; transformers {transformers.__version__} has no such class either "
            "(the transformers fallback runs no remote code)",
        )


@dataclass
class CacheLayer:
    """One attention layer's paged KV cache; the model runner sets ``kv_cache``."""

    num_kv_heads: int
    head_dim: int
    kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass
class _Step:
    layers: list[CacheLayer]
    kernels: KernelSet
    metadata: AttentionMetadata


# The step in flight. A context variable rather than a model kwarg: it reaches the attention
# function whether or not a model's layers pass ``**kwargs`` down.
_current_step: ContextVar[_Step] = ContextVar("llmp_transformers_step")


def paged_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: q [1, H, T, D], k, v [1, Hkv, T, D] -> ([1, T, H, D], None)."""
    try:
        step = _current_step.get()
    except LookupError:
        raise RuntimeError("the llmp attention runs only inside TransformersForCausalLM.forward") from None
    if extras := [name for name in _UNSUPPORTED_KWARGS if kwargs.get(name) is not None]:
        raise NotImplementedError(f"{type(module).__name__} passes {', '.join(extras)}, which paged attention lacks")
    index = getattr(module, "layer_idx", None)
    if index is None:
        raise RuntimeError(f"{type(module).__name__} has no layer_idx to find its KV cache by")
    layer = step.layers[index]
    if layer.kv_cache is None:
        raise RuntimeError("no KV cache is bound: the model runner binds one before the first step")
    k_cache, v_cache = layer.kv_cache
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [T, heads, D]
    if k.shape[1:] != k_cache.shape[2:] or v.shape[1:] != v_cache.shape[2:]:
        raise RuntimeError(
            f"layer {index} has k/v heads of shape {tuple(k.shape[1:])}; "
            f"its cache, sized from the config, holds {tuple(k_cache.shape[2:])}"
        )
    metadata = step.metadata
    if sliding_window != metadata.sliding_window:  # per layer: models mix sliding and full layers
        metadata = dataclasses.replace(metadata, sliding_window=sliding_window)
    step.kernels.write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    out = step.kernels.paged_attention(q, k_cache, v_cache, metadata, scale, softcap=softcap)
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)


class TransformersForCausalLM(nn.Module):
    """A transformers ``*ForCausalLM`` behind llmp's model contract."""

    def __init__(self, hf_model: PreTrainedModel, kernels: KernelSet) -> None:
        super().__init__()
        if hf_model.base_model is hf_model or hf_model.get_output_embeddings() is None:
            raise ModelLoadError(f"{type(hf_model).__name__} is not a causal LM with a base model and an LM head")
        self.hf_model = hf_model
        self.kernels = kernels
        config = hf_model.config.get_text_config()
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.layers = [CacheLayer(kv_heads, head_dim) for _ in range(config.num_hidden_layers)]
        # what *ForCausalLM.forward does to the LM head's output (Cohere, Granite, Gemma 2)
        self.logit_scale: float | None = getattr(hf_model, "logit_scale", None)
        self.logits_scaling: float | None = getattr(config, "logits_scaling", None)
        self.final_logit_softcapping: float | None = getattr(config, "final_logit_softcapping", None)

    @classmethod
    def load_pretrained(
        cls, model_dir: Path, config: Any, kernels: KernelSet, dtype: torch.dtype, device: torch.device
    ) -> TransformersForCausalLM:
        if tp_size() > 1:
            raise ValueError(
                "the transformers fallback runs on one rank only; "
                "use tensor_parallel_size=1 or a model with a native plugin"
            )
        model_cls = _model_class(config, AutoModelForCausalLM, "causal LM")
        if not getattr(model_cls, "_supports_attention_backend", False):
            raise ModelLoadError(
                f"{model_cls.__name__} cannot run on llmp's KV cache: transformers does not let it "
                "use a custom attention function (_supports_attention_backend is False)"
            )
        text_config = config.get_text_config()
        kinds = {*(getattr(text_config, "layer_types", None) or ()), *(getattr(text_config, "block_types", None) or ())}
        if stateful := sorted(kinds - _ATTENTION_LAYER_TYPES):
            raise ModelLoadError(
                f"{model_cls.__name__} has {', '.join(stateful)} layers, whose state the "
                "transformers fallback does not keep; only attention layers are supported"
            )
        hf_model = model_cls.from_pretrained(model_dir, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
        return cls(hf_model.to(device), kernels)

    def attention_layers(self) -> list[CacheLayer]:
        return self.layers

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        # input_ids, positions: [T] -> hidden [T, N]. The whole step is one sequence to transformers.
        token = _current_step.set(_Step(self.layers, self.kernels, attn_metadata))
        try:
            out = self.hf_model.base_model(input_ids=input_ids[None], position_ids=positions[None], use_cache=False)
        finally:
            _current_step.reset(token)
        return out[0][0]  # last hidden state, whether the model returns an output object or a tuple

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.hf_model.get_output_embeddings()(hidden_states)
        if self.logit_scale is not None:
            logits = logits * self.logit_scale
        if self.logits_scaling:
            logits = logits / self.logits_scaling
        if self.final_logit_softcapping:
            logits = torch.tanh(logits / self.final_logit_softcapping) * self.final_logit_softcapping
        return logits


class TransformersForSequenceClassification(nn.Module):
    """A transformers ``*ForSequenceClassification`` (ModernBERT, DeBERTa, a reward model ...)
    behind llmp's pooling-model contract.

    Each request of a step runs alone through transformers' model (its own attention, no
    padding, its ``token_type_ids`` when the model takes them), which pools and applies its head
    as transformers does. Every row of a request's output holds that request's logits, so the
    runner's pooler picks them whichever row it takes, and :meth:`classify` returns them as they
    are. Transformers' sequence classifiers score the sequence, not each token, so the model does
    not offer the token tasks (``per_token_outputs = False``): no per-token rewards made up.
    """

    is_pooling_model = True
    default_pooling = "cls"  # every row of a request holds its logits: the first will do
    accepts_token_type_ids = True
    per_token_outputs = False

    def __init__(self, hf_model: PreTrainedModel) -> None:
        super().__init__()
        self.hf_model = hf_model
        self.takes_token_type_ids = "token_type_ids" in inspect.signature(hf_model.forward).parameters

    @classmethod
    def load_pretrained(
        cls, model_dir: Path, config: Any, kernels: KernelSet, dtype: torch.dtype, device: torch.device
    ) -> TransformersForSequenceClassification:
        if tp_size() > 1:
            raise ValueError(
                "the transformers fallback runs on one rank only; "
                "use tensor_parallel_size=1 or a model with a native plugin"
            )
        model_cls = _model_class(config, AutoModelForSequenceClassification, "sequence classifier")
        hf_model = model_cls.from_pretrained(model_dir, config=config, dtype=dtype)
        return cls(hf_model.to(device))

    def attention_layers(self) -> list[CacheLayer]:
        return []  # no KV cache: transformers attends within each request

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # input_ids: [T] of whole requests -> [T, num_labels], each request's rows its logits
        starts = attn_metadata.query_start_loc.tolist()
        rows = []
        for start, end in zip(starts, starts[1:]):
            kwargs = {}
            if token_type_ids is not None and self.takes_token_type_ids:
                kwargs["token_type_ids"] = token_type_ids[start:end][None]
            logits = self.hf_model(input_ids=input_ids[start:end][None], **kwargs).logits  # [1, num_labels]
            rows.append(logits.expand(end - start, -1))
        return torch.cat(rows)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled.float()  # transformers applied the head already


def _model_class(config: Any, auto_class: Any, kind: str) -> type[PreTrainedModel]:
    """The transformers class of the config's first known architecture (or its model type's ``kind``)."""
    names = list(getattr(config, "architectures", None) or [])
    for name in names:
        model_cls = getattr(transformers, name, None)
        if isinstance(model_cls, type) and issubclass(model_cls, PreTrainedModel):
            return model_cls
    if names:  # named, but not by transformers: a remote-code model, or one newer than this transformers
        from llmp import registry

        native = {
            s.name: s.distribution
            for s in registry.components("model").values()
            if getattr(s, "model_impl", "native") == "native"
        }
        raise UnsupportedArchitectureError(names, native)
    from transformers.models.auto.auto_factory import _get_model_class

    try:
        return _get_model_class(config, auto_class._model_mapping)
    except KeyError:
        raise ModelLoadError(f"transformers has no {kind} for model type {config.model_type!r}") from None
