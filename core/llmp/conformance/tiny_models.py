"""Tiny random checkpoints of real architectures, and the engine runs the model and kernel suites compare.

A tiny checkpoint is transformers' own class for the architecture, built from its own config
class shrunk to :data:`llmp.testing.TINY_DECODER` (2 layers, hidden 64, 4 heads, 2 KV heads,
vocabulary 512) plus what makes the family's particular code run (:data:`FAMILY_SETTINGS`: a
sliding window shorter than the prompts, 4 experts routed top-2, soft-capping ...), with random
weights saved by transformers. The model that saved it is the reference.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmp.conformance.runner import Context, SkipCheck

__all__ = [
    "ENCODER_TYPES",
    "FAMILY_SETTINGS",
    "GreedyRun",
    "TinyModel",
    "first_divergence",
    "once_or_raise",
    "quiet",
    "run_greedy",
    "save_tiny_architecture",
]

# per ``model_type``: the knobs that make the family's own code paths matter on a tiny model. qk_scale
# (q and k projections scaled) sharpens attention so a wrong key, position, mask or cap changes tokens.
FAMILY_SETTINGS: dict[str, dict[str, Any]] = {
    "mistral": dict(sliding_window=8),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
    # layer 0 full attention, layer 1 a sliding window (max_window_layers)
    "qwen2": dict(use_sliding_window=True, sliding_window=8, max_window_layers=1),
    "qwen3": dict(head_dim=32),  # a head size that is not hidden / heads
    # a dense layer (mlp_only_layers) beside a routed one
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=[1]),
    "gemma2": dict(
        sliding_window=8,
        query_pre_attn_scalar=24,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0,
        attn_implementation="eager",  # transformers' implementation that applies the soft-cap
        qk_scale=6.0,
    ),
    "gpt2": dict(initializer_range=0.1),  # no q_proj/k_proj to scale: sharper attention from the start
    "phi3": dict(sliding_window=20, partial_rotary_factor=0.5, initializer_range=0.1),
    "gpt_neox": dict(rotary_pct=0.25, initializer_range=0.1),
    # local (sliding) and global attention layers; initializer_range 0.2 spreads the logits
    "modernbert": dict(num_hidden_layers=3, global_attn_every_n_layers=2, local_attention=16, initializer_range=0.2),
}
DEFAULT_SCALES = dict(qk_scale=4.0, logit_scale=8.0)  # wide greedy margins (save_tiny_model's LM head scale)

# encoders get llmp.testing's cross-encoder builder (its tokenizers and each family's position quirks)
ENCODER_TYPES = ("bert", "roberta", "xlm-roberta")
CLASSIFIER_LABELS = 3  # decoder classifiers: more than one label, so the head's rows are told apart
_SUFFIXES = ("ForCausalLM", "ForSequenceClassification", "Model")
PAD_TOKEN = 2  # classifiers pool the last token that is not padding: the prompts never hold id 2


@dataclass
class TinyModel:
    """A saved tiny checkpoint of ``architecture`` (in ``path``) and the transformers model that saved it."""

    architecture: str
    path: Path
    reference: Any  # the transformers model (float32, eval mode)
    model_type: str
    vocab: int  # prompts draw token ids below this

    def prompts(self, count: int = 6, *, shared_prefix: int = 0, seed: int = 1) -> list[list[int]]:
        from llmp.testing import mixed_prompts

        return mixed_prompts(count, shared_prefix=shared_prefix, seed=seed, vocab=self.vocab)


def once_or_raise(context: Context, key: str, build: Callable[[], Any]) -> Any:
    """``context.once(key, build)``, keeping a failure too (a skip included): every check that
    needs what ``build`` makes fails, or skips, the same way without building it again."""

    def outcome() -> Any:
        try:
            return build()
        except Exception as failure:
            return failure

    value = context.once(key, outcome)
    if isinstance(value, BaseException):
        raise value
    return value


@contextmanager
def quiet() -> Iterator[None]:
    """No INFO lines from engines and no progress bars from transformers while checks run: the
    report is what ``verify`` shows."""
    from transformers.utils import logging as hf_logging

    logger = logging.getLogger("llmp")
    level, env_level = logger.level, os.environ.get("LLMP_LOG_LEVEL")
    bars = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    logger.setLevel(logging.WARNING)
    os.environ["LLMP_LOG_LEVEL"] = "warning"  # worker processes (the mp executor) read it
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        logger.setLevel(level)
        if env_level is None:
            os.environ.pop("LLMP_LOG_LEVEL", None)
        else:
            os.environ["LLMP_LOG_LEVEL"] = env_level
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def save_tiny_architecture(
    path: Path, architecture: str, settings: Mapping[str, Any] | None = None, *, seed: int = 0
) -> TinyModel:
    """Save a tiny random checkpoint of ``architecture`` into ``path``.

    ``settings`` (``verify(..., model_configs={architecture: settings})``) override the config;
    ``reference`` names the transformers class to build when transformers has no class of that
    name (a plugin's own architecture whose checkpoints are laid out as an existing one's):
    ``config.json`` then names ``architecture``. ``qk_scale`` and ``logit_scale`` scale the q/k
    projections and the LM head. Raises SkipCheck when transformers cannot build it.
    """
    import transformers

    settings = dict(settings or {})
    reference_name = settings.pop("reference", architecture)
    model_cls = getattr(transformers, reference_name, None)
    if model_cls is None or not hasattr(model_cls, "config_class"):
        example = "Llama" + next((s for s in _SUFFIXES if architecture.endswith(s)), "ForCausalLM")
        hint = (
            f"; name the transformers class whose checkpoints it reads: verify(..., model_configs="
            f"{{{architecture!r}: {{'reference': {example!r}}}}})"
            if reference_name == architecture
            else ""
        )
        raise SkipCheck(f"transformers {transformers.__version__} has no class {reference_name}{hint}")
    with quiet():
        model_type = model_cls.config_class().model_type
        try:
            if model_type in ENCODER_TYPES:
                model = _save_encoder(path, reference_name, settings, seed)
            else:
                model = _save_decoder(path, model_cls, settings, seed)
        except Exception as exc:  # the kit's settings do not fit this family: say which knob to give
            raise AssertionError(
                f"could not build a tiny {reference_name} with transformers ({type(exc).__name__}: {exc}); "
                f"set its config with verify(..., model_configs={{{architecture!r}: {{...}}}})"
            ) from exc
    if reference_name != architecture:  # the plugin's architecture, in a checkpoint laid out as the reference's
        config_file = path / "config.json"
        config = json.loads(config_file.read_text())
        config["architectures"] = [architecture]
        config_file.write_text(json.dumps(config, indent=2))
    vocab = min(int(model.config.vocab_size), 512)
    return TinyModel(architecture, path, model, model_type, vocab)


def _save_decoder(path: Path, model_cls: Any, settings: dict[str, Any], seed: int) -> Any:
    import torch

    from llmp.testing import TINY_DECODER, tiny_tokenizer

    defaults = model_cls.config_class()
    config = {key: value for key, value in TINY_DECODER.items() if hasattr(defaults, key)}
    if hasattr(defaults, "pad_token_id"):  # a family default (Phi-3's 32000) may lie past the tiny vocabulary
        config["pad_token_id"] = PAD_TOKEN
    if hasattr(defaults, "head_dim"):  # a family default (Gemma's 256) would dwarf hidden 64
        config["head_dim"] = TINY_DECODER["hidden_size"] // TINY_DECODER["num_attention_heads"]
    if model_cls.__name__.endswith("ForSequenceClassification"):
        config.update(num_labels=CLASSIFIER_LABELS, pad_token_id=PAD_TOKEN)  # pools the last non-pad token
    config.update(DEFAULT_SCALES)
    config.update(FAMILY_SETTINGS.get(defaults.model_type, {}))
    config.update(settings)
    qk_scale, logit_scale = config.pop("qk_scale"), config.pop("logit_scale")
    torch.manual_seed(seed)
    model = model_cls(model_cls.config_class(**config)).float().eval()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    with torch.no_grad():
        if head is not None:
            head.weight.mul_(logit_scale)
        for name, param in model.named_parameters():
            if ".q_proj." in name or ".k_proj." in name:
                param.mul_(qk_scale)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return model


def _save_encoder(path: Path, architecture: str, settings: dict[str, Any], seed: int) -> Any:
    from llmp.testing import save_tiny_cross_encoder

    for scale in DEFAULT_SCALES:
        settings.pop(scale, None)
    return save_tiny_cross_encoder(path, architecture, seed=seed, **settings)


# -- engine runs --------------------------------------------------------------------------------


@dataclass
class GreedyRun:
    """What one engine generated for a batch, and what its counters said afterwards."""

    tokens: list[list[int]]
    cached_tokens: list[int]  # per request: prompt tokens found in the prefix cache
    prefix_cache_hits: int
    preemptions: int
    prefill_chunks: int
    kernels: str
    spec_plugin: str  # the model record the engine selected
    spec_name: str


def run_greedy(path: Path, batches: Sequence[Sequence[list[int]]], max_tokens: int, **options: Any) -> list[GreedyRun]:
    """Greedy continuations (float32, EOS ignored) of each batch of prompts in turn, in one engine
    made with ``options`` (blocks of 4 tokens unless they say otherwise), shut down afterwards."""
    from llmp import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    with quiet():
        llm = LLM(str(path), **{"dtype": "float32", "block_size": 4, **options})
        try:
            runs = []
            for prompts in batches:
                outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
                engine = llm.engine
                runs.append(
                    GreedyRun(
                        tokens=[list(o.outputs[0].token_ids) for o in outputs],
                        cached_tokens=[o.num_cached_tokens for o in outputs],
                        prefix_cache_hits=engine.kv_manager.prefix_cache_hits,
                        preemptions=engine.scheduler.num_preemptions,
                        prefill_chunks=getattr(engine.scheduler, "num_prefill_chunks", 0),
                        kernels=engine.info.kernels,
                        spec_plugin=engine.model.spec.plugin,
                        spec_name=engine.model.spec.name,
                    )
                )
            return runs
        finally:
            llm.shutdown()


def first_divergence(
    prompts: Sequence[list[int]], got: Sequence[list[int]], expected: Sequence[list[int]], *, what: str, against: str
) -> str | None:
    """None when every continuation is equal; else where the first one diverges, precisely."""
    for index, (prompt, ours, theirs) in enumerate(zip(prompts, got, expected, strict=True)):
        ours, theirs = list(ours), list(theirs)
        if ours == theirs:
            continue
        position = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
        if position is None:
            position = min(len(ours), len(theirs))
        return (
            f"{what}: prompt {index} ({len(prompt)} tokens) diverges from {against} at generated position "
            f"{position}: got token {_at(ours, position)}, expected {_at(theirs, position)}\n"
            f"  got      {ours}\n  expected {theirs}"
        )
    return None


def _at(tokens: list[int], position: int) -> str:
    return str(tokens[position]) if position < len(tokens) else "(none: the continuation ended)"
