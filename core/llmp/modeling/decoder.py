"""The pre-norm decoder shared by the Llama-family model plugins.

Llama, Mistral, Qwen2, Qwen3, Mixtral and Qwen3-MoE differ only in options of
the same blocks (QKV bias, q/k norm, sliding windows, a routed MLP); a model
plugin subclasses :class:`DecoderForCausalLM` and overrides ``make_attention``
or ``make_mlp``. Gemma's blocks reuse :class:`DecoderAttention` too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmp.api import AttentionMetadata, DecoderLayerParts, KernelSet, ModelLoadError, PacksDecoderLayer
from llmp.modeling.layers import (
    CausalLM,
    GatedMLP,
    MergedLinear,
    PagedAttention,
    ParallelLMHead,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
    column_slice,
    kv_head_slice,
    load_weights,
    row_invariant,
    token_classifier_method,
    token_classifier_weight,
)
from llmp.modeling.parallel import tp_size
from llmp.modeling.pooling import num_labels

__all__ = [
    "DecoderAttention",
    "DecoderForCausalLM",
    "DecoderLayer",
    "DecoderModel",
    "embedding_variant",
    "layer_windows",
    "pack_decoder_layers",
    "rope_settings",
    "sequence_classification_variant",
]


def rope_settings(config: Any) -> tuple[float, dict[str, Any] | None]:
    """``(theta, scaling)`` from a config of any transformers version (rope_parameters or rope_theta/rope_scaling)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    theta = params.pop("rope_theta", None) or getattr(config, "rope_theta", 10000.0)
    scaling = getattr(config, "rope_scaling", None) or (
        params if params.get("rope_type", "default") != "default" else None
    )
    return float(theta), scaling


def layer_windows(config: Any) -> list[int | None]:
    """Each layer's sliding window (``None`` = full attention).

    ``layer_types`` names each layer's kind where the config has it (Qwen2/3,
    Gemma 2); otherwise ``sliding_window`` applies to every layer (Mistral).
    """
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types:
        return [window if kind == "sliding_attention" else None for kind in types]
    if getattr(config, "use_sliding_window", True) is False:
        window = None
    return [window] * config.num_hidden_layers


class DecoderAttention(nn.Module):
    """Self-attention over the paged KV cache: fused QKV, rotary, optional q/k RMSNorm.

    Given ``rows``, it attends the queries of those rows alone (every row's keys and values are written).
    """

    selects_rows = True

    def __init__(
        self,
        config: Any,
        kernels: KernelSet,
        *,
        sliding_window: int | None = None,
        qkv_bias: bool = False,
        o_bias: bool = False,
        qk_norm: bool = False,
        scale: float | None = None,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // total_heads
        q = column_slice(total_heads * self.head_dim)
        kv = kv_head_slice(total_kv_heads, self.head_dim)
        self.num_heads = q[2] // self.head_dim  # this rank's heads
        self.num_kv_heads = kv[2] // self.head_dim
        self.qkv_proj = MergedLinear(config.hidden_size, {"q": q, "k": kv, "v": kv}, bias=qkv_bias)
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, config.hidden_size, bias=o_bias)
        if qk_norm:  # Qwen3: each head's q and k normalised before the rotation
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, kernels)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, kernels)
        self.qk_norm = qk_norm
        theta, scaling = rope_settings(config)
        rotary_dim = int(self.head_dim * getattr(config, "partial_rotary_factor", 1.0))
        self.rotary_emb = RotaryEmbedding(rotary_dim, config.max_position_embeddings, theta, scaling, kernels)
        self.attn = PagedAttention(
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            scale if scale is not None else self.head_dim**-0.5,
            kernels,
            sliding_window=sliding_window,
            softcap=softcap,
        )
        self.split = (q[2], kv[2], kv[2])

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        metadata: AttentionMetadata,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split(self.split, dim=-1)
        if self.qk_norm:
            q = self.q_norm(q.reshape(-1, self.head_dim))
            k = self.k_norm(k.reshape(-1, self.head_dim))
        q = q.reshape(tokens, self.num_heads, self.head_dim)
        k = k.reshape(tokens, self.num_kv_heads, self.head_dim)
        q, k = self.rotary_emb(positions, q, k)
        v = v.reshape(tokens, self.num_kv_heads, self.head_dim)
        if rows is None:
            return self.o_proj(self.attn(q, k, v, metadata))
        return self.o_proj(self.attn(q[rows], k, v, metadata, rows))


