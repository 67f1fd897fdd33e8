"""Greedy parity of LoRA serving with transformers + PEFT, per model family: an adapter built with PEFT on the
tiny random model gives the same tokens in llmp as in PEFT (applied, and merged into the weights), and other
tokens than the base model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmp import LLM, LoRARequest, SamplingParams
from llmp.testing import LORA_TARGETS_ALL, hf_greedy, mixed_prompts, save_peft_lora, save_tiny_model

pytest.importorskip("peft")

MAX_TOKENS = 12
FAMILIES = [
    ("LlamaForCausalLM", {}),
    ("Qwen2ForCausalLM", {}),
    ("Qwen3ForCausalLM", {}),
    ("MistralForCausalLM", {}),
    ("GemmaForCausalLM", {"head_dim": 16}),
    ("Gemma2ForCausalLM", {"head_dim": 16, "query_pre_attn_scalar": 16}),
]


def peft_reference(
    tmp_path: Path, architecture: str, config: dict, *, targets=LORA_TARGETS_ALL, seed: int = 0, **lora
) -> tuple[Path, Path, list[list[int]], list[list[int]], list[list[int]]]:
    """The model and adapter directories, the prompts, and transformers' greedy tokens: base, then PEFT applied
    (checked equal to the merged model's)."""
    model_dir, adapter_dir = tmp_path / "model", tmp_path / "adapter"
    model = save_tiny_model(model_dir, architecture, qk_scale=4.0, **config)
    prompts = mixed_prompts(4, seed=seed + 1)[:3] + [[5, 6, 7, 8, 9, 10]]
    base = [hf_greedy(model, p, MAX_TOKENS) for p in prompts]
    peft_model = save_peft_lora(model, adapter_dir, targets=targets, seed=seed, **lora)
    applied = [hf_greedy(peft_model, p, MAX_TOKENS) for p in prompts]
    merged_model = peft_model.merge_and_unload()
    assert [hf_greedy(merged_model, p, MAX_TOKENS) for p in prompts] == applied
    assert applied != base, "the adapter changes nothing: the test would prove nothing"
    return model_dir, adapter_dir, prompts, base, applied


def llmp_greedy(llm: LLM, prompts: list[list[int]], lora: LoRARequest | None) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False, lora_request=lora)
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.mark.parametrize(("architecture", "config"), FAMILIES, ids=[f[0] for f in FAMILIES])
def test_family_parity_on_all_seven_projections(tmp_path, architecture, config):
    model_dir, adapter_dir, prompts, base, applied = peft_reference(tmp_path, architecture, config)
    llm = LLM(str(model_dir), dtype="float32", block_size=4, enable_lora=True)
    lora = LoRARequest("a", 1, str(adapter_dir))
    assert llmp_greedy(llm, prompts, lora) == applied
    assert llmp_greedy(llm, prompts, None) == base  # the base model's requests in the same engine


@pytest.mark.parametrize("architecture", ["MixtralForCausalLM", "Qwen3MoeForCausalLM"])
def test_mixture_of_experts_families_on_the_attention_projections(tmp_path, architecture):
    # the experts are not adaptable (an adapter naming them is refused); attention is, in every family
    model_dir, adapter_dir, prompts, base, applied = peft_reference(
        tmp_path, architecture, {}, targets=("q_proj", "k_proj", "v_proj", "o_proj"), seed=3
    )
    llm = LLM(str(model_dir), dtype="float32", block_size=4, enable_lora=True)
    assert llmp_greedy(llm, prompts, LoRARequest("a", 1, str(adapter_dir))) == applied
    assert llmp_greedy(llm, prompts, None) == base


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_embedding_and_lm_head_adapters(tmp_path, architecture):
    targets = (*LORA_TARGETS_ALL, "embed_tokens", "lm_head")
    model_dir, adapter_dir, prompts, _, applied = peft_reference(tmp_path, architecture, {}, targets=targets, seed=2)
    llm = LLM(str(model_dir), dtype="float32", block_size=4, enable_lora=True)
    assert llmp_greedy(llm, prompts, LoRARequest("a", 1, str(adapter_dir))) == applied


def test_rslora_and_rank_and_alpha_patterns(tmp_path):
    # rsLoRA scales by alpha / sqrt(r) per module rank; PEFT allows it beside rank_pattern with a warning
    model_dir, adapter_dir, prompts, _, applied = peft_reference(
        tmp_path,
        "Qwen3ForCausalLM",
        {},
        seed=3,
        rank=8,
        alpha=8,
        use_rslora=True,
        rank_pattern={"down_proj": 16, r"layers\.0\.self_attn\.q_proj": 4},
        alpha_pattern={"v_proj": 32},
    )
    llm = LLM(str(model_dir), dtype="float32", block_size=4, enable_lora=True, max_lora_rank=16)
    assert llmp_greedy(llm, prompts, LoRARequest("a", 1, str(adapter_dir))) == applied


def test_prompt_logprobs_through_an_lm_head_adapter(tmp_path):
    model_dir, adapter_dir = tmp_path / "model", tmp_path / "adapter"
    model = save_tiny_model(model_dir, "LlamaForCausalLM")
    peft_model = save_peft_lora(model, adapter_dir, targets=("q_proj", "v_proj", "lm_head"), seed=4)
    prompt = mixed_prompts(1, seed=7)[0]
    with torch.no_grad():
        reference = peft_model(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    llm = LLM(str(model_dir), dtype="float32", block_size=4, enable_lora=True)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    [output] = llm.generate(
        {"prompt_token_ids": prompt}, params, use_tqdm=False, lora_request=LoRARequest("a", 1, str(adapter_dir))
    )
    assert output.prompt_logprobs[0] is None
    for position, entry in enumerate(output.prompt_logprobs[1:], start=1):
        token = prompt[position]
        assert entry[token].logprob == pytest.approx(float(reference[position - 1, token]), abs=1e-4)
    [base] = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)
    assert base.prompt_logprobs[1][prompt[1]].logprob != pytest.approx(
        output.prompt_logprobs[1][prompt[1]].logprob, abs=1e-4
    )
