"""LoRA under tensor parallelism: two real worker processes (mp executor, gloo) each hold their
slices of every adapter (q/k/v and gate/up shards, o/down input columns, the LM head's vocabulary
rows; a replicated KV head; a vocabulary the ranks do not divide) and give the tokens one rank
gives, for the base model and three adapters in one batch."""

from __future__ import annotations

from llmp import LLM, LoRARequest, SamplingParams
from llmp.testing import LORA_TARGETS_ALL, mixed_prompts, save_random_lora, save_tiny_model


def test_tensor_parallel_adapters_give_the_tokens_of_one_rank(tmp_path):
    model_dir = tmp_path / "model"
    save_tiny_model(model_dir, "LlamaForCausalLM", seed=11, qk_scale=4.0, num_key_value_heads=1, vocab_size=511)
    targets = (*LORA_TARGETS_ALL, "embed_tokens", "lm_head")
    adapters = [
        LoRARequest(
            f"a{i}", i + 1, str(save_random_lora(model_dir, tmp_path / f"a{i}", rank=8, targets=targets, seed=i))
        )
        for i in range(3)
    ]
    prompts = [{"prompt_token_ids": p} for p in mixed_prompts(4, seed=11, vocab=400)]
    loras = [None, *adapters]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

    def run(**options: object) -> list[list[int]]:
        llm = LLM(
            str(model_dir), dtype="float32", block_size=4, enable_lora=True, max_loras=3, max_model_len=128, **options
        )
        try:
            outputs = llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
            base = llm.generate(prompts, params, use_tqdm=False)
        finally:
            llm.shutdown()
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        base_tokens = [list(o.outputs[0].token_ids) for o in base]
        assert tokens[0] == base_tokens[0]
        assert all(t != b for t, b in zip(tokens[1:], base_tokens[1:], strict=True)), "an adapter changed nothing"
        return tokens

    one_rank = run()
    assert run(executor="mp", tensor_parallel_size=2) == one_rank
