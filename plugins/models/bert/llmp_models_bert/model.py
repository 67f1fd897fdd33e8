"""BERT-family encoders and cross-encoders: ``BertModel``, ``RobertaModel``/``XLMRobertaModel`` (embeddings)
and their ``*ForSequenceClassification`` heads (rerankers such as ms-marco MiniLM and bge-reranker).

Each request's tokens attend to each other (never across requests); there is no KV cache, so
every request is computed whole in one step. A step's requests are padded to the longest and run
through ONE masked attention call per layer: a reranking step of 100 pairs is one call, not 100.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmp.api import AttentionMetadata, KernelSet, ModelLoadError
from llmp.modeling.layers import PackableLinear, load_weights
from llmp.modeling.parallel import tp_size
from llmp.modeling.pooling import num_labels

_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}

# checkpoint tensors no native module holds: position id buffers, the masked-LM and NSP heads
_UNUSED_WEIGHTS = ("position_ids", "cls.predictions", "cls.seq_relationship", "lm_head.")


class PaddedBatch:
    """A step's flattened tokens ``[T, F]`` laid out as ``[requests, longest, F]`` for attention.

    The padded buffers are allocated (zeroed) once per step and shape, then reused by every layer:
    each layer only overwrites the real rows, so padding stays zero (a masked-out key of zeros,
    never a NaN that ``0 * NaN`` would spread).
    """

    def __init__(self, query_start_loc: torch.Tensor) -> None:
        lengths = (query_start_loc[1:] - query_start_loc[:-1]).to(torch.int64)
        self.starts = query_start_loc[:-1].to(torch.int64)  # each request's first row
        self.requests, self.longest = len(lengths), int(lengths.max())
        self.valid: torch.Tensor | None = None  # [R, L] bool, True for a real token
        self.rows: torch.Tensor | None = None  # [T] row of each token in the padded [R * L] layout
        if self.requests > 1 and int(lengths.min()) < self.longest:
            self.valid = torch.arange(self.longest, device=lengths.device) < lengths[:, None]
            self.rows = self.valid.flatten().nonzero().squeeze(1)
        self._buffers: dict[object, torch.Tensor] = {}  # pad buffers by (width, dtype), masks by dtype

    def key_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """``[R, 1, 1, L]`` additive mask (0 or -inf) hiding the padding keys, made once per step
        (SDPA would convert a boolean one in every layer); None when there is no padding."""
        if self.valid is None:
            return None
        if dtype not in self._buffers:
            mask = torch.zeros(self.valid.shape, dtype=dtype, device=self.valid.device)
            self._buffers[dtype] = mask.masked_fill_(~self.valid, float("-inf"))[:, None, None, :]
        return self._buffers[dtype]

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, F]`` token rows into ``[R, L, F]`` (zeros after each request's end)."""
        if self.rows is None:  # one request, or all of one length: a view
            return x.view(self.requests, self.longest, x.shape[-1])
        key = (x.shape[-1], x.dtype)
        if key not in self._buffers:
            self._buffers[key] = x.new_zeros(self.requests * self.longest, x.shape[-1])
        padded = self._buffers[key].index_copy_(0, self.rows, x)
        return padded.view(self.requests, self.longest, -1)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """``[R, L, F]`` back into ``[T, F]``."""
        flat = x.reshape(self.requests * self.longest, -1)
        return flat if self.rows is None else flat.index_select(0, self.rows)


