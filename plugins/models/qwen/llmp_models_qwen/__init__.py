"""llmp plugin: the native Qwen2, Qwen3 and Qwen3-MoE models.

This module only registers; ``model.py`` (which imports torch) loads on selection.
"""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import ModelSpec

_MODULE = "llmp_models_qwen.model"


@hookimpl
def llmp_register_models() -> Iterator[ModelSpec]:
    yield ModelSpec(
        name="Qwen2ForCausalLM",
        impl=f"{_MODULE}:Qwen2ForCausalLM",
        description="Qwen2 and Qwen2.5 causal LMs (bias on the QKV projection).",
    )
    yield ModelSpec(
        name="Qwen3ForCausalLM",
        impl=f"{_MODULE}:Qwen3ForCausalLM",
        description="Qwen3 dense causal LMs (RMSNorm on each head's q and k).",
    )
    yield ModelSpec(
        name="Qwen3MoeForCausalLM",
        impl=f"{_MODULE}:Qwen3MoeForCausalLM",
        description="Qwen3 mixture-of-experts causal LMs (Qwen3-30B-A3B, Qwen3-235B-A22B).",
    )
    yield ModelSpec(
        name="Qwen2Model",
        impl=f"{_MODULE}:Qwen2Model",
        tasks=("embed",),
        description="A Qwen2 base model used for embeddings (gte-Qwen2; last-token pooling).",
    )
    yield ModelSpec(
        name="Qwen3Model",
        impl=f"{_MODULE}:Qwen3Model",
        tasks=("embed",),
        description="A Qwen3 base model used for embeddings (Qwen3-Embedding; last-token pooling).",
    )
    yield ModelSpec(
        name="Qwen2ForSequenceClassification",
        impl=f"{_MODULE}:Qwen2ForSequenceClassification",
        tasks=("classify",),
        description="A Qwen2 classifier or reward model (a score head on the last token).",
    )
    yield ModelSpec(
        name="Qwen3ForSequenceClassification",
        impl=f"{_MODULE}:Qwen3ForSequenceClassification",
        tasks=("classify",),
        description="A Qwen3 classifier, or Qwen3-Reranker converted from its yes/no token logits "
        "(hf_overrides classifier_from_token, is_original_qwen3_reranker).",
    )
    yield ModelSpec(
        name="Qwen2ForRewardModel",
        impl=f"{_MODULE}:Qwen2ForRewardModel",
        tasks=("reward",),
        description="Qwen2.5-Math-RM: a reward at every token from an MLP head (token_classify, LLM.reward).",
    )
    yield ModelSpec(
        name="Qwen2ForProcessRewardModel",
        impl=f"{_MODULE}:Qwen2ForProcessRewardModel",
        tasks=("reward",),
        description="Qwen2.5-Math-PRM: the probabilities of a wrong and a right step at each step tag "
        "(step_tag_id, default <extra_0> = 151651).",
    )
