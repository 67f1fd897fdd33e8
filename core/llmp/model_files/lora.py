"""A LoRA adapter's files, read and checked once: PEFT's ``adapter_config.json`` (:func:`read_peft_config`)
and ``adapter_model.safetensors`` (or ``adapter_model.bin``) turned into :class:`~llmp.modeling.lora.LoRAWeights`
on llmp's module paths (:func:`load_lora_weights`), with the scaling folded into B (:func:`scaling`).

Every refusal is typed: :class:`~llmp.api.LoRAAdapterNotFoundError` (a 404) when the directory or its config is
missing, :class:`~llmp.api.InvalidLoRAAdapterError` (a 400) for anything llmp will not serve, in vLLM's words
where vLLM has some. No ``OSError`` or safetensors error ever reaches the caller: the engine reads adapters
while admitting a request, and a bad file must fail that request only.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmp.api import InvalidLoRAAdapterError, LoRAAdapterNotFoundError
from llmp.modeling.lora import LoRATarget, LoRAWeights, ModuleLoRA

if TYPE_CHECKING:
    import torch

    from llmp.lora import LoRARequest

__all__ = ["PeftLoRAConfig", "load_lora_weights", "read_peft_config", "scaling"]

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
# PEFT's initialisations that leave a plain LoRA (the others rewrite the base weights: PiSSA, OLoRA, CorDA, LoftQ)
_PLAIN_INITS = ("gaussian", "eva", "orthogonal", "mica", "lora_ga")
# adapter_config.json fields whose adapters need more than y = Wx + s·BAx (PEFT's name -> what it is)
_UNSUPPORTED_FEATURES = {
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "layer_replication": "layer_replication",
    "use_bdlora": "BD-LoRA (use_bdlora)",
    "use_qalora": "QA-LoRA (use_qalora)",
    "trainable_token_indices": "trainable_token_indices",
    "target_parameters": "target_parameters (LoRA on parameters such as MoE experts)",
}
_LINEAR_KEY = re.compile(r"^(.*)\.(lora_A|lora_B)\.weight$")
_EMBEDDING_KEY = re.compile(r"^(.*)\.(lora_embedding_A|lora_embedding_B)$")
_BASE_LAYER_KEY = re.compile(r"^(.*)\.base_layer\.weight$")
# a bare base-model checkpoint's names (LlamaModel: no ``model.`` prefix), as llmp.modeling.decoder reads them
_BASE_MODEL_NAME = re.compile(r"^(embed_tokens|layers|norm)\.")
_PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class PeftLoRAConfig:
    """What llmp reads of an ``adapter_config.json`` (everything it refuses has been checked)."""

    r: int
    lora_alpha: float
    target_modules: tuple[str, ...] | str
    use_rslora: bool = False
    rank_pattern: Mapping[str, int] = field(default_factory=dict)
    alpha_pattern: Mapping[str, float] = field(default_factory=dict)
    base_model_name_or_path: str | None = None

    @property
    def max_rank(self) -> int:
        """The largest rank of any module (vLLM's check against ``--max-lora-rank``)."""
        return max([self.r, *self.rank_pattern.values()])


_HUB_ADAPTERS: dict[str, str] = {}  # Hub id -> its snapshot, once found: one adapter keeps one directory


def local_adapter_path(lora_path: str) -> str:
    """Where an adapter's files are: ``lora_path`` when it is on disk, else, for a Hub id
    (``org/name``), its snapshot in the Hugging Face cache, downloaded when not there and the Hub
    may be reached (vLLM's ``get_adapter_absolute_path``); else ``lora_path`` as given, which the
    read then reports as not found. A download blocks: engine clients call this off their event loop."""
    from llmp.model_files.hub import cached_snapshot, parse_hub_name

    if lora_path in _HUB_ADAPTERS:
        return _HUB_ADAPTERS[lora_path]
    if Path(lora_path).expanduser().exists():
        return lora_path
    name = parse_hub_name(lora_path)
    if name is None or name.tag is not None:
        return lora_path
    cached = cached_snapshot(name.repo_id, None)
    if cached is not None and (cached[1] / CONFIG_FILE).is_file():
        found = str(cached[1])
    else:
        from huggingface_hub import constants, snapshot_download

        if constants.is_offline_mode():
            return lora_path
        try:
            found = snapshot_download(name.repo_id, allow_patterns=[CONFIG_FILE, *WEIGHT_FILES])
        except Exception:  # noqa: BLE001 - no such repository, no network: the read says it is not found
            return lora_path
    _HUB_ADAPTERS[lora_path] = found
    return found


def read_peft_config(path: Path, name: str) -> PeftLoRAConfig:
    """The adapter at directory ``path`` (served as ``name``): its config read and every feature llmp
    cannot apply refused. ``LoRAAdapterNotFoundError`` without the directory or its ``adapter_config.json``,
    ``InvalidLoRAAdapterError`` for a config llmp will not serve."""
    config_file = Path(path) / CONFIG_FILE
    if not config_file.is_file():
        raise LoRAAdapterNotFoundError(f"Loading lora {name} failed: No adapter found for {path}")
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _invalid(name, f"{config_file} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _invalid(name, f"{config_file} is not a JSON object")
    return _checked_config(data, name)


def _checked_config(data: dict[str, Any], name: str) -> PeftLoRAConfig:
    peft_type = data.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise _invalid(name, f"the adapter is a {peft_type} adapter; llmp serves LoRA adapters only.")
    missing = {key for key in ("r", "lora_alpha", "target_modules") if key not in data}
    if missing:
        raise _invalid(name, f"Missing required configuration fields: {missing}")
    r, alpha = data["r"], data["lora_alpha"]
    if not _is_int(r) or r <= 0:
        raise _invalid(name, f"LoRA rank `r` must be a positive integer, got {r}.")
    if not _is_number(alpha):
        raise _invalid(name, f"lora_alpha must be a number, got {alpha!r}.")
    rank_pattern, alpha_pattern = data.get("rank_pattern") or {}, data.get("alpha_pattern") or {}
    if not isinstance(rank_pattern, dict) or not all(_is_int(v) and v > 0 for v in rank_pattern.values()):
        raise _invalid(name, f"rank_pattern must map module names to positive ranks, got {rank_pattern!r}.")
    if not isinstance(alpha_pattern, dict) or not all(_is_number(v) for v in alpha_pattern.values()):
        raise _invalid(name, f"alpha_pattern must map module names to numbers, got {alpha_pattern!r}.")
    refusals = []  # all of them at once, as vLLM joins its messages
    if data.get("modules_to_save"):
        refusals.append("llmp only supports modules_to_save being None.")
    if data.get("use_dora"):
        refusals.append("llmp does not yet support DoRA.")
    if data.get("bias", "none") != "none" or data.get("lora_bias"):
        refusals.append("Adapter bias is not supported.")
    init = data.get("init_lora_weights", True)
    if isinstance(init, str) and init not in _PLAIN_INITS:
        refusals.append(
            f"llmp does not support init_lora_weights={init!r}: such an adapter needs base weights changed with it."
        )
    if data.get("fan_in_fan_out"):
        refusals.append("llmp does not support fan_in_fan_out adapters (weights stored transposed, as GPT-2's Conv1D).")
    refusals += [f"llmp does not support {what}." for key, what in _UNSUPPORTED_FEATURES.items() if data.get(key)]
    if refusals:
        raise _invalid(name, " ".join(refusals))
    targets = data["target_modules"]
    return PeftLoRAConfig(
        r=r,
        lora_alpha=float(alpha),
        target_modules=targets if isinstance(targets, str) else tuple(targets or ()),
        use_rslora=bool(data.get("use_rslora")),
        rank_pattern=dict(rank_pattern),
        alpha_pattern={key: float(value) for key, value in alpha_pattern.items()},
        base_model_name_or_path=data.get("base_model_name_or_path"),
    )


def scaling(cfg: PeftLoRAConfig, module_name: str, rank: int) -> float:
    """The factor PEFT multiplies ``B @ A`` by for the module ``module_name`` (PEFT's own name, such as
    ``model.layers.0.self_attn.q_proj``) of rank ``rank``: ``alpha / rank``, or ``alpha / sqrt(rank)``
    with rsLoRA; ``alpha`` from the first ``alpha_pattern`` key the name ends with, as PEFT matches it."""
    alpha = cfg.alpha_pattern[key] if (key := _pattern_key(cfg.alpha_pattern, module_name)) else cfg.lora_alpha
    return alpha / math.sqrt(rank) if cfg.use_rslora else alpha / rank


def _pattern_key(patterns: Mapping[str, Any], module_name: str) -> str | None:
    """PEFT's ``get_pattern_key``: the first key that matches the end of the module name."""
    return next((key for key in patterns if re.match(rf"(.*\.)?({key})$", module_name)), None)


def load_lora_weights(
    request: LoRARequest,
    lora_id: int,
    targets: Mapping[str, LoRATarget],
    stacked_params: Mapping[str, tuple[str, str]],
    max_rank: int,
    dtype: torch.dtype,
) -> LoRAWeights:
    """Read the adapter of ``request`` for a model whose adaptable modules are ``targets`` (llmp module
    path -> full shapes, from ``llmp.modeling.lora.lora_targets``) and whose checkpoint names map onto fused
    modules by ``stacked_params`` (the model class's): A and B per module and shard, the scaling folded
    into B in float32, both cast to ``dtype``, on the CPU.

    Loading follows the weight file's keys: every ``lora_A``/``lora_B`` (``lora_embedding_A``/``_B``) pair
    must land on a target with the right shapes. ``LoRAAdapterNotFoundError`` when the adapter is not
    there, ``InvalidLoRAAdapterError`` for anything else (a rank above ``max_rank``, a feature or module
    llmp cannot apply, extra vocabulary, another base model's shapes, an unreadable file).
    """
    name = request.lora_name
    path = Path(request.lora_path).expanduser()
    cfg = read_peft_config(path, name)
    if cfg.max_rank > max_rank:
        raise _invalid(name, f"LoRA rank {cfg.max_rank} is greater than max_lora_rank {max_rank}.")
    if any((path / extra).exists() for extra in ("new_embeddings.safetensors", "new_embeddings.pt")):
        raise _invalid(name, "the adapter adds vocabulary (new_embeddings); llmp does not support extra vocabulary.")
    pairs: dict[tuple[str, str], dict[str, torch.Tensor]] = {}  # (llmp path, shard) -> {"A": A, "B": B}
    peft_names: dict[tuple[str, str], str] = {}
    for key, shape, tensor in _tensors(path, name):
        module, part = _split_key(key)
        if part is None:
            base = _BASE_LAYER_KEY.match(key)
            if base is None:
                raise _invalid(name, f"the adapter holds a weight llmp cannot apply: {key}.")
            _check_base_layer(name, key, shape, _place(base.group(1), targets, stacked_params, name, key)[0], targets)
            continue
        llmp_path, shard = _place(module, targets, stacked_params, name, key)
        target = targets[llmp_path]
        if (part in ("lora_embedding_A", "lora_embedding_B")) != (target.kind == "embedding"):
            raise _unfit(name, f"{key} is not a weight of a {target.kind} layer")
        slot = pairs.setdefault((llmp_path, shard), {})
        half = part[-1]  # "A" or "B"
        if half in slot:
            raise _invalid(name, f"the adapter holds two {half} weights for {llmp_path} (shard {shard or '-'}).")
        slot[half] = tensor
        peft_names[(llmp_path, shard)] = module
    if not pairs:
        raise _invalid(name, "the adapter holds no LoRA weights.")
    modules: dict[str, ModuleLoRA] = {}
    rank = 0
    for (llmp_path, shard), slot in pairs.items():
        if "A" not in slot or "B" not in slot:
            missing = "lora_B" if "A" in slot else "lora_A"
            raise _invalid(name, f"the adapter lacks the {missing} weight of {peft_names[(llmp_path, shard)]}.")
        a, b = _checked_pair(name, targets[llmp_path], llmp_path, shard, slot["A"], slot["B"])
        r = a.shape[0]
        if r > max_rank:
            raise _invalid(name, f"LoRA rank {r} is greater than max_lora_rank {max_rank}.")
        rank = max(rank, r)
        factor = scaling(cfg, peft_names[(llmp_path, shard)], r)
        weights = modules.setdefault(llmp_path, ModuleLoRA())
        weights.a[shard] = a.to(dtype).contiguous()
        weights.b[shard] = (b.float() * factor).to(dtype).contiguous()
    for llmp_path, weights in modules.items():
        if "*" in weights.a and len(weights.a) > 1:
            raise _invalid(name, f"the adapter adapts {llmp_path} both fused and by its parts.")
    return LoRAWeights(lora_id=lora_id, name=name, rank=rank, modules=modules)


def _tensors(path: Path, name: str) -> list[tuple[str, tuple[int, ...], torch.Tensor | None]]:
    """``(key, shape, tensor)`` of every tensor in the adapter's weight file, PEFT's prefix stripped; the
    tensor of a ``base_layer`` copy (a whole embedding) is not read: None."""
    file = next((path / f for f in WEIGHT_FILES if (path / f).is_file()), None)
    if file is None:
        raise _invalid(name, f"{path} doesn't contain tensors ({' or '.join(WEIGHT_FILES)}).")
    try:
        if file.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(file), framework="pt") as f:
                return [
                    (_strip(key), tuple(f.get_slice(key).get_shape()), None if _is_copy(key) else f.get_tensor(key))
                    for key in f.keys()
                ]
        import torch

        state = torch.load(file, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
            raise ValueError("not a dictionary of tensors")
        return [(_strip(key), tuple(t.shape), t) for key, t in state.items()]
    except Exception as exc:  # a corrupt file: safetensors' and pickle's errors have no stable names
        raise _invalid(name, f"cannot read {file}: {exc}") from None


def _is_copy(key: str) -> bool:
    return _BASE_LAYER_KEY.match(key) is not None


def _strip(key: str) -> str:
    return key.removeprefix(_PEFT_PREFIX)


def _split_key(key: str) -> tuple[str, str | None]:
    """``(PEFT module name, lora_A | lora_B | lora_embedding_A | lora_embedding_B)``, or ``(key, None)``."""
    match = _LINEAR_KEY.match(key) or _EMBEDDING_KEY.match(key)
    return (match.group(1), match.group(2)) if match else (key, None)


def _place(
    module: str, targets: Mapping[str, LoRATarget], stacked_params: Mapping[str, tuple[str, str]], name: str, key: str
) -> tuple[str, str]:
    """``(llmp module path, shard)`` of a PEFT module name: ``q_proj`` -> ``(qkv_proj, "q")`` by the model's
    ``stacked_params``; a module the model itself fuses (``qkv_proj`` in the adapter) is shard ``"*"``."""
    dotted = ("model." + module if _BASE_MODEL_NAME.match(module + ".") else module) + "."
    llmp_path, shard = dotted, ""
    for part, (fused, fused_shard) in stacked_params.items():
        if part in dotted:
            llmp_path, shard = dotted.replace(part, fused), fused_shard
            break
    llmp_path = llmp_path[:-1]
    target = targets.get(llmp_path)
    if target is None:
        raise _invalid(
            name, f"it targets modules llmp cannot adapt: {module} ({key}); llmp adapts {_target_kinds(targets)}."
        )
    if not shard and set(target.shards) != {""}:
        shard = "*"  # trained on the fused module itself
    if shard not in target.shards and shard != "*":
        raise _unfit(name, f"{module} is not a part of {llmp_path}")
    return llmp_path, shard


def _target_kinds(targets: Mapping[str, LoRATarget]) -> str:
    """The distinct adaptable module names (``qkv_proj, o_proj, ...``) for an error message."""
    names = dict.fromkeys(path.rsplit(".", 1)[-1] for path in targets)
    return ", ".join(names) or "nothing in this model"


def _check_base_layer(
    name: str, key: str, shape: tuple[int, ...], llmp_path: str, targets: Mapping[str, LoRATarget]
) -> None:
    """PEFT saves an adapted embedding's or LM head's own weight beside its LoRA; the same shape as the
    model's is a copy to ignore, another one is extra vocabulary (which vLLM dropped in 0.12)."""
    target = targets[llmp_path]
    if target.kind == "linear":
        raise _invalid(name, f"the adapter holds a weight llmp cannot apply: {key}.")
    vocab, hidden = (
        (target.in_features, target.shards[""])
        if target.kind == "embedding"
        else (target.shards[""], target.in_features)
    )
    if shape != (vocab, hidden):
        raise _invalid(
            name,
            f"the adapter changes the vocabulary ({key} is {list(shape)}, the model's {[vocab, hidden]}); "
            "llmp does not support extra vocabulary.",
        )


def _checked_pair(
    name: str, target: LoRATarget, llmp_path: str, shard: str, a: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``[r, in]`` and B ``[out, r]`` as the target needs them (an embedding's are stored the same way:
    A ``[r, vocab]``, B ``[hidden, r]``)."""
    out = sum(target.shards.values()) if shard == "*" else target.shards[shard]
    if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or a.shape[0] == 0:
        raise _invalid(name, f"{llmp_path}: A {list(a.shape)} and B {list(b.shape)} are not one LoRA pair.")
    if a.shape[1] != target.in_features or b.shape[0] != out:
        where = llmp_path + (f" (shard {shard})" if shard not in ("", "*") else "")
        raise _unfit(
            name,
            f"{where} needs A [r, {target.in_features}] and B [{out}, r], "
            f"the adapter has {list(a.shape)} and {list(b.shape)}",
        )
    if not (a.is_floating_point() and b.is_floating_point()):
        raise _invalid(name, f"{llmp_path}: the LoRA weights are not floating point ({a.dtype}, {b.dtype}).")
    return a, b


def _invalid(name: str, reason: str) -> InvalidLoRAAdapterError:
    return InvalidLoRAAdapterError("model", f"Loading lora {name} failed: {reason}")


def _unfit(name: str, detail: str) -> InvalidLoRAAdapterError:
    return _invalid(name, f"the adapter does not fit the model (an adapter of another base model?): {detail}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
