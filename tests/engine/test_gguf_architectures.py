"""GGUF files of each architecture llmp loads: read as transformers reads them and served by the native model
plugin; a quantised file keeps the perplexity of transformers' float32 model of it; its quantised matrices stay in
their blocks (read from the memory-mapped file, no converted copy), handed to a kernel set that computes from blocks
format by format, dequantised once for one that does not; a file of another architecture is refused from its
header, before any tensor is read."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import pytest
import torch
from llmp_kernels_torch.kernels import TorchKernels
from transformers import AutoTokenizer

from llmp import LLM, SamplingParams, hookimpl
from llmp.api import KernelSetSpec, ModelLoadError
from llmp.model_files.gguf import GGUF_ARCHITECTURES, READ_AS
from llmp.model_files.gguf_tensors import read_tensor_table
from llmp.model_files.lookup import find_model_dir
from llmp.model_files.weights import iter_weights
from llmp.quantization import QuantizedWeight, matmul_reference
from llmp.registry import components
from llmp.testing import assert_greedy_parity, engine_greedy, mixed_prompts, registered, save_tiny_gguf

TEXT = Path(__file__).parents[1] / "fixtures" / "perplexity_text.txt"
# save_tiny_gguf's architectures -> the model llmp serves each with. A Mistral model is a "llama" file (as llama.cpp
# writes it); transformers reads one named "mistral" as Mistral.
SERVED = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
}
# what transformers cannot read itself (llmp reads it with another architecture's tables: READ_AS): the model
# written is the reference
UNREADABLE = ("mistral", "gemma")
QUANTISED = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
QK_SCALE = 4.0  # attention far from uniform: q and k rows out of place change the answers
WHOLE_K_BLOCKS = {"hidden_size": 256, "intermediate_size": 512}  # rows of whole 256-weight blocks: k-quantised
Q = gguf.GGMLQuantizationType
MIXED = {"attn_v": Q.Q6_K, "ffn_down": Q.Q8_0, "attn_k": Q.Q5_0}  # as a Q4_K_M file mixes them, the rest Q4_K


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LLMP_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def transformers_model(path: Path) -> torch.nn.Module:
    """Transformers' float32 model of the GGUF file at ``path`` (its weights dequantised)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def test_the_architectures_are_those_transformers_reads_that_a_native_plugin_serves():
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    native = {name for name, spec in components("model").items() if spec.model_impl == "native"}
    readable = {MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) for model_type in GGUF_SUPPORTED_ARCHITECTURES}
    read_as = {SERVED[architecture] for architecture in READ_AS}
    assert not read_as & readable and set(READ_AS.values()) <= set(GGUF_SUPPORTED_ARCHITECTURES)
    assert readable & native | read_as == set(SERVED.values())
    assert set(GGUF_ARCHITECTURES) == set(SERVED) - {"mistral"}


@pytest.mark.parametrize("architecture", SERVED)
def test_a_file_of_each_architecture_is_served_natively_greedy_as_transformers_reads_it(tmp_path, architecture):
    path = tmp_path / f"{architecture}.gguf"
    written = save_tiny_gguf(path, architecture=architecture, seed=5, qk_scale=QK_SCALE)
    prompts = mixed_prompts(3, seed=2)
    got, llm = engine_greedy(path, prompts, max_tokens=8)
    served = type(llm.engine.executor.runner.model)
    assert f"{served.__module__}:{served.__name__}" == components("model")[SERVED[architecture]].impl
    # gguf has no "mistral" tensor names, so transformers fails to load the file it reads as Mistral, and it reads
    # no Gemma (1) file: the model written (the same float32 numbers) is the reference
    reference = written if architecture in UNREADABLE else transformers_model(path)
    assert_greedy_parity(reference, prompts, got, max_tokens=8)
    # the tokenizer is the one AutoTokenizer reads from the file (the class its config names, for Gemma (1))
    ours = llm.get_tokenizer()
    if architecture == "gemma":
        auto = type(ours).from_pretrained(path.parent, gguf_file=path.name)
        assert type(ours).__name__ == "GemmaTokenizer"
    else:
        auto = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    assert type(ours) is type(auto) and ours.get_vocab() == auto.get_vocab()
    if architecture not in (
        "gemma",
        "gemma2",
    ):  # Gemma's tokenizer saved and read back encodes the tiny byte-level vocabulary
        text = "The quick brown fox jumps over the lazy dog."  # otherwise (unknown tokens): a known gap
        assert ours(text).input_ids == auto(text).input_ids


