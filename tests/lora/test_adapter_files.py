"""A LoRA adapter's files to LoRAWeights (llmp.model_files.lora): PEFT's names onto llmp's fused modules,
the scaling folded into B, and every refusal typed (404 for a missing adapter, 400 for the rest) in vLLM's words."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from llmp.api import InvalidLoRAAdapterError, LoRAAdapterNotFoundError, RequestValidationError
from llmp.lora import LoRARequest
from llmp.model_files.lora import PeftLoRAConfig, load_lora_weights, read_peft_config, scaling
from llmp.modeling.layers import CausalLM
from llmp.modeling.lora import LoRATarget
from llmp.testing import LORA_TARGETS_ALL, TINY_DECODER, save_peft_lora, save_random_lora, save_tiny_model

ALL_TARGETS = (*LORA_TARGETS_ALL, "embed_tokens", "lm_head")


def model_targets(model_dir: Path) -> dict[str, LoRATarget]:
    """The full shapes of a native decoder's adaptable modules, on llmp's paths (fused qkv and gate_up)."""
    config = json.loads((model_dir / "config.json").read_text())
    hidden, heads, inter = config["hidden_size"], config["num_attention_heads"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config["num_key_value_heads"] * head_dim
    targets = {
        "model.embed_tokens": LoRATarget("embedding", config["vocab_size"], {"": hidden}),
        "lm_head": LoRATarget("lm_head", hidden, {"": config["vocab_size"]}),
    }
    for i in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{i}"
        targets[f"{prefix}.self_attn.qkv_proj"] = LoRATarget(
            "linear", hidden, {"q": heads * head_dim, "k": kv, "v": kv}
        )
        targets[f"{prefix}.self_attn.o_proj"] = LoRATarget("linear", heads * head_dim, {"": hidden})
        targets[f"{prefix}.mlp.gate_up_proj"] = LoRATarget("linear", hidden, {"gate": inter, "up": inter})
        targets[f"{prefix}.mlp.down_proj"] = LoRATarget("linear", inter, {"": hidden})
    return targets


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama")
    save_tiny_model(path, "LlamaForCausalLM")
    return path


def load(model_dir: Path, adapter: Path, *, max_rank: int = 16, dtype: torch.dtype = torch.float32, name: str = "a"):
    request = LoRARequest(name, 1, str(adapter))
    return load_lora_weights(request, 7, model_targets(model_dir), CausalLM.stacked_params, max_rank, dtype)


def rewrite_config(adapter: Path, **changes) -> None:
    config = json.loads((adapter / "adapter_config.json").read_text())
    config.update(changes)
    (adapter / "adapter_config.json").write_text(json.dumps(config))


def rewrite_tensors(adapter: Path, change) -> None:
    file = adapter / "adapter_model.safetensors"
    tensors = load_file(str(file))
    change(tensors)
    save_file(tensors, str(file))


def refused(model_dir: Path, adapter: Path, contains: str, **kwargs) -> InvalidLoRAAdapterError:
    with pytest.raises(InvalidLoRAAdapterError) as caught:
        load(model_dir, adapter, **kwargs)
    assert contains in str(caught.value), str(caught.value)
    assert str(caught.value).startswith("Loading lora a failed: ")
    assert caught.value.field == "model" and isinstance(caught.value, RequestValidationError)  # a 400
    return caught.value


# -- reading ----------------------------------------------------------------


def test_random_adapter_lands_on_fused_modules_with_scaling_in_b(llama, tmp_path):
    adapter = save_random_lora(llama, tmp_path / "a", rank=8, alpha=32, targets=ALL_TARGETS, seed=3)
    raw = load_file(str(adapter / "adapter_model.safetensors"))
    weights = load(llama, adapter)
    assert (weights.lora_id, weights.name, weights.rank) == (7, "a", 8)
    assert set(weights.modules) == set(model_targets(llama))
    qkv = weights.modules["model.layers.1.self_attn.qkv_proj"]
    assert set(qkv.a) == set(qkv.b) == {"q", "k", "v"}
    assert set(weights.modules["model.layers.0.mlp.gate_up_proj"].a) == {"gate", "up"}
    assert set(weights.modules["model.layers.0.mlp.down_proj"].a) == {""}
    peft = "base_model.model.model.layers.1.self_attn.k_proj"
    torch.testing.assert_close(qkv.a["k"], raw[f"{peft}.lora_A.weight"], rtol=0, atol=0)
    torch.testing.assert_close(qkv.b["k"], raw[f"{peft}.lora_B.weight"] * 4.0, rtol=0, atol=0)  # 32 / 8
    assert qkv.a["k"].shape == (8, 64) and qkv.b["k"].shape == (32, 8)  # 2 KV heads of 16
    embed = weights.modules["model.embed_tokens"]
    assert embed.a[""].shape == (8, 512) and embed.b[""].shape == (64, 8)
    torch.testing.assert_close(embed.b[""], raw["base_model.model.model.embed_tokens.lora_embedding_B"] * 4.0)
    head = weights.modules["lm_head"]
    assert head.a[""].shape == (8, 64) and head.b[""].shape == (512, 8)


def test_weights_are_cast_to_the_model_dtype_after_scaling_in_float32(llama, tmp_path):
    adapter = save_random_lora(llama, tmp_path / "a", rank=8, alpha=3)
    raw = load_file(str(adapter / "adapter_model.safetensors"))
    weights = load(llama, adapter, dtype=torch.bfloat16)
    module = weights.modules["model.layers.0.self_attn.o_proj"]
    assert module.a[""].dtype == module.b[""].dtype == torch.bfloat16
    expected = (raw["base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight"] * (3 / 8)).to(torch.bfloat16)
    assert torch.equal(module.b[""], expected)


def test_bare_base_model_names_and_a_fused_module(llama, tmp_path):
    # an adapter trained on LlamaModel (no "model." prefix) and one trained on a model whose checkpoint fuses qkv
    adapter = save_random_lora(llama, tmp_path / "a", targets=("q_proj", "k_proj", "v_proj", "embed_tokens"))

    def bare_and_fused(tensors):
        for key in list(tensors):
            tensors[key.replace("base_model.model.model.", "base_model.model.")] = tensors.pop(key)
        layer = "base_model.model.layers.0.self_attn"
        a = torch.cat([tensors.pop(f"{layer}.{p}.lora_A.weight") for p in ("q_proj", "k_proj", "v_proj")])[:8]
        b = torch.cat([tensors.pop(f"{layer}.{p}.lora_B.weight") for p in ("q_proj", "k_proj", "v_proj")])
        tensors[f"{layer}.qkv_proj.lora_A.weight"], tensors[f"{layer}.qkv_proj.lora_B.weight"] = a, b

    rewrite_tensors(adapter, bare_and_fused)
    weights = load(llama, adapter)
    assert set(weights.modules["model.layers.0.self_attn.qkv_proj"].a) == {"*"}
    assert weights.modules["model.layers.0.self_attn.qkv_proj"].b["*"].shape == (64 + 32 + 32, 8)
    assert set(weights.modules["model.layers.1.self_attn.qkv_proj"].a) == {"q", "k", "v"}
    assert "model.embed_tokens" in weights.modules


def test_an_adapter_in_adapter_model_bin(llama, tmp_path):
    adapter = save_random_lora(llama, tmp_path / "a", targets=("o_proj",))
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_model.safetensors").unlink()
    torch.save(tensors, adapter / "adapter_model.bin")
    assert set(load(llama, adapter).modules) == {"model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj"}


def test_peft_built_adapter_gives_peft_updates_module_by_module(tmp_path):
    pytest.importorskip("peft")
    model_dir = tmp_path / "qwen3"
    model = save_tiny_model(model_dir, "Qwen3ForCausalLM", head_dim=24)  # head_dim != hidden / heads
    peft_model = save_peft_lora(
        model,
        tmp_path / "a",
        rank=8,
        alpha=16,
        targets=ALL_TARGETS,
        seed=5,
        rank_pattern={"layers.1.mlp.down_proj": 4, "q_proj": 12},
        alpha_pattern={"model.layers.0.self_attn.v_proj": 5},
    )
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == model.config.name_or_path
    weights = load(model_dir, tmp_path / "a")
    assert weights.rank == 12
    x = torch.randn(5, 64)
    ids = torch.tensor([3, 17, 400, 9])
    checked = 0
    for name, module in peft_model.base_model.model.named_modules():
        if not hasattr(module, "base_layer"):
            continue
        peft_name = name
        short = peft_name.rsplit(".", 1)[-1]
        if short == "embed_tokens":
            with torch.no_grad():
                expected = module(ids) - module.base_layer(ids)
            lora = weights.modules["model.embed_tokens"]
            got = torch.nn.functional.embedding(ids, lora.a[""].T) @ lora.b[""].T
        else:
            inputs = x if module.base_layer.in_features == 64 else torch.randn(5, module.base_layer.in_features)
            with torch.no_grad():
                expected = module(inputs) - module.base_layer(inputs)
            path, shard = peft_name, ""
            for part, (fused, fused_shard) in CausalLM.stacked_params.items():
                if part in peft_name + ".":
                    path, shard = (peft_name + ".").replace(part, fused)[:-1], fused_shard
            lora = weights.modules[path]
            got = inputs @ lora.a[shard].T @ lora.b[shard].T
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4, msg=peft_name)
        checked += 1
    assert checked == 2 * 7 + 2


def test_peft_saved_embedding_copies_are_ignored_when_the_vocabulary_is_the_models(tmp_path):
    pytest.importorskip("peft")
    model_dir = tmp_path / "llama"
    model = save_tiny_model(model_dir, "LlamaForCausalLM")
    save_peft_lora(model, tmp_path / "a", targets=("embed_tokens", "lm_head"))
    keys = load_file(str(tmp_path / "a" / "adapter_model.safetensors"))
    assert "base_model.model.model.embed_tokens.base_layer.weight" in keys  # PEFT saved the copies
    assert set(load(model_dir, tmp_path / "a").modules) == {"model.embed_tokens", "lm_head"}


# -- scaling ------------------------------------------------------------------


def test_scaling_plain_rslora_and_patterns():
    plain = PeftLoRAConfig(r=8, lora_alpha=16, target_modules=("q_proj",))
    assert scaling(plain, "model.layers.0.self_attn.q_proj", 8) == 2.0
    rs = PeftLoRAConfig(r=16, lora_alpha=8, target_modules=("q_proj",), use_rslora=True)
    assert scaling(rs, "model.layers.0.self_attn.q_proj", 16) == 2.0
    assert scaling(rs, "model.layers.0.self_attn.q_proj", 4) == 4.0
    patterned = PeftLoRAConfig(
        r=8,
        lora_alpha=16,
        target_modules=("q_proj", "v_proj"),
        rank_pattern={"v_proj": 4},
        alpha_pattern={r"layers\.1\.self_attn\.q_proj": 4, "q_proj": 64, "roj": 1000},
    )
    assert scaling(patterned, "model.layers.0.self_attn.q_proj", 8) == 8.0  # "q_proj" matches, not the layer 1 key
    assert scaling(patterned, "model.layers.1.self_attn.q_proj", 8) == 0.5  # first match wins
    assert scaling(patterned, "model.layers.0.self_attn.v_proj", 4) == 4.0  # "roj" ends no name part: alpha 16
    assert patterned.max_rank == 8
    assert PeftLoRAConfig(r=8, lora_alpha=8, target_modules="all", rank_pattern={"q": 32}).max_rank == 32
    assert math.isclose(scaling(PeftLoRAConfig(r=3, lora_alpha=1, target_modules=()), "x", 3), 1 / 3)


def test_read_peft_config(llama, tmp_path):
    adapter = save_random_lora(
        llama, tmp_path / "a", rank=8, base_model_name="org/base", use_rslora=True, rank_pattern={"q_proj": 4}
    )
    cfg = read_peft_config(adapter, "a")
    assert (cfg.r, cfg.lora_alpha, cfg.use_rslora, cfg.base_model_name_or_path) == (8, 16.0, True, "org/base")
    assert cfg.rank_pattern == {"q_proj": 4} and set(cfg.target_modules) == set(LORA_TARGETS_ALL)


# -- refusals -------------------------------------------------------------------


def test_missing_adapter_is_not_found_in_vllms_words(llama, tmp_path):
    with pytest.raises(LoRAAdapterNotFoundError) as caught:
        load(llama, tmp_path / "nowhere", name="sql")
    assert str(caught.value) == f"Loading lora sql failed: No adapter found for {tmp_path / 'nowhere'}"
    (tmp_path / "empty").mkdir()
    with pytest.raises(LoRAAdapterNotFoundError, match="No adapter found for"):
        load(llama, tmp_path / "empty")
    assert not issubclass(LoRAAdapterNotFoundError, RequestValidationError)  # a 404, not a 400


def test_rank_above_max_lora_rank(llama, tmp_path):
    adapter = save_random_lora(llama, tmp_path / "a", rank=32)
    error = refused(llama, adapter, "LoRA rank 32 is greater than max_lora_rank 16.")
    assert str(error) == "Loading lora a failed: LoRA rank 32 is greater than max_lora_rank 16."
    assert load(llama, adapter, max_rank=32).rank == 32
    small = save_random_lora(llama, tmp_path / "b", rank=8, rank_pattern={"down_proj": 64})
    refused(llama, small, "LoRA rank 64 is greater than max_lora_rank 16.")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"use_dora": True}, "llmp does not yet support DoRA."),
        ({"modules_to_save": ["lm_head"]}, "llmp only supports modules_to_save being None."),
        ({"bias": "all"}, "Adapter bias is not supported."),
        ({"bias": "lora_only"}, "Adapter bias is not supported."),
        ({"lora_bias": True}, "Adapter bias is not supported."),
        ({"init_lora_weights": "pissa"}, "init_lora_weights='pissa'"),
        ({"init_lora_weights": "olora"}, "init_lora_weights='olora'"),
        ({"fan_in_fan_out": True}, "fan_in_fan_out"),
        ({"alora_invocation_tokens": [5, 6]}, "activated LoRA"),
        ({"layer_replication": [[0, 2], [1, 2]]}, "layer_replication"),
        ({"use_bdlora": {"block": 2}}, "BD-LoRA"),
        ({"use_qalora": True}, "QA-LoRA"),
        ({"trainable_token_indices": [3, 4]}, "trainable_token_indices"),
        ({"target_parameters": ["experts.gate_up_proj"]}, "target_parameters"),
        ({"peft_type": "IA3"}, "llmp serves LoRA adapters only"),
        ({"r": 0}, "LoRA rank `r` must be a positive integer, got 0."),
        ({"lora_alpha": "big"}, "lora_alpha must be a number"),
    ],
)
def test_refused_features(llama, tmp_path, changes, message):
    adapter = save_random_lora(llama, tmp_path / "a", **changes)
    refused(llama, adapter, message)


def test_refusals_are_reported_together(llama, tmp_path):
    adapter = save_random_lora(llama, tmp_path / "a", use_dora=True, bias="all")
    refused(llama, adapter, "llmp does not yet support DoRA. Adapter bias is not supported.")


def test_plain_initialisations_are_served(llama, tmp_path):
    for init in ("gaussian", False, True):
        adapter = save_random_lora(llama, tmp_path / str(init), init_lora_weights=init)
        assert load(llama, adapter).rank == 8


def test_missing_required_fields(llama, tmp_path):
    adapter = save_random_lora(llama, tmp_path / "a")
    config = json.loads((adapter / "adapter_config.json").read_text())
    del config["lora_alpha"]
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    refused(llama, adapter, "Missing required configuration fields: {'lora_alpha'}")


def test_corrupt_files_are_400_never_an_os_error(llama, tmp_path):
    adapter = save_random_lora(llama, tmp_path / "a")
    (adapter / "adapter_config.json").write_text("{not json")
    refused(llama, adapter, "is not valid JSON")
    (adapter / "adapter_config.json").write_text("[1, 2]")
    refused(llama, adapter, "is not a JSON object")

    adapter = save_random_lora(llama, tmp_path / "b")
    (adapter / "adapter_model.safetensors").write_bytes(b"\x00garbage" * 10)
    refused(llama, adapter, "cannot read")
    adapter = save_random_lora(llama, tmp_path / "c")
    data = (adapter / "adapter_model.safetensors").read_bytes()
    (adapter / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])  # truncated download
    refused(llama, adapter, "cannot read")
    adapter = save_random_lora(llama, tmp_path / "d")
    (adapter / "adapter_model.safetensors").unlink()
    refused(llama, adapter, "doesn't contain tensors")
    (adapter / "adapter_model.bin").write_bytes(b"not a pickle")
    refused(llama, adapter, "cannot read")


def test_modules_llmp_cannot_adapt(llama, tmp_path):
    adapter = save_random_lora(llama, tmp_path / "a", targets=("o_proj",))

    def add_expert(tensors):
        expert = "base_model.model.model.layers.0.mlp.experts.0.gate_proj"
        tensors[f"{expert}.lora_A.weight"], tensors[f"{expert}.lora_B.weight"] = torch.zeros(8, 64), torch.zeros(128, 8)

    rewrite_tensors(adapter, add_expert)
    error = refused(llama, adapter, "it targets modules llmp cannot adapt: model.layers.0.mlp.experts.0.gate_proj")
    assert "qkv_proj" in str(error)  # names what llmp adapts


def test_weights_other_than_lora_pairs(llama, tmp_path):
    adapter = save_random_lora(llama, tmp_path / "a", targets=("o_proj",))
    rewrite_tensors(adapter, lambda t: t.update({"base_model.model.score.weight": torch.zeros(2, 64)}))
    refused(llama, adapter, "a weight llmp cannot apply: score.weight")
    adapter = save_random_lora(llama, tmp_path / "b", targets=("o_proj",))
    magnitude = "base_model.model.model.layers.0.self_attn.o_proj.lora_magnitude_vector"
    rewrite_tensors(adapter, lambda t: t.update({magnitude: torch.ones(64)}))
    refused(llama, adapter, "lora_magnitude_vector")


def test_half_a_pair(llama, tmp_path):
    adapter = save_random_lora(llama, tmp_path / "a", targets=("o_proj",))
    rewrite_tensors(adapter, lambda t: t.pop("base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight"))
    refused(llama, adapter, "lacks the lora_B weight of model.layers.1.self_attn.o_proj")


def test_another_base_models_adapter_does_not_fit(llama, tmp_path):
    other = tmp_path / "other"
    save_tiny_model(other, "LlamaForCausalLM", hidden_size=32, intermediate_size=64)
    adapter = save_random_lora(other, tmp_path / "a")
    refused(llama, adapter, "does not fit the model (an adapter of another base model?)")
    wide = tmp_path / "wide"
    save_tiny_model(wide, "LlamaForCausalLM", num_key_value_heads=4)  # the same hidden size, more KV heads
    refused(llama, save_random_lora(wide, tmp_path / "b", targets=("k_proj",)), "shard k")
    unequal = save_random_lora(llama, tmp_path / "c", targets=("o_proj",))
    rewrite_tensors(
        unequal,
        lambda t: t.update({"base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight": torch.zeros(64, 4)}),
    )
    refused(llama, unequal, "are not one LoRA pair")


def test_extra_vocabulary_is_refused(llama, tmp_path):
    adapter = save_random_lora(llama, tmp_path / "a", targets=("embed_tokens",))
    copy = "base_model.model.model.embed_tokens.base_layer.weight"
    rewrite_tensors(adapter, lambda t: t.update({copy: torch.zeros(512, 64)}))
    assert set(load(llama, adapter).modules) == {"model.embed_tokens"}  # the model's own size: a copy
    rewrite_tensors(adapter, lambda t: t.update({copy: torch.zeros(520, 64)}))
    refused(llama, adapter, "llmp does not support extra vocabulary")
    adapter = save_random_lora(llama, tmp_path / "b", targets=("o_proj",))
    save_file({"x": torch.zeros(2, 64)}, str(adapter / "new_embeddings.safetensors"))
    refused(llama, adapter, "llmp does not support extra vocabulary")


def test_a_directory_copied_from_elsewhere_still_loads(llama, tmp_path):
    # nothing in the adapter ties it to the path it was written at (a resolver copies directories around)
    adapter = save_random_lora(llama, tmp_path / "a", base_model_name=str(TINY_DECODER["vocab_size"]))
    shutil.copytree(adapter, tmp_path / "moved")
    assert load(llama, tmp_path / "moved").rank == 8


def test_the_test_targets_are_the_models_own(llama):
    # model_targets above stands for llmp.modeling.lora.lora_targets of the native class, built on meta
    from llmp_kernels_torch.kernels import TorchKernels
    from llmp_models_llama.model import LlamaForCausalLM

    from llmp.model_files.config import load_plain_config
    from llmp.modeling.lora import lora_targets

    with torch.device("meta"):
        model = LlamaForCausalLM(load_plain_config(llama), TorchKernels())
    assert lora_targets(model) == model_targets(llama)