class DecoderLayer(nn.Module):
    """``x + attn(norm(x))`` then ``x + mlp(norm(x))``, the residual carried fused into the norms.

    A layer takes and returns ``(hidden, residual)``; the layer's output is their sum. Where the kernel set
    computes the whole layer in one call (:class:`llmp.api.PacksDecoderLayer`, set by :func:`pack_decoder_layers`
    as ``fused_decode``), a step of one new token per request runs that instead of the parts.
    """

    fused_decode: Callable[..., Any] | None = None

    def __init__(self, self_attn: nn.Module, mlp: nn.Module, input_norm: nn.Module, post_attention_norm: nn.Module):
        super().__init__()
        self.input_layernorm = input_norm
        self.self_attn = self_attn
        self.post_attention_layernorm = post_attention_norm
        self.mlp = mlp
        self.selects_rows = bool(getattr(self_attn, "selects_rows", False))

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        metadata: AttentionMetadata,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fused_decode is not None and rows is None and metadata.max_query_len == 1:
            attention = self.self_attn
            if attention.attn.kv_cache is not None:  # else the parts raise the missing cache's error
                table = attention.rotary_emb.table(hidden.device)
                fused = self.fused_decode(positions, hidden, residual, metadata, *attention.attn.kv_cache, table)
                if fused is not None:
                    return fused
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        if rows is None:
            hidden = self.self_attn(positions, hidden, metadata)
        else:  # the last layer of a step that reads only these rows: their queries, residuals and MLP alone
            hidden, residual = self.self_attn(positions, hidden, metadata, rows=rows), residual[rows]
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual

    def parts(self) -> DecoderLayerParts | None:
        """The layer as :class:`llmp.api.PacksDecoderLayer` takes it, or None where it is not the plain Llama
        shape with packed matmuls (another norm, q/k norms, partial rotary, another MLP or activation, biases on
        o or down, several tensor-parallel ranks, LoRA)."""
        attention, mlp = self.self_attn, self.mlp
        norms = (self.input_layernorm, self.post_attention_layernorm)
        if any(type(norm) is not RMSNorm for norm in norms) or norms[0].eps != norms[1].eps:
            return None
        if type(attention) is not DecoderAttention or type(mlp) is not GatedMLP or tp_size() != 1:
            return None
        if attention.qk_norm or attention.rotary_emb.rotary_dim != attention.head_dim:
            return None
        if mlp.gated is None or mlp.activation != "silu" or mlp.lora_context is not None:
            return None
        projections = (attention.qkv_proj, attention.o_proj, mlp.down_proj)
        if any(type(p) not in (MergedLinear, RowParallelLinear) or p.packed is None for p in projections):
            return None
        if attention.o_proj.bias is not None or mlp.down_proj.bias is not None:
            return None
        paged = attention.attn
        return DecoderLayerParts(
            input_norm=norms[0].weight.detach(),
            post_attention_norm=norms[1].weight.detach(),
            eps=norms[0].eps,
            qkv=attention.qkv_proj.packed,
            o=attention.o_proj.packed,
            gate_up_act=mlp.gated,
            down=mlp.down_proj.packed,
            num_heads=attention.num_heads,
            num_kv_heads=attention.num_kv_heads,
            head_dim=attention.head_dim,
            scale=paged.scale,
            softcap=paged.softcap,
            sliding_window=paged.sliding_window,
        )


def pack_decoder_layers(model: nn.Module, kernels: KernelSet) -> int:
    """Let a kernel set with ``pack_decoder_layer`` (:class:`llmp.api.PacksDecoderLayer`) compute each
    decoder layer of a decode step in one call, after :func:`llmp.modeling.layers.pack_linear_layers`.
    Returns the number of layers it took."""
    if not isinstance(kernels, PacksDecoderLayer):
        return 0
    taken = 0
    for layer in model.modules():
        if isinstance(layer, DecoderLayer):
            parts = layer.parts()
            layer.fused_decode = None if parts is None else kernels.pack_decoder_layer(parts)
            taken += layer.fused_decode is not None
    return taken