@pytest.mark.parametrize("architecture", [*SERVED, "default"])
def test_the_config_read_from_the_header_is_the_one_transformers_reads(tmp_path, architecture):
    # llmp reads the config with its own header reader and transformers' mapping tables (transformers' reader
    # decodes the whole vocabulary first): the two must agree, key for key
    from transformers import AutoConfig

    from llmp.model_files.gguf import _transformers_config_dict, check_gguf_architecture
    from llmp.model_files.packaged import packaged_model
    from llmp.options import DEFAULT_MODEL

    if architecture == "default":
        path = packaged_model(DEFAULT_MODEL).location()
    else:
        path = tmp_path / f"tiny-{architecture}.gguf"
        written = save_tiny_gguf(path, architecture=architecture)
    if architecture in READ_AS:  # transformers reads no such file: what the header holds is the written model's
        read = _transformers_config_dict(path, check_gguf_architecture(path))
        config = written.config.to_dict()
        header = {"model_type", "max_position_embeddings", "hidden_size", "num_hidden_layers", "intermediate_size"}
        header |= {"num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings"}
        assert {key: read[key] for key in header} == {key: config[key] for key in header}
        assert read["rms_norm_eps"] == pytest.approx(config["rms_norm_eps"])  # written as float32
        assert read["rope_theta"] == config["rope_parameters"]["rope_theta"]
        return
    expected = AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict()
    read = _transformers_config_dict(path, check_gguf_architecture(path))
    ours = type(AutoConfig.from_pretrained(path.parent, gguf_file=path.name)).from_dict(read).to_dict()
    expected.pop("_name_or_path")  # where from_pretrained read it: llmp drops it
    assert ours == {**expected, "_name_or_path": ""}


@pytest.mark.parametrize("tensor_type", QUANTISED)
def test_a_quantised_file_has_the_perplexity_of_transformers_float32_model_of_it(tmp_path, tensor_type):
    quantised = gguf.GGMLQuantizationType[tensor_type]
    path = tmp_path / f"tiny-{tensor_type}.gguf"
    save_tiny_gguf(path, tensor_type=quantised, seed=7, **WHOLE_K_BLOCKS)
    assert {t.tensor_type for t in gguf.GGUFReader(path).tensors} == {gguf.GGMLQuantizationType.F32, quantised}
    llm = LLM(str(path), dtype="float32")
    ids = llm.get_tokenizer().encode(TEXT.read_text())
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    [output] = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)
    llmp_nll = -sum(entry[token].logprob for token, entry in zip(ids[1:], output.prompt_logprobs[1:], strict=True))
    with torch.no_grad():
        logits = transformers_model(path)(torch.tensor([ids])).logits[0, :-1].float()
    transformers_nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum").item()
    perplexities = [math.exp(nll / (len(ids) - 1)) for nll in (llmp_nll, transformers_nll)]
    assert perplexities[0] == pytest.approx(perplexities[1], rel=0.01), perplexities


@pytest.mark.parametrize("architecture", ["phi3", "falcon"])
def test_another_architecture_is_one_line_naming_it_and_the_supported_ones_from_the_header(
    tmp_path, cache, architecture
):
    path = tmp_path / f"{architecture}.gguf"
    save_tiny_gguf(path, architecture=architecture)
    with open(path, "r+b") as f:
        f.truncate(1024)  # the header's first key-value pairs and no tensor: a tensor read would fail
    with pytest.raises(ModelLoadError) as caught:
        LLM(str(path), dtype="float32")
    assert str(caught.value) == (
        f"GGUF file {path} has architecture {architecture!r}, which llmp does not load; supported: llama, "
        "qwen2, qwen3, qwen3moe, gemma, gemma2 (a Mistral model is a llama file)"
    )
    assert not cache.exists()  # nothing converted, nor the file hashed


def test_a_mixture_of_experts_llama_file_is_refused_before_its_tensors_are_read(tmp_path):
    path = tmp_path / "mixtral.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_expert_count(8)  # Mixtral's experts, which transformers does not read from a llama file
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"mixture-of-experts llama file \(Mixtral\), which llmp does not"):
        LLM(str(path), dtype="float32")


@pytest.mark.parametrize("architecture", ["llama", "qwen3", "gemma2"])
def test_quantised_matrices_come_in_their_blocks_and_are_the_numbers_transformers_reads(tmp_path, architecture):
    path = tmp_path / f"{architecture}.gguf"
    save_tiny_gguf(path, architecture=architecture, tensor_type=Q.Q4_K, tensor_types=MIXED, **WHOLE_K_BLOCKS)
    model_dir = find_model_dir(str(path))
    assert not list(model_dir.glob("*.safetensors"))  # no converted copy of the weights
    expected = transformers_model(path).state_dict()
    loaded = dict(iter_weights(model_dir, quantized=True))
    formats = {}
    for name, weight in loaded.items():
        if isinstance(weight, QuantizedWeight):
            formats[name] = weight.format.name
            assert torch.equal(weight.dequantize(), expected[name]), name  # llama's q/k rows back in place
        else:
            assert torch.equal(weight, expected[name]), name  # Gemma's norms less one
    layer = "model.layers.0."
    assert formats[layer + "self_attn.q_proj.weight"] == "Q4_K"
    assert formats[layer + "self_attn.k_proj.weight"] == "Q5_0"
    assert formats[layer + "self_attn.v_proj.weight"] == "Q6_K"
    assert formats[layer + "mlp.down_proj.weight"] == "Q8_0"
    # rows in file order are views of the memory-mapped file, no copy: as far apart in memory as in the file
    with open(path, "rb") as f:
        offsets = {t.name: t.offset for t in read_tensor_table(f.read())}
    v, down = (loaded[layer + name].blocks.data_ptr() for name in ("self_attn.v_proj.weight", "mlp.down_proj.weight"))
    assert v - down == offsets["blk.0.attn_v.weight"] - offsets["blk.0.ffn_down.weight"]