class EncoderLinear(PackableLinear):
    """``nn.Linear`` whose matmul a kernel set may take over (oneDNN-packed bfloat16 on the CPU),
    over all rows at once: an encoder's output has no greedy decoding whose bits must not depend
    on the batch, so it skips the decoders' fixed-size row blocks."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features))

    def packed_bias(self) -> torch.Tensor | None:
        return self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.packed(x) if self.packed is not None else F.linear(x, self.weight, self.bias)


class QKVLinear(EncoderLinear):
    """query, key and value in one matmul; the checkpoint's three matrices load as its shards."""

    STACKED = {".query.": (".qkv.", "q"), ".key.": (".qkv.", "k"), ".value.": (".qkv.", "v")}

    def __init__(self, hidden: int) -> None:
        super().__init__(hidden, 3 * hidden)
        self.hidden = hidden
        self.shard_offsets = {"q": 0, "k": hidden, "v": 2 * hidden}  # read by llmp's load_weights

    def load_shard(self, shard: str, param_name: str, tensor: torch.Tensor) -> None:
        target = getattr(self, param_name).data.narrow(0, self.shard_offsets[shard], self.hidden)
        if tensor.shape != target.shape:
            raise ModelLoadError(
                f"{shard} shard of {param_name}: expected {tuple(target.shape)}, got {tuple(tensor.shape)}"
            )
        target.copy_(tensor)


class BertEmbeddings(nn.Module):
    def __init__(self, config: Any, position_offset: int) -> None:
        super().__init__()
        self.position_offset = position_offset
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor | None
    ) -> torch.Tensor:
        hidden = self.word_embeddings(input_ids) + self.position_embeddings(positions + self.position_offset)
        if token_type_ids is None:  # one segment: every token has token type 0
            return self.LayerNorm(hidden + self.token_type_embeddings.weight[0])
        return self.LayerNorm(hidden + self.token_type_embeddings(token_type_ids))


