"""The serving stack's own cost: ``llmp serve`` on a model that costs nothing per step, beside a bare
FastAPI endpoint that streams the same chunks with no engine at all, under the same load in the same run.

    .venv/bin/python benchmarks/frontend_overhead.py [--num-prompts 256] [--concurrency 16]

The null model (``benchmarks/null_model``, a real plugin installed into a temporary directory) always
predicts one token, so every request generates exactly ``output_len`` tokens; what remains is HTTP,
JSON, tokenization, the engine loop, sampling and detokenization. The load generator is
``llmp bench serve``'s, in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llmp.cli.bench_cmd import BenchServeSettings, run_benchmark
from llmp.testing import free_port, pip_install_target, serving, tiny_tokenizer

HERE = Path(__file__).resolve().parent

BARE_APP = """
import json, sys, time
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
import uvicorn

app = FastAPI()

@app.get("/v1/models")
async def models():
    return {"object": "list", "data": [{"id": "bare", "object": "model"}]}

@app.post("/v1/completions")
async def completions(request: Request):
    body = await request.json()
    n = int(body.get("max_tokens", 16))
    created = int(time.time())

    async def chunks():
        for i in range(n):
            chunk = {"id": "cmpl-bare", "object": "text_completion", "created": created, "model": "bare",
                     "choices": [{"index": 0, "text": " the", "logprobs": None,
                                  "finish_reason": "length" if i == n - 1 else None}]}
            yield "data: " + json.dumps(chunk, separators=(",", ":")) + "\\n\\n"
        usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
        yield "data: " + json.dumps({"id": "cmpl-bare", "choices": [], "usage": usage}) + "\\n\\n"
        yield "data: [DONE]\\n\\n"

    return StreamingResponse(chunks(), media_type="text/event-stream")

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=False, log_level="warning")
"""


def null_model_dir(root: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    path = root / "null-model"
    path.mkdir()
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(path)
    token = tokenizer.convert_tokens_to_ids("Ġthe")
    config = {
        "architectures": ["NullForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(tokenizer),
        "hidden_size": 8,
        "intermediate_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "max_position_embeddings": 4096,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "null_token_id": token,
    }
    (path / "config.json").write_text(json.dumps(config))
    save_file({"unused": torch.zeros(1)}, str(path / "model.safetensors"))
    return path


async def load(base_url: str, num_prompts: int, concurrency: int, output_len: int) -> dict:
    settings = BenchServeSettings(
        url=base_url, num_prompts=num_prompts, max_concurrency=concurrency, input_len=16, output_len=output_len
    )
    return await run_benchmark(settings)


def measure(name: str, base_url: str, args: argparse.Namespace) -> dict[str, dict]:
    asyncio.run(load(base_url, min(32, args.num_prompts), args.concurrency, 4))  # warm-up
    out = {}
    for output_len in (1, args.output_len):
        report = asyncio.run(load(base_url, args.num_prompts, args.concurrency, output_len))
        assert report["failed"] == 0, report["first_error"]
        out[output_len] = report
        print(
            f"{name:>12}  output_len={output_len:<4} {report['request_throughput']:8.1f} req/s "
            f"{report['output_throughput']:9.1f} tok/s  median TTFT {report['median_ttft_ms']:7.1f} ms  "
            f"median ITL {report['median_itl_ms'] or 0:6.2f} ms",
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        site = root / "site"
        pip_install_target(site, HERE / "null_model")
        model = null_model_dir(root)
        port = free_port()
        bare = subprocess.Popen([sys.executable, "-c", BARE_APP, str(port)])
        try:
            _wait(f"http://127.0.0.1:{port}/v1/models")
            baseline = measure("bare FastAPI", f"http://127.0.0.1:{port}", args)
        finally:
            bare.terminate()
            bare.wait()
        env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
        with serving(model, "--disable-access-log", env=env) as server:
            ours = measure("llmp serve", server.url, args)
    print("\nllmp serve / bare FastAPI:")
    for output_len in baseline:
        b, o = baseline[output_len], ours[output_len]
        print(
            f"  output_len={output_len:<4} requests/s {o['request_throughput'] / b['request_throughput']:.2f}x, "
            f"tokens/s {o['output_throughput'] / b['output_throughput']:.2f}x"
        )


def _wait(url: str, timeout: float = 30) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


if __name__ == "__main__":
    main()