class DecoderModel(nn.Module):
    """Embedding (times ``embed_scale`` when set), the layers, and the final norm."""

    def __init__(
        self,
        config: Any,
        kernels: KernelSet,
        layers: Iterable[nn.Module],
        norm: nn.Module,
        embed_scale: float | None = None,
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.embed_scale = embed_scale

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states ``[T, N]``; with ``output_rows`` ([R], increasing), ``[R, N]`` of those rows, the
        last layer computing only their queries and MLP where it can (``selects_rows``)."""
        hidden = self.embed_tokens(input_ids)
        if self.embed_scale is not None:  # Gemma: the scale rounded to the activations' dtype, as trained
            hidden = hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype)
        residual = None
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            if index < last or output_rows is None:
                hidden, residual = layer(positions, hidden, residual, metadata)
            elif getattr(layer, "selects_rows", False):
                hidden, residual = layer(positions, hidden, residual, metadata, rows=output_rows)
            else:
                hidden, residual = layer(positions, hidden, residual, metadata)
                hidden, residual = hidden[output_rows], residual[output_rows]
        hidden, _ = self.norm(hidden, residual)
        return hidden


class DecoderForCausalLM(CausalLM):
    """A Llama-shaped causal LM; subclasses change ``make_attention``, ``make_mlp``,
    ``make_norm``, ``make_layer`` or ``embed_scale``."""

    embed_scale: float | None = None
    # a step reading few rows (its sampled ones) skips the others in the last layer; a subclass whose forward
    # takes no output_rows sets it False
    accepts_output_rows = True

    def __init__(self, config: Any, kernels: KernelSet) -> None:
        super().__init__()
        self.config = config
        windows = layer_windows(config)
        layers = (self.make_layer(config, kernels, i, windows[i]) for i in range(config.num_hidden_layers))
        norm = self.make_norm(config, kernels)
        self.model = DecoderModel(config, kernels, layers, norm, self.embed_scale)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.tie_weights()

    def make_layer(self, config: Any, kernels: KernelSet, index: int, window: int | None) -> nn.Module:
        return DecoderLayer(
            self.make_attention(config, kernels, index, window),
            self.make_mlp(config, kernels, index),
            self.make_norm(config, kernels),
            self.make_norm(config, kernels),
        )

    def make_norm(self, config: Any, kernels: KernelSet) -> nn.Module:
        return RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)

    def make_attention(self, config: Any, kernels: KernelSet, index: int, window: int | None) -> nn.Module:
        bias = bool(getattr(config, "attention_bias", False))
        return DecoderAttention(config, kernels, sliding_window=window, qkv_bias=bias, o_bias=bias)

    def make_mlp(self, config: Any, kernels: KernelSet, index: int) -> nn.Module:
        return GatedMLP(config.hidden_size, config.intermediate_size, bool(getattr(config, "mlp_bias", False)), kernels)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, attn_metadata, output_rows)


_BASE_WEIGHT = re.compile(r"^(embed_tokens|layers|norm)\.")


def embedding_variant(causal_lm: type[CausalLM]) -> type[CausalLM]:
    """The same network used as an embedding model: hidden states pooled, no LM head.

    Reads checkpoints of the bare base model (``LlamaModel``, ``Qwen3Model`` ...:
    names without the ``model.`` prefix) and of the causal LM (its head ignored).
    """

    class EmbeddingModel(causal_lm):  # type: ignore[valid-type, misc]
        is_pooling_model = True
        default_pooling = "last"  # a decoder's last token has seen the whole text
        default_normalize = True

        def __init__(self, config: Any, kernels: KernelSet) -> None:
            super().__init__(config, kernels)
            del self.lm_head  # built on the meta device: nothing was allocated

        def tie_weights(self) -> None:
            pass  # no head to tie

        def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
            raise TypeError(f"{type(self).__name__} produces embeddings, not logits")

        def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
            renamed = (("model." + name if _BASE_WEIGHT.match(name) else name, tensor) for name, tensor in weights)
            load_weights(self, renamed, self.stacked_params, (*self.ignored_weights, "lm_head."))

    EmbeddingModel.__name__ = EmbeddingModel.__qualname__ = causal_lm.__name__.replace("ForCausalLM", "Model")
    return EmbeddingModel


def sequence_classification_variant(causal_lm: type[CausalLM]) -> type[CausalLM]:
    """The same network with a classification head on its last token (``LlamaForSequenceClassification`` ...).

    Reads transformers' checkpoints of the ``*ForSequenceClassification`` class: the ``model.*``
    weights and ``score.weight`` (``[num_labels, hidden]``, no bias); reward models such as
    Skywork-Reward are these with one label. A causal LM checkpoint whose config has
    ``classifier_token_ids`` and a ``method`` (an LLM reranker such as Qwen3-Reranker, turned into
    a classifier by ``hf_overrides``) gets its head from the LM head's rows of those tokens instead,
    as vLLM converts them: ``from_2_way_softmax`` scores with ``lm_head[yes] - lm_head[no]``
    (tokens in the order ``[no, yes]``; one label), ``no_post_processing`` with the rows themselves
    (one label per token).
    """

    class ForSequenceClassification(causal_lm):  # type: ignore[valid-type, misc]
        is_pooling_model = True
        default_pooling = "last"  # a decoder's last token has seen the whole text
        default_normalize = False

        def __init__(self, config: Any, kernels: KernelSet) -> None:
            super().__init__(config, kernels)
            del self.lm_head  # built on the meta device: nothing was allocated
            # replicated on every rank: the final hidden states are whole on each
            self.score = self.make_score(config)

        def make_score(self, config: Any) -> nn.Module:
            """The head, loaded from the checkpoint's ``score.*``: transformers' ``score.weight``
            (1 label for from_2_way_softmax). A subclass with another head (vLLM's
            ``Qwen2ForRewardModel``: an MLP) returns it here and overrides :meth:`classify`."""
            return nn.Linear(config.hidden_size, num_labels(config), bias=False)

        def tie_weights(self) -> None:
            pass  # no head to tie

        def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
            raise TypeError(f"{type(self).__name__} classifies; it produces no token logits")

        def classify(self, pooled: torch.Tensor) -> torch.Tensor:
            """``[N, hidden]`` pooled hidden states -> ``[N, num_labels]`` float32 logits."""
            weight = self.score.weight.float()  # row by row: a score does not depend on its batch
            return row_invariant(lambda rows: F.linear(rows, weight), pooled.float())

        keeps_quantized_weights = False  # the score head may be built from the LM head's rows

        def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
            renamed = (("model." + name if _BASE_WEIGHT.match(name) else name, tensor) for name, tensor in weights)
            method = token_classifier_method(self.config)
            if method is not None:
                renamed = _converted_score(renamed, self.config, method)
            try:
                load_weights(self, renamed, self.stacked_params, (*self.ignored_weights, "lm_head."))
            except ModelLoadError as exc:
                if method is None and "score." in str(exc):  # a causal LM's checkpoint read as a classifier
                    raise ModelLoadError(
                        f"{exc}: the checkpoint has no classification head. A causal LM classifies with "
                        'its own token logits through --hf-overrides \'{"classifier_from_token": [...], '
                        '"method": "from_2_way_softmax"}\' (vLLM\'s LLM-as-reranker recipe), or serve a '
                        "*ForSequenceClassification checkpoint"
                    ) from None
                raise

    ForSequenceClassification.__name__ = ForSequenceClassification.__qualname__ = causal_lm.__name__.replace(
        "ForCausalLM", "ForSequenceClassification"
    )
    return ForSequenceClassification


def _converted_score(
    weights: Iterable[tuple[str, torch.Tensor]], config: Any, method: str
) -> Iterable[tuple[str, torch.Tensor]]:
    """The checkpoint's weights without its LM head, then ``score.weight`` made from the head's token rows.

    The head is ``lm_head.weight``, or the input embedding when the model ties them (a tied
    checkpoint stores no ``lm_head.weight``). Only the rows of the classifier tokens are kept.
    """
    tied = bool(getattr(config, "tie_word_embeddings", False))
    head_name = "model.embed_tokens.weight" if tied else "lm_head.weight"
    ids = list(config.classifier_token_ids)
    rows = None
    for name, tensor in weights:
        if name == head_name:
            if max(ids) >= tensor.shape[0] or min(ids) < 0:
                raise ModelLoadError(
                    f"classifier token ids {ids} are outside the vocabulary of {head_name} ({tensor.shape[0]} rows)"
                )
            rows = tensor[ids].float()
        if not name.startswith(("lm_head.", "score.")):
            yield name, tensor
    if rows is None:
        raise ModelLoadError(f"checkpoint lacks {head_name}, whose token rows the {method} conversion needs")
    yield "score.weight", token_classifier_weight(rows, method)


def as_pooling_model(model_cls: type, task: str) -> type:
    """The class that serves ``task`` (the resolved primary task): ``model_cls`` itself, or for a
    native causal LM of the shared layers converted to a pooling task, its pooling variant
    (``embed``: hidden states pooled, no LM head; ``classify``/``reward``: a score head)."""
    if task == "generate" or getattr(model_cls, "is_pooling_model", False):
        return model_cls
    if not (isinstance(model_cls, type) and issubclass(model_cls, CausalLM)):
        raise ValueError(
            f"{getattr(model_cls, '__name__', model_cls)} cannot serve task {task!r}: only native "
            "causal LMs convert to pooling models"
        )
    if task == "embed":
        return embedding_variant(model_cls)
    if task in ("classify", "reward"):
        return sequence_classification_variant(model_cls)
    raise ValueError(f"unknown pooling task {task!r}")