def test_a_mixture_of_experts_file_keeps_its_other_matrices_in_blocks_and_dequantises_its_experts(tmp_path):
    path = tmp_path / "qwen3moe.gguf"
    save_tiny_gguf(path, architecture="qwen3moe", tensor_type=Q.Q8_0, **WHOLE_K_BLOCKS)
    expected = transformers_model(path).state_dict()
    loaded = dict(iter_weights(find_model_dir(str(path)), quantized=True))
    experts = [name for name in loaded if ".experts." in name]
    assert experts and not any(isinstance(loaded[name], QuantizedWeight) for name in experts)
    blocks = {name for name, weight in loaded.items() if isinstance(weight, QuantizedWeight)}
    assert {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight"} <= blocks
    for name in blocks:
        assert torch.equal(loaded[name].dequantize(), expected[name]), name


def test_without_quantized_every_tensor_comes_dequantised(tmp_path):
    path = tmp_path / "q8.gguf"
    save_tiny_gguf(path, tensor_type=Q.Q8_0)
    weights = list(iter_weights(find_model_dir(str(path))))
    assert weights and all(isinstance(w, torch.Tensor) for _, w in weights)


class BlockKernels(TorchKernels):
    """The torch set computing Q4_K and Q6_K from their blocks (the reference matmul, each call); no other format."""

    name = "blocks"
    packed: list[tuple[str, int]] = []

    def pack_quantized(self, weight: QuantizedWeight) -> Callable[[torch.Tensor], torch.Tensor] | None:
        if weight.format.name not in ("Q4_K", "Q6_K"):
            return None
        BlockKernels.packed.append((weight.format.name, weight.out_features))
        return lambda x: matmul_reference(x, weight.blocks, weight.format)


class BlockKernelsPlugin:
    @hookimpl
    def llmp_register_kernels(self) -> Iterator[KernelSetSpec]:
        yield KernelSetSpec(name="blocks", impl=f"{__name__}:BlockKernels", devices=("cpu",))


def test_a_kernel_set_gets_each_formats_rows_and_greedy_output_is_transformers(tmp_path, caplog):
    path = tmp_path / "mixed.gguf"
    written = save_tiny_gguf(path, tensor_type=Q.Q4_K, tensor_types=MIXED, seed=3, qk_scale=4.0, **WHOLE_K_BLOCKS)
    prompts = mixed_prompts(3, seed=4)
    BlockKernels.packed.clear()
    with registered(BlockKernelsPlugin()), caplog.at_level("INFO", logger="llmp.engine"):
        got, llm = engine_greedy(path, prompts, max_tokens=8, kernels="blocks")
    config = written.config
    layers, kv_rows = config.num_hidden_layers, config.num_key_value_heads * config.head_dim
    # a fused q|k|v of Q4_K, Q5_0 and Q6_K rows: the set computes q's and v's blocks, k's rows are dequantised
    assert BlockKernels.packed.count(("Q6_K", kv_rows)) == layers
    assert BlockKernels.packed.count(("Q4_K", config.hidden_size)) == 2 * layers  # q (its own part), o
    assert ("Q5_0", kv_rows) not in BlockKernels.packed
    model = llm.engine.executor.runner.model
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.numel() == 0 and qkv.packed_row_invariant  # no dense copy, no row padding
    assert re.search(
        r"weights: [\d.]+ [KM]iB resident; quantised: \d+ Q4_K, \d+ Q6_K computed in their blocks by "
        "kernel set 'blocks'",
        caplog.text,
    ), caplog.text
    assert "dequantised to float32 (kernel set 'blocks' does not compute them)" in caplog.text
    assert_greedy_parity(transformers_model(path), prompts, got, max_tokens=8)


def test_the_start_up_line_names_the_files_quantisation(tmp_path, caplog):
    path = tmp_path / "q8.gguf"
    save_tiny_gguf(path, tensor_type=Q.Q8_0, file_type=7)
    with caplog.at_level("INFO", logger="llmp.engine"):
        LLM(str(path), dtype="float32")
    assert f"model {path} (GGUF Q8_0), dtype float32" in caplog.text


def test_a_truncated_file_is_one_line_naming_the_tensor(tmp_path):
    path = tmp_path / "q8.gguf"
    save_tiny_gguf(path, tensor_type=Q.Q8_0)
    model_dir = find_model_dir(str(path))
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)

    with pytest.raises(ModelLoadError, match=r"GGUF tensor \S+ runs past the end of the file: is it truncated\?"):
        list(iter_weights(model_dir, quantized=True))
