"""A decoder's last layer computes only the rows a step reads (``output_rows``): every row's keys and values are
written, but only the sampled rows' queries, residuals and MLP run there. The rows' hidden states equal the full
computation's, for the shared ``DecoderLayer`` and for Gemma 2's own layer (sliding window, soft-capping), in a step
mixing a cached prefix's new chunk, a decode row and a fresh prompt; and the engine asks for it on prompt steps."""

from __future__ import annotations

import pytest
import torch

from llmp import LLM, SamplingParams, registry
from llmp.api import AttentionMetadata
from llmp.testing import assert_greedy_parity, load_native_model, mixed_prompts, save_tiny_llama, save_tiny_model

BLOCK = 4


def model_of(path, architecture: str):
    from llmp_models_gemma import model as gemma
    from llmp_models_llama import model as llama

    module = gemma if architecture.startswith("Gemma") else llama
    model = load_native_model(getattr(module, architecture), path, registry.load_component("kernels", "torch")())
    for layer in model.attention_layers():
        shape = (32, BLOCK, layer.num_kv_heads, layer.head_dim)
        layer.kv_cache = (torch.zeros(shape), torch.zeros(shape))
    return model


def step(requests: list[tuple[list[int], int, int]]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A flattened step: per request (new token ids, tokens already cached, its first block); blocks of 4 slots
    allotted in order from its first."""
    ids, positions, slots, starts, seq_lens, tables = [], [], [], [0], [], []
    for new, cached, first_block in requests:
        ids += new
        positions += range(cached, cached + len(new))
        slots += [first_block * BLOCK + p for p in range(cached, cached + len(new))]
        starts.append(starts[-1] + len(new))
        seq_lens.append(cached + len(new))
        tables.append([first_block + b for b in range(8)])
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        max_query_len=max(len(new) for new, _, _ in requests),
        max_seq_len=max(seq_lens),
    )
    return torch.tensor(ids), torch.tensor(positions), metadata


@pytest.mark.parametrize(
    ("architecture", "config"),
    [
        ("LlamaForCausalLM", {}),
        (
            "Gemma2ForCausalLM",
            dict(
                head_dim=16,
                sliding_window=5,
                query_pre_attn_scalar=16,
                attn_logit_softcapping=2.0,
                final_logit_softcapping=30.0,
                hidden_activation="gelu_pytorch_tanh",
            ),
        ),
    ],
)
def test_the_last_layer_computes_only_the_read_rows_with_the_full_values(tmp_path, architecture, config):
    save_tiny_model(tmp_path, architecture, qk_scale=4.0, **config)
    model = model_of(tmp_path, architecture)
    last_mlp_rows = []
    model.model.layers[-1].mlp.register_forward_hook(lambda m, args, out: last_mlp_rows.append(args[0].shape[0]))
    # a first step caches request 0's 9-token prefix and request 1's 6-token prompt
    first = step([(list(range(10, 19)), 0, 0), (list(range(40, 46)), 0, 8)])
    with torch.no_grad():
        model(*first)
        # then request 0's next chunk of 5, request 1 decodes a token, request 2 is a fresh 7-token prompt
        ids, positions, metadata = step([(list(range(60, 65)), 9, 0), ([77], 6, 8), (list(range(80, 87)), 0, 16)])
        full = model(ids, positions, metadata)
        last_mlp_rows.clear()
        for rows in ([4, 5, 12], [0, 6, 7, 12], [3]):  # each request's last; a first row too; one row
            rows = torch.tensor(rows)
            only = model(ids, positions, metadata, output_rows=rows)
            torch.testing.assert_close(only, full[rows], atol=1e-5, rtol=1e-5)
    assert last_mlp_rows == [3, 4, 1]  # the other rows never reached the last layer's MLP
    assert full.std(0).min() > 1e-3  # the rows differ: the comparison means something


def test_the_engine_computes_a_prompt_steps_sampled_rows_alone(tmp_path):
    model = save_tiny_llama(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", block_size=BLOCK, kernels="torch", enable_prefix_caching=False)
    runner = llm.engine.executor.runner
    layers = runner.model.model.layers
    seen: list[tuple[int, int]] = []  # (rows into the first layer's MLP, rows into the last's) each step
    first: list[int] = []
    layers[0].mlp.register_forward_hook(lambda m, args, out: first.append(args[0].shape[0]))
    layers[-1].mlp.register_forward_hook(lambda m, args, out: seen.append((first.pop(), args[0].shape[0])))
    prompts = mixed_prompts(4, seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    assert_greedy_parity(model, prompts, got, max_tokens=12)
    assert seen[0] == (sum(len(p) for p in prompts), len(prompts)), seen[:3]  # the prompts' step: 4 rows sampled
    assert all(last == all_rows for all_rows, last in seen[1:]), seen  # decode steps: every row is sampled
