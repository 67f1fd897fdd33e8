"""The model suite: a model plugin's architectures against transformers, on tiny random checkpoints.

For each architecture a ``ModelSpec`` names, the suite saves a tiny random checkpoint of it with
transformers (:mod:`llmp.conformance.tiny_models`) and checks, for a model that generates:

- greedy parity: a batch of prompts of mixed lengths gives transformers' greedy tokens;
- paged KV: blocks of 16 tokens, and chunked prefill, give the tokens of blocks of 4;
- prefix cache: a shared-prefix batch run again hits the cache and gives the same tokens;
- preemption: requests preempted for want of KV blocks and recomputed give the same tokens;
- tensor parallelism: 2 ranks under the ``mp`` executor give transformers' tokens, for a model that
  supports it (a native model built from ``llmp.modeling``'s tensor-parallel layers, unless its
  class says ``supports_tensor_parallel = False``).

A pooling model (``tasks`` embed or classify) is checked against transformers' hidden states or
logits instead. Options (``verify(name, **options)``):

- ``model_configs={"Arch": {...}}``: config settings of an architecture's tiny checkpoint, over the
  kit's own (:data:`~llmp.conformance.tiny_models.FAMILY_SETTINGS`). ``"reference": "LlamaForCausalLM"``
  names the transformers class whose checkpoint an architecture transformers lacks reads. A pattern
  record (``"*"``, ``"*ForSequenceClassification"``) is checked on the architectures named here that it
  serves, else on the kit's own (:data:`PATTERN_DEFAULTS`: GPT-2 for ``"*"``).
- ``tensor_parallel``: ``"first"`` (default: the first architecture of the plugin that supports it;
  each run starts two worker processes), ``"all"``, ``"none"``, or a list of architectures.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from llmp.api import ModelSpec
from llmp.conformance.runner import Check, Context, SkipCheck
from llmp.conformance.tiny_models import (
    TinyModel,
    first_divergence,
    once_or_raise,
    quiet,
    run_greedy,
    save_tiny_architecture,
)

__all__ = ["NEW_TOKENS", "suite"]

NEW_TOKENS = 8  # generated per prompt: enough for a wrong position or key to show, few enough to be cheap
SHARED_PREFIX = 16  # tokens (4 blocks of 4) every prompt of the prefix-cache batch starts with
TOLERANCE = dict(atol=1e-4, rtol=1e-4)  # float32 hidden states and logits against transformers'
# what a pattern record ("*" + suffix) is checked on when the options name no architecture it serves
PATTERN_DEFAULTS = (
    ("", "GPT2LMHeadModel"),  # learned positions, Conv1D projections: nothing a native plugin serves
    ("ForCausalLM", "GPTNeoXForCausalLM"),
    ("ForSequenceClassification", "ModernBertForSequenceClassification"),
)


def suite(spec: ModelSpec, context: Context) -> Iterator[Check]:
    configs: Mapping[str, Mapping[str, Any]] = context.options.get("model_configs") or {}
    if "*" in spec.name:
        named = [arch for arch in configs if "*" not in arch and fnmatch.fnmatchcase(arch, spec.name)]
        candidates = named or [arch for suffix, arch in PATTERN_DEFAULTS if spec.name == "*" + suffix]
        architectures = [arch for arch in candidates if _serves(spec, arch)]
        if not architectures:
            yield Check("parity with transformers", _skip(_pattern_reason(spec, candidates)))
            return
    else:
        architectures = [spec.name]
    for arch in architectures:
        checks = _ArchitectureChecks(spec, arch, context, configs.get(arch) or {})
        yield from checks.all()


def _serves(spec: ModelSpec, arch: str) -> bool:
    """Whether the pattern record ``spec`` is the one the registry selects for ``arch``."""
    from llmp import registry

    if "*" in arch or not fnmatch.fnmatchcase(arch, spec.name):
        return False
    try:
        chosen = registry.select_model([arch], spec.model_impl)
    except LookupError:
        return False
    return (chosen.plugin, chosen.name) == (spec.plugin, spec.name)


def _pattern_reason(spec: ModelSpec, candidates: list[str]) -> str:
    if candidates:  # named or the kit's own, but another record serves each of them
        served = ", ".join(candidates)
        return f"{spec.name!r} serves none of {served} (other records claim them): name others in model_configs"
    example = "My" + spec.name.lstrip("*")
    return (
        f"{spec.name!r} is a pattern, not an architecture: name the architectures to check it on, "
        f"verify(..., model_configs={{{example!r}: {{}}}})"
    )


def _skip(reason: str) -> Callable[[], None]:
    def run() -> None:
        raise SkipCheck(reason)

    return run


class _ArchitectureChecks:
    """The checks of one architecture; what several of them use is built once through the context."""

    def __init__(self, spec: ModelSpec, arch: str, context: Context, settings: Mapping[str, Any]) -> None:
        self.spec, self.arch, self.context, self.settings = spec, arch, context, settings
        self.label = "" if arch == spec.name else f" ({arch})"

    def all(self) -> Iterator[Check]:
        tasks = set(self.spec.tasks)
        if "generate" in tasks:
            yield self.check("greedy parity with transformers", self.greedy_parity)
            yield self.check("paged KV: blocks of 16 give the tokens of blocks of 4", self.block_size_invariance)
            yield self.check("paged KV: chunked prefill gives the same tokens", self.chunked_prefill)
            yield self.check("prefix cache: a repeated shared-prefix batch hits and agrees", self.prefix_cache)
            yield self.check("preemption: recomputed requests give the same tokens", self.preemption)
            yield self.check("tensor-parallel 2 parity with transformers (mp)", self.tensor_parallel)
        if "embed" in tasks:
            yield self.check("embeddings equal transformers' hidden states", self.embeddings)
        if "classify" in tasks:
            yield self.check("classifier logits and probabilities equal transformers'", self.classifier)
        if "reward" in tasks:
            yield self.check("rewards equal transformers'", self.rewards)

    def check(self, name: str, run: Callable[[], None]) -> Check:
        return Check(name + self.label, run)

    # -- what the checks share ------------------------------------------------------------------

    def once(self, what: str, build: Callable[[], Any]) -> Any:
        """``build()`` once per verify; a failure (a skip included) is kept and raised again."""
        return once_or_raise(self.context, f"model:{self.spec.plugin}:{self.spec.name}:{self.arch}:{what}", build)

    def tiny(self) -> TinyModel:
        directory = self.context.workdir / "models" / self.arch
        return self.once("checkpoint", lambda: save_tiny_architecture(directory, self.arch, self.settings))

    def engine_options(self, **options: Any) -> dict[str, Any]:
        return {"model_impl": self.spec.model_impl, **options}

    def prompts(self) -> list[list[int]]:
        return self.tiny().prompts(6)

    def reference_tokens(self) -> list[list[int]]:
        from llmp.testing import hf_greedy

        tiny = self.tiny()
        return self.once("reference", lambda: [hf_greedy(tiny.reference, p, NEW_TOKENS) for p in self.prompts()])

    def baseline(self) -> list[list[int]]:
        """llmp's tokens for the prompts: one batch, blocks of 4, no prefix cache."""

        def run() -> list[list[int]]:
            [result] = run_greedy(
                self.tiny().path, [self.prompts()], NEW_TOKENS, **self.engine_options(enable_prefix_caching=False)
            )
            served = (result.spec_plugin, result.spec_name)
            if served != (self.spec.plugin, self.spec.name):
                raise AssertionError(
                    f"the engine served {self.arch} with model {served[1]!r} of plugin {served[0]!r}, "
                    f"not this component ({self.spec.name!r} of {self.spec.plugin!r})"
                )
            return result.tokens

        return self.once("baseline", run)

    def assert_same(self, got: list[list[int]], expected: list[list[int]], what: str, against: str) -> None:
        message = first_divergence(self.prompts(), got, expected, what=what, against=against)
        if message:
            raise AssertionError(message)

    # -- generation ------------------------------------------------------------------------------

    def greedy_parity(self) -> None:
        self.assert_same(self.baseline(), self.reference_tokens(), "a batch of mixed lengths", "transformers")

    def block_size_invariance(self) -> None:
        options = self.engine_options(block_size=16, enable_prefix_caching=False)
        [result] = run_greedy(self.tiny().path, [self.prompts()], NEW_TOKENS, **options)
        self.assert_same(result.tokens, self.baseline(), "blocks of 16 tokens", "blocks of 4 tokens")

    def chunked_prefill(self) -> None:
        options = self.engine_options(max_num_batched_tokens=16, enable_prefix_caching=False)
        [result] = run_greedy(self.tiny().path, [self.prompts()], NEW_TOKENS, **options)
        if result.prefill_chunks == 0:
            raise AssertionError("no prompt was split into prefill chunks with max_num_batched_tokens=16")
        self.assert_same(result.tokens, self.baseline(), "chunked prefill (16-token steps)", "whole prompts")

    def prefix_cache(self) -> None:
        prompts = self.tiny().prompts(4, shared_prefix=SHARED_PREFIX, seed=2)
        first, second = run_greedy(self.tiny().path, [prompts, prompts], NEW_TOKENS, **self.engine_options())
        short = [(i, n) for i, n in enumerate(second.cached_tokens) if n < SHARED_PREFIX]
        if short or second.prefix_cache_hits <= first.prefix_cache_hits:
            raise AssertionError(
                f"the second run of a batch sharing a {SHARED_PREFIX}-token prefix did not hit the prefix cache: "
                f"cached prompt tokens per request {second.cached_tokens}, engine prefix-cache hits "
                f"{first.prefix_cache_hits} after the first run and {second.prefix_cache_hits} after the second"
            )
        message = first_divergence(
            prompts, second.tokens, first.tokens, what="the run from the prefix cache", against="the first run"
        )
        if message:
            raise AssertionError(message)

    def preemption(self) -> None:
        prompts = self.prompts()
        # room for the longest request alone, far from all of them at once
        max_model_len = -(-(max(map(len, prompts)) + NEW_TOKENS) // 4) * 4
        blocks = max_model_len // 4 + 2
        options = self.engine_options(num_kv_blocks=blocks, max_model_len=max_model_len, enable_prefix_caching=False)
        [result] = run_greedy(self.tiny().path, [prompts], NEW_TOKENS, **options)
        if result.preemptions == 0:
            raise SkipCheck(f"no request was preempted with {blocks} KV blocks (the scheduler kept them all)")
        self.assert_same(result.tokens, self.baseline(), f"with {result.preemptions} preemption(s)", "no preemption")

    def tensor_parallel(self) -> None:
        from llmp import registry

        reason = _tensor_parallel_unsupported(self.spec)
        if reason:
            raise SkipCheck(reason)
        if "mp" not in registry.components("executor"):
            raise SkipCheck("the mp executor plugin (llmp-executors-mp) is not installed")
        wanted = self.context.options.get("tensor_parallel", "first")
        if not (wanted in ("first", "all", "none", False, None) or isinstance(wanted, list | tuple | set)):
            raise AssertionError(f"tensor_parallel={wanted!r}: give 'first', 'all', 'none' or a list of architectures")
        if wanted in ("none", False, None):
            raise SkipCheck("tensor_parallel='none' was asked for")
        if wanted == "first":
            owner = self.context.once(f"tensor-parallel:{self.spec.plugin}", lambda: self.arch)
            if owner != self.arch:
                raise SkipCheck(
                    f"checked on {owner}, one architecture per verify (two worker processes each); "
                    "tensor_parallel='all' checks every one"
                )
        elif wanted != "all" and self.arch not in wanted:
            raise SkipCheck(f"not among tensor_parallel={list(wanted)!r}")
        options = self.engine_options(
            executor="mp", tensor_parallel_size=2, max_model_len=128, enable_prefix_caching=False
        )
        [result] = run_greedy(self.tiny().path, [self.prompts()], NEW_TOKENS, **options)
        self.assert_same(result.tokens, self.reference_tokens(), "tensor-parallel size 2", "transformers")

    # -- pooling ---------------------------------------------------------------------------------

    @contextmanager
    def pooling_engine(self, task: str) -> Iterator[Any]:
        """An ``LLM`` serving ``task`` (the record's, whatever else the architecture could do)."""
        from llmp import LLM

        with quiet():
            llm = LLM(str(self.tiny().path), **self.engine_options(dtype="float32", block_size=4, task=task))
            try:
                yield llm
            finally:
                llm.shutdown()

    def embeddings(self) -> None:
        import torch

        from llmp import PoolingParams

        tiny, prompts = self.tiny(), self.prompts()
        expected = [_hidden_states(tiny.reference, p) for p in prompts]
        with self.pooling_engine("embed") as llm:
            pooling = llm.engine.model.pooling
            inputs = [{"prompt_token_ids": p} for p in prompts]
            raw = PoolingParams(normalize=False)
            if "token_embed" in llm.engine.model.supported_tasks:
                rows = llm.encode(inputs, raw, pooling_task="token_embed", use_tqdm=False)
                for index, (out, ref) in enumerate(zip(rows, expected, strict=True)):
                    _assert_close(torch.as_tensor(out.outputs.data), ref, f"prompt {index}'s token states")
            pooled = llm.embed(inputs, raw, use_tqdm=False)
        poolers = {"last": lambda h: h[-1], "cls": lambda h: h[0], "mean": lambda h: h.mean(0)}
        pool = poolers.get(pooling.pooling_type if pooling else "")
        if pool is None:
            return  # another pooler: the token states above are what transformers can be compared on
        for index, (out, ref) in enumerate(zip(pooled, expected, strict=True)):
            what = f"prompt {index}'s embedding ({pooling.pooling_type} pooling)"
            _assert_close(torch.tensor(out.outputs.embedding), pool(ref), what)

    def classifier(self) -> None:
        import torch

        from llmp import PoolingParams
        from llmp.modeling.pooling import classify_activation

        tiny, prompts = self.tiny(), self.prompts()
        reference = tiny.reference
        with self.pooling_engine("classify") as llm:
            inputs = [{"prompt_token_ids": p} for p in prompts]
            raw = PoolingParams(use_activation=False)
            logits = llm.classify(inputs, pooling_params=raw, use_tqdm=False)
            probabilities = llm.classify(inputs, use_tqdm=False)
            token_rows = None
            base, head = getattr(reference, "base_model", None), getattr(reference, "score", None)
            if "token_classify" in llm.engine.model.supported_tasks and base is not None and head is not None:
                token_rows = llm.reward(inputs, pooling_params=raw, use_tqdm=False)
        activation = classify_activation(reference.config)  # vLLM's: softmax over several labels, sigmoid of one
        for index, (prompt, out, probs) in enumerate(zip(prompts, logits, probabilities, strict=True)):
            with torch.no_grad():
                expected = reference(torch.tensor([prompt])).logits[0]
            _assert_close(torch.tensor(out.outputs.probs), expected, f"prompt {index}'s logits")
            _assert_close(torch.tensor(probs.outputs.probs), activation(expected), f"prompt {index}'s probabilities")
        for index, (prompt, out) in enumerate(zip(prompts, token_rows or (), strict=False)):
            with torch.no_grad():
                expected = head(base(torch.tensor([prompt])).last_hidden_state)[0]
            _assert_close(torch.as_tensor(out.outputs.data), expected, f"prompt {index}'s per-token scores")

    def rewards(self) -> None:
        import torch

        from llmp import PoolingParams

        tiny, prompts = self.tiny(), self.prompts()  # skips, saying why, when transformers has no such class
        base, head = getattr(tiny.reference, "base_model", None), getattr(tiny.reference, "score", None)
        if base is None or head is None:
            raise SkipCheck(f"transformers' {self.arch} has no score head on a base model to compare rewards with")
        with self.pooling_engine("reward") as llm:
            inputs = [{"prompt_token_ids": p} for p in prompts]
            rows = llm.reward(inputs, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
        for index, (prompt, out) in enumerate(zip(prompts, rows, strict=True)):
            with torch.no_grad():
                expected = head(base(torch.tensor([prompt])).last_hidden_state)[0]
            _assert_close(torch.as_tensor(out.outputs.data), expected, f"prompt {index}'s per-token rewards")


def _tensor_parallel_unsupported(spec: ModelSpec) -> str | None:
    """Why the model does not run at tensor-parallel size 2, or None when it says it does."""
    from llmp.modeling.layers import CausalLM

    model_cls = spec.load()
    declared = getattr(model_cls, "supports_tensor_parallel", None)
    if declared is None:
        declared = spec.model_impl == "native" and isinstance(model_cls, type) and issubclass(model_cls, CausalLM)
    if declared:
        return None
    return (
        f"{getattr(model_cls, '__name__', spec.impl)} does not declare tensor-parallel support (a native "
        "llmp.modeling.layers.CausalLM does, or a class with supports_tensor_parallel = True)"
    )


def _hidden_states(reference: Any, prompt: list[int]) -> Any:
    import torch

    with torch.no_grad():
        return reference(torch.tensor([prompt])).last_hidden_state[0]


def _assert_close(got: Any, expected: Any, what: str) -> None:
    import torch

    expected = expected.float()
    if tuple(got.shape) != tuple(expected.shape):
        raise AssertionError(f"{what}: shape {tuple(got.shape)}, transformers gives {tuple(expected.shape)}")
    if not torch.allclose(got.float(), expected, **TOLERANCE):
        error = (got.float() - expected).abs()
        where = tuple(int(i) for i in torch.nonzero(error == error.max())[0])
        raise AssertionError(
            f"{what} differ from transformers': max abs error {error.max().item():.3g} at {where} "
            f"(got {got.flatten()[0:4].tolist()}..., expected {expected.flatten()[0:4].tolist()}...; "
            f"tolerance atol {TOLERANCE['atol']}, rtol {TOLERANCE['rtol']})"
        )