class BertSelfAttention(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.qkv = QKVLinear(config.hidden_size)

    def forward(self, hidden: torch.Tensor, batch: PaddedBatch, query_rows: torch.Tensor | None = None) -> torch.Tensor:
        """``[T, hidden]`` attention outputs, or with ``query_rows`` (one row per request, counted from
        the request's start) only those rows' ``[R, hidden]``: their keys and values are all rows."""
        qkv = batch.pad(self.qkv(hidden)).view(batch.requests, batch.longest, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [R, H, L, D] each
        if query_rows is not None:
            q = q[torch.arange(batch.requests, device=q.device), :, query_rows].unsqueeze(2)  # [R, H, 1, D]
        # padded keys are masked out; padded queries see real keys only and are dropped by unpad
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=batch.key_mask(q.dtype))
        if query_rows is not None:
            return out.reshape(batch.requests, -1)
        return batch.unpad(out.transpose(1, 2).reshape(batch.requests, batch.longest, -1))


class _DenseNorm(nn.Module):
    """``LayerNorm(dense(x) + residual)``: the output block of BERT's attention and MLP."""

    def __init__(self, in_features: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.dense = EncoderLinear(in_features, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = _DenseNorm(config.hidden_size, config.hidden_size, config.layer_norm_eps)

    def forward(
        self, hidden: torch.Tensor, batch: PaddedBatch, output_rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        if output_rows is None:
            return self.output(self.self(hidden, batch), hidden)
        query_rows = output_rows - batch.starts
        return self.output(self.self(hidden, batch, query_rows), hidden[output_rows])


class BertIntermediate(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = EncoderLinear(config.hidden_size, config.intermediate_size)
        self.act = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = _DenseNorm(config.intermediate_size, config.hidden_size, config.layer_norm_eps)

    def forward(
        self, hidden: torch.Tensor, batch: PaddedBatch, output_rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        hidden = self.attention(hidden, batch, output_rows)
        return self.output(self.intermediate(hidden), hidden)


class BertEncoder(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))


class BertModel(nn.Module):
    """The encoder: token states ``[T, hidden]`` for the engine's poolers (embeddings)."""

    is_pooling_model = True
    default_pooling = "cls"  # without a sentence-transformers config, BERT's [CLS] vector
    accepts_token_type_ids = True
    accepts_output_rows = True
    checkpoint_prefix = "bert."  # the encoder's weights in a *ForSequenceClassification checkpoint

    def __init__(self, config: Any, kernels: KernelSet) -> None:
        super().__init__()
        if tp_size() > 1:
            raise ValueError(f"{type(self).__name__} runs on one rank: use tensor_parallel_size=1")
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            raise ValueError(
                f"{type(self).__name__} supports absolute positions, not {config.position_embedding_type!r}"
            )
        self.config = config
        self.embeddings = BertEmbeddings(config, self.position_offset(config))
        self.encoder = BertEncoder(config)

    @staticmethod
    def position_offset(config: Any) -> int:
        """The position embedding row of a request's first token (the engine counts from 0)."""
        return 0

    def attention_layers(self) -> list:
        return []  # no KV cache

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        token_type_ids: torch.Tensor | None = None,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch = PaddedBatch(attn_metadata.query_start_loc.to(input_ids.device))
        hidden = self.embeddings(input_ids, positions, token_type_ids)
        layers = list(self.encoder.layer)
        for layer in layers[:-1]:
            hidden = layer(hidden, batch)
        if not layers:
            return hidden if output_rows is None else hidden[output_rows]
        # the last layer computes only the rows the poolers read (a cross-encoder's [CLS] of each
        # pair): its keys and values need every row, its queries and MLP only those
        return layers[-1](hidden, batch, output_rows)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # the encoder of any checkpoint: a classifier's (prefixed, its head unused) or a bare one with a pooler
        renamed = ((name.removeprefix(self.checkpoint_prefix), tensor) for name, tensor in weights)
        load_weights(self, renamed, QKVLinear.STACKED, ignored=("pooler.", "classifier.", *_UNUSED_WEIGHTS))


class RobertaModel(BertModel):
    """RoBERTa and XLM-RoBERTa (bge-m3, multilingual-e5): BERT with positions counted after the
    padding id (transformers' ``create_position_ids_from_input_ids``) and one token type."""

    checkpoint_prefix = "roberta."

    @staticmethod
    def position_offset(config: Any) -> int:
        return config.pad_token_id + 1


class XLMRobertaModel(RobertaModel):
    pass


class EncoderClassifier(nn.Module):
    """An encoder (in the attribute ``encoder_name``, the checkpoint's prefix) with a classification
    head on its [CLS] (``<s>``) state: the runner pools with ``default_pooling`` and calls ``classify``."""

    is_pooling_model = True
    default_pooling = "cls"
    accepts_token_type_ids = True
    accepts_output_rows = True
    encoder_name: str

    def attention_layers(self) -> list:
        return []  # no KV cache

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        token_type_ids: torch.Tensor | None = None,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return getattr(self, self.encoder_name)(input_ids, positions, attn_metadata, token_type_ids, output_rows)


class BertForSequenceClassification(EncoderClassifier):
    """A cross-encoder or classifier: the encoder, then on the [CLS] state BERT's pooler
    (dense + tanh) and ``classifier``."""

    encoder_name = "bert"

    def __init__(self, config: Any, kernels: KernelSet) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, kernels)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)  # BertPooler's dense
        self.classifier = nn.Linear(config.hidden_size, num_labels(config))

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.tanh(self.pooler(pooled)))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        renamed = ((name.replace("bert.pooler.dense.", "pooler."), tensor) for name, tensor in weights)
        load_weights(self, renamed, QKVLinear.STACKED, ignored=_UNUSED_WEIGHTS)


class RobertaClassificationHead(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, num_labels(config))

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(pooled)))


class RobertaForSequenceClassification(EncoderClassifier):
    """RoBERTa/XLM-R cross-encoders and classifiers (bge-reranker-base/large/v2-m3): the encoder,
    then ``classifier.dense`` + tanh + ``classifier.out_proj`` on the ``<s>`` state."""

    encoder_name = "roberta"

    def __init__(self, config: Any, kernels: KernelSet) -> None:
        super().__init__()
        self.config = config
        self.roberta = RobertaModel(config, kernels)
        self.classifier = RobertaClassificationHead(config)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(pooled)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_weights(self, weights, QKVLinear.STACKED, ignored=("roberta.pooler.", *_UNUSED_WEIGHTS))


class XLMRobertaForSequenceClassification(RobertaForSequenceClassification):
    pass
