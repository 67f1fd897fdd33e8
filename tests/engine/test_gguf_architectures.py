"""GGUF files of each architecture llmp converts: read as transformers reads them and served by the native model
plugin; a quantised file keeps the perplexity of transformers' float32 model of it; a file of another architecture
is refused from its header, before any tensor is read."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import pytest
import torch

from llmp import LLM, SamplingParams
from llmp.api import ModelLoadError
from llmp.model_files.gguf import GGUF_ARCHITECTURES
from llmp.registry import components
from llmp.testing import assert_greedy_parity, engine_greedy, mixed_prompts, save_tiny_gguf

TEXT = Path(__file__).parents[1] / "fixtures" / "perplexity_text.txt"
# save_tiny_gguf's architectures -> the model llmp serves each with. A Mistral model is a "llama" file (as llama.cpp
# writes it); transformers reads one named "mistral" as Mistral.
SERVED = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
}
QUANTISED = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
QK_SCALE = 4.0  # attention far from uniform: q and k rows out of place change the answers
WHOLE_K_BLOCKS = {"hidden_size": 256, "intermediate_size": 512}  # rows of whole 256-weight blocks: k-quantised


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LLMP_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def transformers_model(path: Path) -> torch.nn.Module:
    """Transformers' float32 model of the GGUF file at ``path``."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def test_the_architectures_are_those_transformers_reads_that_a_native_plugin_serves():
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    native = {name for name, spec in components("model").items() if spec.model_impl == "native"}
    readable = {MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) for model_type in GGUF_SUPPORTED_ARCHITECTURES}
    assert readable & native == set(SERVED.values())
    assert set(GGUF_ARCHITECTURES) == set(SERVED) - {"mistral"}


@pytest.mark.parametrize("architecture", SERVED)
def test_a_file_of_each_architecture_is_served_natively_greedy_as_transformers_reads_it(tmp_path, architecture):
    path = tmp_path / f"{architecture}.gguf"
    written = save_tiny_gguf(path, architecture=architecture, seed=5, qk_scale=QK_SCALE)
    prompts = mixed_prompts(3, seed=2)
    got, llm = engine_greedy(path, prompts, max_tokens=8)
    served = type(llm.engine.executor.runner.model)
    assert f"{served.__module__}:{served.__name__}" == components("model")[SERVED[architecture]].impl
    # gguf has no "mistral" tensor names, so transformers fails to load the file it reads as Mistral: the model
    # written (the same float32 numbers) is the reference
    reference = written if architecture == "mistral" else transformers_model(path)
    assert_greedy_parity(reference, prompts, got, max_tokens=8)


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


@pytest.mark.parametrize("architecture", ["phi3", "gemma"])
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
        f"GGUF file {path} has architecture {architecture!r}, which llmp does not convert; supported: llama, "
        "qwen2, qwen3, qwen3moe, gemma2 (a Mistral model is a llama file)"
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
