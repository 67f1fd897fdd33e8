"""The engine's device: ``--device`` resolved once with one-line refusals, sampling where the logits
are (only tokens and logprobs come back), KV-cache sizing from measured GPU memory, and the padded
static buffers that CUDA graphs replay, run eagerly on every device present."""

from __future__ import annotations

import pytest
import torch

from llmp.api import DeviceError
from llmp.engine.decode_graphs import default_graph_sizes
from llmp.engine.device import kv_cache_blocks, rank_device, resolve_device
from llmp.options import EngineConfig
from llmp.testing import assert_greedy_parity, engine_greedy, mixed_prompts, save_tiny_llama

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def _greedy_params():
    from llmp import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


SAME_GREEDY = _greedy_params()  # engine_greedy's parameters


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("device-llama")
    return path, save_tiny_llama(path)


# -- resolution and refusals ---------------------------------------------------------------------


def test_auto_is_cuda_when_torch_sees_a_gpu_else_cpu():
    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto", "bfloat16").partition(":")[0] == expected.partition(":")[0]
    assert resolve_device("cpu", "bfloat16") == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_gpu_is_one_line(device):
    with pytest.raises(DeviceError) as caught:
        resolve_device(device, "bfloat16")
    message = str(caught.value)
    assert "\n" not in message and f"--device {device}" in message and "--device cpu" in message


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "cpu:0", "cuda:", "auto:1", ""])
def test_a_malformed_device_is_refused_naming_the_field(value):
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N"):
        EngineConfig(device=value)


@pytest.mark.parametrize("value", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_well_formed_devices_are_taken(value):
    assert EngineConfig(device=value).device == value


def test_the_cli_refuses_a_bad_device_in_one_line():
    from llmp.testing import run_llmp

    result = run_llmp("serve", "--device", "tpu", check=False)
    assert result.returncode == 2, result.stderr
    assert "--device" in result.stderr and "auto, cpu, cuda or cuda:N" in result.stderr


def test_rank_devices():
    assert rank_device("cpu", 1, 2) == "cpu"
    if torch.cuda.device_count() < 2:
        return
    assert rank_device("cuda:0", 1, 2) == "cuda:1"


def test_kv_cache_blocks_from_measured_memory():
    gib = 1 << 30
    # 0.9 of 80 GiB = 72; 16 used, 4 of activations: 52 GiB of 2 MiB blocks
    assert kv_cache_blocks(80 * gib, 16 * gib, 4 * gib, 0.9, 2 << 20) == 52 * 512
    with pytest.raises(DeviceError, match="the model does not fit") as caught:
        kv_cache_blocks(24 * gib, 20 * gib, 2 * gib, 0.9, 2 << 20)
    assert "\n" not in str(caught.value)


def test_default_graph_sizes():
    assert default_graph_sizes(256) == [1, 2, 4, *range(8, 257, 8)]
    assert default_graph_sizes(20) == [1, 2, 4, 8, 16, 24]
    assert default_graph_sizes(1) == [1]
    assert default_graph_sizes(1000)[-1] == 256


def test_new_engine_options_are_checked():
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(gpu_memory_utilization=0)
    with pytest.raises(ValueError, match="cuda_graph_sizes"):
        EngineConfig(cuda_graph_sizes=(4, 0))


# -- the engine on each device present -----------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_parity_and_the_engine_reports_its_device(tiny, device):
    path, model = tiny
    prompts = mixed_prompts(6, shared_prefix=9)
    got, llm = engine_greedy(path, prompts, device=device)
    assert_greedy_parity(model, prompts, got)
    assert llm.engine.info.device.partition(":")[0] == device
    assert llm.engine.executor.runner.device.type == device


@pytest.mark.parametrize("device", DEVICES)
def test_padded_static_decode_buffers_give_the_same_tokens(tiny, device):
    """The buffers a CUDA graph replays, run eagerly: 5 requests in a size-8 step (3 spare rows that
    write nothing), 2 in a size-2 one, block tables of every width; the tokens equal transformers'."""
    from llmp import SamplingParams

    path, model = tiny
    prompts = mixed_prompts(5, shared_prefix=5, seed=3)
    options = {"extra": {"static_decode_buffers": True}, "cuda_graph_sizes": (2, 8), "max_model_len": 128}
    got, llm = engine_greedy(path, prompts, device=device, **options)
    assert_greedy_parity(model, prompts, got)
    graphs = llm.engine.executor.runner.graphs
    assert graphs is not None and graphs.sizes == [2, 8]
    assert graphs.steps_by_size.get(8, 0) > 0, graphs.steps_by_size
    pair = mixed_prompts(2, seed=5)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in pair], params, use_tqdm=False)
    assert_greedy_parity(model, pair, [o.outputs[0].token_ids for o in outputs])
    assert graphs.steps_by_size.get(2, 0) > 0, graphs.steps_by_size
    # and a batch above the largest size runs without them
    more = mixed_prompts(11, seed=4)
    got, _ = engine_greedy(path, more, device=device, **options)
    assert_greedy_parity(model, more, got)


