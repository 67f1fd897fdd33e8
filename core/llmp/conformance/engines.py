"""The tiny Llama and the reference engine the executor and scheduling suites share in one ``verify``.

The reference is the built-in stack (the ``uniproc`` executor, the default scheduler and KV-cache
manager) on a tiny random Llama (:data:`llmp.testing.TINY_DECODER`: 2 layers, hidden 64, 4 heads,
2 KV heads, so tensor parallelism of 2 divides it), in this process, built once per ``verify``.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from llmp.conformance.runner import Context, SkipCheck

__all__ = [
    "ENGINE_OPTIONS",
    "EngineHandle",
    "Timeout",
    "first_difference",
    "greedy",
    "once_or_raise",
    "reference_engine",
    "save_random_llama",
    "token_prompts",
    "tiny_llama",
    "within",
]

REFERENCE_ARCHITECTURE = "LlamaForCausalLM"
ENGINE_OPTIONS: dict[str, Any] = dict(dtype="float32", block_size=4, max_model_len=128)
T = TypeVar("T")


@dataclass
class EngineHandle:
    """An ``LLM`` the context closes at the end of ``verify``, unless a check found it wedged
    (a call into it never returned: shutting it down could hang too)."""

    llm: Any
    new_children: list[int] = field(default_factory=list)  # child processes this process gained with it
    wedged: bool = False
    closed: bool = False

    def close(self) -> None:
        if not (self.wedged or self.closed):
            self.closed = True
            self.llm.shutdown()


@dataclass(frozen=True)
class _Failed:
    error: BaseException


def once_or_raise(context: Context, key: str, build: Callable[[], T]) -> T:
    """``context.once`` that remembers a failed build too: the first caller gets the error, later
    ones a skip naming it (one failure reported, not the same one in every check)."""
    if key not in context.cache:
        try:
            context.cache[key] = build()
        except BaseException as error:
            context.cache[key] = _Failed(error)
            raise
    value = context.cache[key]
    if isinstance(value, _Failed):
        raise SkipCheck(f"needs what failed earlier: {type(value.error).__name__}: {value.error}")
    return value


def tiny_llama(context: Context) -> Path:
    """The tiny Llama's directory (weights and tokenizer), saved once per ``verify``."""
    from llmp import registry

    if REFERENCE_ARCHITECTURE not in registry.components("model"):
        raise SkipCheck(
            f"needs the reference model plugin llmp-models-llama ({REFERENCE_ARCHITECTURE}), which is not installed"
        )

    def save() -> Path:
        path = context.workdir / "engines-tiny-llama"
        save_random_llama(path)
        return path

    return once_or_raise(context, "engines:tiny-llama", save)


def save_random_llama(path: Path, *, seed: int = 0, logit_scale: float = 8.0) -> None:
    """A random Llama of :data:`llmp.testing.TINY_DECODER`'s shape as a Hugging Face directory (what
    ``save_tiny_llama`` writes, without importing transformers' modeling code: seconds less). Weights
    are drawn as transformers initialises them (normal, std 0.02; norms 1); the LM head is scaled
    by ``logit_scale`` so greedy margins are wide."""
    import json

    import torch
    from safetensors.torch import save_file

    from llmp.testing import TINY_DECODER, tiny_tokenizer

    config = dict(TINY_DECODER)
    hidden, inner, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    head_dim = hidden // config["num_attention_heads"]
    kv_width = head_dim * config["num_key_value_heads"]
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> Any:
        return torch.randn(*shape, generator=generator) * 0.02

    weights = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden)}
    for layer in range(layers):
        prefix = f"model.layers.{layer}."
        shapes = {
            "self_attn.q_proj": (hidden, hidden),
            "self_attn.k_proj": (kv_width, hidden),
            "self_attn.v_proj": (kv_width, hidden),
            "self_attn.o_proj": (hidden, hidden),
            "mlp.gate_proj": (inner, hidden),
            "mlp.up_proj": (inner, hidden),
            "mlp.down_proj": (hidden, inner),
        }
        weights.update({f"{prefix}{name}.weight": normal(*shape) for name, shape in shapes.items()})
        weights[f"{prefix}input_layernorm.weight"] = torch.ones(hidden)
        weights[f"{prefix}post_attention_layernorm.weight"] = torch.ones(hidden)
    weights["model.norm.weight"] = torch.ones(hidden)
    weights["lm_head.weight"] = normal(config["vocab_size"], hidden) * logit_scale
    path.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    config.update(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        head_dim=head_dim,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        attention_bias=False,
        mlp_bias=False,
        torch_dtype="float32",
    )
    (path / "config.json").write_text(json.dumps(config, indent=2))
    tiny_tokenizer().save_pretrained(path)


def reference_engine(context: Context) -> Any:
    """The built-in stack's ``LLM`` over the tiny Llama (an ample KV cache: it never preempts)."""

    def build() -> EngineHandle:
        from llmp import LLM

        return EngineHandle(LLM(str(tiny_llama(context)), **ENGINE_OPTIONS))

    return once_or_raise(context, "engines:reference", build).llm


def token_prompts(
    count: int, seed: int, *, shared_prefix: int = 0, lengths: tuple[int, int] = (3, 30)
) -> list[list[int]]:
    """``count`` random prompts of token ids (3..511: no special token), half of them after a
    common prefix of ``shared_prefix`` tokens."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 512) for _ in range(shared_prefix)]
    prompts = []
    for index in range(count):
        body = [rng.randrange(3, 512) for _ in range(rng.randint(*lengths))]
        prompts.append((prefix if index % 2 == 0 else []) + body)
    return prompts


def greedy(llm: Any, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
    """``llm``'s greedy continuations of ``prompts`` (EOS ignored: always ``max_tokens`` tokens)."""
    from llmp import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def first_difference(expected: Sequence[Sequence[int]], got: Sequence[Sequence[int]]) -> str:
    """Where two lists of continuations first differ, in words ('' when they are equal)."""
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        if list(want) != list(have):
            at = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
            return f"prompt {index}: token {at} differs\n  expected {list(want)}\n  got      {list(have)}"
    return ""


class Timeout(Exception):
    """A call :func:`within` ran did not return in time (it still runs, in a daemon thread)."""


def within(seconds: float, call: Callable[[], T]) -> T:
    """``call()``'s result or error, or :class:`Timeout` after ``seconds``. The call runs in a
    daemon thread, so a hung engine cannot hang the run (nor keep the process from exiting)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # handed to the caller as is
            outcome["error"] = error

    thread = threading.Thread(target=run, name="llmp-conformance-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise Timeout(f"no answer within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