@pytest.mark.parametrize("device", DEVICES)
def test_sampling_runs_on_the_device_and_returns_tokens_and_logprobs(tiny, device):
    from llmp import SamplingParams

    path, _ = tiny
    _, llm = engine_greedy(path, [[5, 6, 7]], max_tokens=1, device=device)
    params = [
        SamplingParams(temperature=0.0, max_tokens=6, logprobs=3, prompt_logprobs=2, ignore_eos=True),
        SamplingParams(
            temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, seed=11, max_tokens=6, logprobs=1, ignore_eos=True
        ),
        SamplingParams(
            temperature=1.0,
            repetition_penalty=1.3,
            presence_penalty=0.5,
            frequency_penalty=0.2,
            max_tokens=6,
            logit_bias={7: 5.0},
            ignore_eos=True,
        ),
    ]
    prompts = [{"prompt_token_ids": [9, 10, 11, 12]}] * 3
    first = llm.generate(prompts, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in first] == [6, 6, 6]
    greedy = first[0].outputs[0]
    assert len(greedy.logprobs) == 6 and all(len(entry) >= 3 for entry in greedy.logprobs)
    chosen = [entry[token].rank for entry, token in zip(greedy.logprobs, greedy.token_ids, strict=True)]
    assert chosen == [1] * 6  # greedy: the most likely token each time
    assert len(first[0].prompt_logprobs) == 4 and first[0].prompt_logprobs[0] is None
    # a seeded request repeats alone and beside others
    again = llm.generate(prompts[1:2], params[1:2], use_tqdm=False)
    assert again[0].outputs[0].token_ids == first[1].outputs[0].token_ids


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without a GPU")
def test_serve_on_cuda_without_a_gpu_exits_with_one_line():
    from llmp.testing import run_llmp

    result = run_llmp("serve", "--device", "cuda", check=False, timeout=120)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("llmp: error")]
    assert len(errors) == 1 and "--device cuda: no usable GPU" in errors[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize("device", DEVICES)
def test_the_largest_batch_pass_of_the_memory_profile_runs_and_leaves_the_cache_alone(tiny, device):
    """The forward pass a GPU's memory profile measures (max_num_batched_tokens over up to max_num_seqs
    sequences, on a temporary cache), on each device; the engine's own cache and answers are untouched."""
    path, model = tiny
    prompts = mixed_prompts(3, seed=8)
    got, llm = engine_greedy(path, prompts, device=device, max_num_batched_tokens=300, max_num_seqs=7)
    runner = llm.engine.executor.runner
    cache = runner.kv_caches[0][0]
    temporary = runner.run_largest_batch()
    assert temporary == runner.bytes_per_block() * 7 * -(-43 // 4)  # 300 tokens: 7 sequences of 42 or 43
    assert runner.kv_caches[0][0] is cache and runner.model.attention_layers()[0].kv_cache[0] is cache
    again = llm.generate([{"prompt_token_ids": p} for p in prompts], SAME_GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == got
    assert_greedy_parity(model, prompts, got)
    if device == "cuda":
        profile = runner.profile_memory()
        assert 0 < profile["used"] < profile["total"] and profile["activations"] > 0
    else:
        with pytest.raises(ValueError, match="CUDA"):
            runner.profile_memory()


@pytest.mark.parametrize("device", DEVICES)
def test_prompt_logprobs_of_a_long_prompt_equal_transformers_across_slices(tiny, device):
    """Prompt logprobs are gathered on the device in slices of rows (PROMPT_LOGPROB_ROWS): a 300-token
    prompt crosses a slice boundary; every position's logprob and rank match transformers'."""
    from llmp import SamplingParams
    from llmp.engine.model_runner import PROMPT_LOGPROB_ROWS

    path, model = tiny
    prompt = mixed_prompts(1, shared_prefix=PROMPT_LOGPROB_ROWS + 40, seed=9)[0]
    _, llm = engine_greedy(path, [prompt[:4]], max_tokens=1, device=device)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=2)
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    with torch.no_grad():
        table = model(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for position in range(1, len(prompt)):
        entry = out.prompt_logprobs[position][prompt[position]]
        expected = table[position - 1]
        assert abs(entry.logprob - float(expected[prompt[position]])) < 1e-3, position
        assert entry.rank == int((expected > expected[prompt[position]]).sum()) + 1, position
