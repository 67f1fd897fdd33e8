"""Pooling tasks inside one engine: the pooler registry, the activations, and real engines serving
pooling requests next to (and in the same steps as) generation requests."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from llmp import AsyncLLM, PoolingParams, SamplingParams
from llmp.api import PoolingConfig
from llmp.engine.llm_engine import LLMEngine
from llmp.engine.model_runner import PoolItem, prepare_inputs
from llmp.engine.request import Request
from llmp.engine.scheduler import ScheduledRequest, SchedulerOutput
from llmp.model_files.resolve import resolve_model
from llmp.modeling.pooling import (
    POOLERS,
    PoolSlice,
    classify_activation,
    num_labels,
    register_pooler,
    score_activation,
)
from llmp.options import EngineConfig
from llmp.outputs import ClassificationOutput, EmbeddingOutput, PoolingOutput, RequestOutput, ScoringOutput
from llmp.testing import hf_greedy, minilm_dir, save_tiny_llama, save_tiny_model, tiny_tokenizer

MINILM = minilm_dir()
TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market crashed today."]


def run(engine: LLMEngine) -> dict[str, object]:
    """Step the engine until it is idle; the last output of every request."""
    outputs = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.request_id] = output
    return outputs


# -- poolers ---------------------------------------------------------------------


def test_poolers_equal_a_plain_python_reference():
    torch.manual_seed(0)
    hidden = torch.randn(20, 8)
    input_ids = torch.randint(0, 5, (20,))
    # gaps between the slices: the rows of generation requests in the same step
    slices = [PoolSlice(0, 5, 3), PoolSlice(5, 1, 3), PoolSlice(9, 7, 3), PoolSlice(17, 3, None)]

    def tagged(s):
        rows = [hidden[r] for r in range(s.start, s.start + s.count) if s.step_tag_id in (None, int(input_ids[r]))]
        return torch.stack(rows) if rows else hidden.new_zeros(0, 8)

    expected = {
        "cls": [hidden[s.start] for s in slices],
        "last": [hidden[s.start + s.count - 1] for s in slices],
        "mean": [sum(hidden[r] for r in range(s.start, s.start + s.count)) / s.count for s in slices],
        "all": [torch.stack([hidden[r] for r in range(s.start, s.start + s.count)]) for s in slices],
        "step": [tagged(s) for s in slices],
    }
    for name, want in expected.items():
        got = POOLERS[name](hidden, input_ids, slices)
        assert len(got) == len(want), name
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, msg=name)


def test_activations_follow_vllm():
    logits1, logits3 = torch.tensor([0.3]), torch.tensor([1.0, -2.0, 0.5])
    plain = SimpleNamespace()
    torch.testing.assert_close(classify_activation(plain)(logits1), torch.sigmoid(logits1))
    torch.testing.assert_close(classify_activation(plain)(logits3), torch.softmax(logits3, -1))
    regression = SimpleNamespace(problem_type="regression")
    torch.testing.assert_close(classify_activation(regression)(logits3), logits3)
    multi_label = SimpleNamespace(problem_type="multi_label_classification")
    torch.testing.assert_close(classify_activation(multi_label)(logits3), torch.sigmoid(logits3))

    def st(name):
        return SimpleNamespace(sentence_transformers={"activation_fn": name})

    torch.testing.assert_close(score_activation(plain)(logits1), torch.sigmoid(logits1))
    torch.testing.assert_close(score_activation(st("torch.nn.modules.linear.Identity"))(logits1), logits1)
    torch.testing.assert_close(score_activation(st("torch.nn.modules.activation.Sigmoid"))(logits1), logits1.sigmoid())
    torch.testing.assert_close(score_activation(st("torch.nn.modules.activation.Tanh"))(logits1), logits1.tanh())
    legacy = SimpleNamespace(sbert_ce_default_activation_function="torch.nn.modules.linear.Identity")
    torch.testing.assert_close(score_activation(legacy)(logits1), logits1)
    with pytest.raises(ValueError, match="not a torch.nn.modules class"):
        score_activation(st("os.system"))

    assert num_labels(SimpleNamespace(id2label={0: "a", 1: "b", 2: "c"}, num_labels=2)) == 3
    assert num_labels(SimpleNamespace(num_labels=1)) == 1
    assert num_labels(SimpleNamespace()) == 2
    assert num_labels(SimpleNamespace(classifier_from_token=["no", "yes"], method="from_2_way_softmax")) == 1
    assert num_labels(SimpleNamespace(classifier_from_token=["no", "yes"], is_original_qwen3_reranker=True)) == 1
    assert num_labels(SimpleNamespace(classifier_from_token=["a", "b", "c"], id2label={0: "x", 1: "y"})) == 3


def test_prepare_inputs_keeps_pooling_rows_apart_and_builds_token_types():
    pair = Request(
        "pair",
        [5, 6, 7, 8],
        SamplingParams(max_tokens=1),
        pooling_params=PoolingParams(task="classify"),
        pooling_task="classify",
        pooler="cls",
        whole_prompt=True,
        token_type_ids=[0, 0, 1, 1],
    )
    chat = Request("chat", [9, 10, 11], SamplingParams())
    pair.block_ids, chat.block_ids = [0], [1]
    out = SchedulerOutput([ScheduledRequest(chat, 0, 3), ScheduledRequest(pair, 0, 4)])
    inputs = prepare_inputs(out, block_size=4)
    assert inputs.logit_rows == [2]  # only the generation request is sampled
    assert inputs.pool_items == [PoolItem(1, "classify", "cls", PoolSlice(3, 4, None))]
    assert inputs.token_type_ids.tolist() == [0, 0, 0, 0, 0, 1, 1]
    inputs = prepare_inputs(SchedulerOutput([ScheduledRequest(chat, 0, 3)]), block_size=4)
    assert inputs.token_type_ids is None and inputs.pool_items == []


# -- an embedding model (an encoder: no KV cache) ----------------------------------


@pytest.fixture(scope="module")
def minilm() -> LLMEngine:
    # declared Matryoshka (any size), so `dimensions` may cut it: vLLM refuses it for a model without
    matryoshka = {"is_matryoshka": True}
    config = EngineConfig(
        model=str(MINILM), dtype="float32", max_num_batched_tokens=64, max_model_len=64, hf_overrides=matryoshka
    )
    return LLMEngine(config, resolve_model(config))


def hf_token_states(texts: list[str]) -> list[torch.Tensor]:
    from transformers import AutoModel, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(MINILM), AutoModel.from_pretrained(MINILM).eval()
    with torch.no_grad():
        return [model(**tokenizer(t, return_tensors="pt")).last_hidden_state[0] for t in texts]


def test_one_encoder_engine_embeds_and_token_embeds(minilm):
    assert minilm.info.options["supported_tasks"] == ["embed", "token_embed", "score"]
    assert minilm.info.options["score_mode"] == "bi-encoder"
    assert minilm.config.enable_prefix_caching  # no longer turned off for the whole engine
    for i, text in enumerate(TEXTS):
        minilm.add_request(f"e{i}", text, pooling_params=PoolingParams())
        minilm.add_request(f"t{i}", text, pooling_params=PoolingParams(task="token_embed", dimensions=16))
    minilm.add_request("again", TEXTS[0], pooling_params=PoolingParams(task="embed", normalize=False))
    # vLLM 0.32's spelling of the same: use_activation is an embedding's normalisation
    minilm.add_request("raw", TEXTS[0], pooling_params=PoolingParams(task="embed", use_activation=False))
    outputs = run(minilm)
    states = hf_token_states(TEXTS)
    for i, rows in enumerate(states):
        embedding, tokens = outputs[f"e{i}"].outputs, outputs[f"t{i}"].outputs
        assert isinstance(embedding, EmbeddingOutput) and isinstance(tokens, PoolingOutput)
        mean = rows.mean(0)
        torch.testing.assert_close(torch.tensor(embedding.embedding), mean / mean.norm(), atol=1e-5, rtol=0)
        want = torch.nn.functional.normalize(rows[:, :16], dim=-1)  # cut, then normalised, row by row
        torch.testing.assert_close(tokens.data, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(outputs["again"].outputs.embedding), states[0].mean(0), atol=1e-5, rtol=0)
    assert outputs["raw"].outputs.embedding == outputs["again"].outputs.embedding
    # mean pooling never reuses cached blocks: the repeated text was computed again
    assert minilm.kv_manager.prefix_cache_hits == 0
    assert all(o.num_cached_tokens == 0 for o in outputs.values())


def test_bad_pooling_requests_are_refused_with_one_line(minilm):
    name = minilm.model.name
    with pytest.raises(ValueError, match=f"the model {name} cannot do task 'classify'; it supports embed, token_embed"):
        minilm.add_request("x", "hi", pooling_params=PoolingParams(task="classify"))
    with pytest.raises(ValueError, match="cosine of their embeddings"):
        minilm.add_request("x", "hi", pooling_params=PoolingParams(task="score"))
    with pytest.raises(ValueError, match="cannot generate text; it supports embed"):
        minilm.add_request("x", "hi", SamplingParams())
    with pytest.raises(ValueError, match="task 'embed' does not take returned_token_ids"):
        minilm.add_request("x", "hi", pooling_params=PoolingParams(returned_token_ids=[0]))
    with pytest.raises(ValueError, match="use_activation and normalize disagree"):
        minilm.add_request("x", "hi", pooling_params=PoolingParams(use_activation=False, normalize=True))
    with pytest.raises(ValueError, match=r"dimensions must be in the model's range \[1, 384\], got 999"):
        minilm.add_request("x", "hi", pooling_params=PoolingParams(dimensions=999))
    long = " ".join(["word"] * 100)
    with pytest.raises(ValueError, match="the input is 102 tokens long; this model takes at most 64"):
        minilm.add_request("x", long, pooling_params=PoolingParams())
    with pytest.raises(ValueError, match=r"truncate_prompt_tokens \(65\) must be <= max_model_len \(64\)"):
        minilm.add_request("x", long, pooling_params=PoolingParams(truncate_prompt_tokens=65))
    assert not minilm.has_unfinished_requests()


def test_truncation_keeps_the_last_tokens(minilm):
    ids = minilm.tokenizer.encode(TEXTS[1])
    minilm.add_request("cut", {"prompt_token_ids": ids}, pooling_params=PoolingParams(truncate_prompt_tokens=5))
    minilm.add_request("tail", {"prompt_token_ids": ids[-5:]}, pooling_params=PoolingParams())
    minilm.add_request("all", " ".join(["word"] * 100), pooling_params=PoolingParams(truncate_prompt_tokens=-1))
    outputs = run(minilm)
    assert outputs["cut"].prompt_token_ids == ids[-5:]
    # the same 5 tokens; other rows share the step, and an encoder's matmuls may round differently by batch
    torch.testing.assert_close(
        torch.tensor(outputs["cut"].outputs.embedding), torch.tensor(outputs["tail"].outputs.embedding)
    )
    assert len(outputs["all"].prompt_token_ids) == 64


def test_abort_a_pooling_request(minilm):
    minilm.add_request("gone", TEXTS[0], pooling_params=PoolingParams())
    minilm.add_request("kept", TEXTS[1], pooling_params=PoolingParams(task="token_embed"))
    assert minilm.abort_request("gone") == []
    assert minilm.scheduler.num_waiting == 1
    outputs = run(minilm)
    assert list(outputs) == ["kept"] and not minilm.pooling


def test_a_registered_pooler_serves_requests():
    @register_pooler("max")
    def pool_max(hidden, input_ids, slices):
        return [hidden[s.start : s.start + s.count].max(0).values for s in slices]

    try:
        config = EngineConfig(model=str(MINILM), dtype="float32", max_model_len=64)
        record = dataclasses.replace(resolve_model(config), pooling=PoolingConfig("max", False))
        engine = LLMEngine(config, record)
        engine.add_request("m", TEXTS[2], pooling_params=PoolingParams())
        got = torch.tensor(run(engine)["m"].outputs.embedding)
        torch.testing.assert_close(got, hf_token_states(TEXTS[2:])[0].max(0).values, atol=1e-5, rtol=0)
    finally:
        del POOLERS["max"]
    record = dataclasses.replace(record, pooling=PoolingConfig("max", False))
    engine = LLMEngine(config, record)
    with pytest.raises(ValueError, match="pools with 'max', which no plugin registered"):
        engine.add_request("m", TEXTS[2], pooling_params=PoolingParams())


def test_async_encode_rebuilds_each_output_type():
    engine = AsyncLLM(str(MINILM), dtype="float32", engine_mode="thread", hf_overrides={"is_matryoshka": True})

    async def one(text: str, params: PoolingParams):
        return [o async for o in engine.encode(text, params)]

    async def main():
        results = await asyncio.gather(
            one(TEXTS[0], PoolingParams()), one(TEXTS[0], PoolingParams(task="token_embed", dimensions=8))
        )
        with pytest.raises(ValueError, match="cannot do task 'classify'"):
            await one(TEXTS[0], PoolingParams(task="classify"))
        return results

    try:
        [[embedded], [tokens]] = asyncio.run(main())
    finally:
        engine.shutdown()
    assert isinstance(embedded.outputs, EmbeddingOutput) and len(embedded.outputs.embedding) == 384
    assert isinstance(tokens.outputs, PoolingOutput) and embedded.finished
    assert len(tokens.outputs.data) == len(embedded.prompt_token_ids) and len(tokens.outputs.data[0]) == 8


# -- a causal LM: generation and pooling in the same steps ----------------------------


class Recorder:
    """A stat logger keeping what the engine tells it."""

    def __init__(self) -> None:
        self.steps, self.finished = [], []

    def record_step(self, stats) -> None:
        self.steps.append(stats)

    def record_finished(self, stats) -> None:
        self.finished.append(stats)


def test_generation_and_pooling_share_steps_and_prefix_caching_follows_the_pooler(tmp_path):
    model = save_tiny_llama(tmp_path, seed=3)
    config = EngineConfig(
        model=str(tmp_path), dtype="float32", block_size=4, max_model_len=128, max_num_batched_tokens=48
    )
    # a causal LM that also embeds (the last token's state) and returns every token's state
    record = dataclasses.replace(resolve_model(config), supported_tasks=("generate", "embed", "token_embed"))
    engine = LLMEngine(config, record)
    recorder = Recorder()
    engine.stat_loggers.loggers.append(("recorder", recorder))
    prefix = list(range(10, 30))  # five full blocks
    chats = [[5, 6, 7, 8, 9], [40, 41, 42]]
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    for i, prompt in enumerate(chats):
        engine.add_request(f"chat{i}", {"prompt_token_ids": prompt}, greedy)
    engine.add_request("last", {"prompt_token_ids": prefix + [50, 51]}, pooling_params=PoolingParams())
    engine.add_request("rows", {"prompt_token_ids": prefix + [60]}, pooling_params=PoolingParams(task="token_embed"))
    first = engine.step()
    kinds = {type(o).__name__ for o in first}
    assert kinds == {"RequestOutput", "PoolingRequestOutput"}  # one forward pass served both
    outputs = {o.request_id: o for o in first} | run(engine)
    # pooling requests are counted as any other: their prompt tokens, and their end with no generated token
    assert recorder.steps[0].num_prompt_tokens == 5 + 3 + 22
    finished = {s.request_id: s for s in recorder.finished}
    assert set(finished) == {"chat0", "chat1", "last", "rows"}
    assert finished["last"].num_prompt_tokens == 22 and finished["last"].num_generation_tokens == 0
    assert finished["chat0"].num_generation_tokens == 6

    with torch.no_grad():

        def states(ids):
            return model.model(torch.tensor([ids])).last_hidden_state[0]

        for i, prompt in enumerate(chats):
            assert isinstance(outputs[f"chat{i}"], RequestOutput)
            assert outputs[f"chat{i}"].outputs[0].token_ids == hf_greedy(model, prompt, 6)
        torch.testing.assert_close(
            torch.tensor(outputs["last"].outputs.embedding), states(prefix + [50, 51])[-1], atol=1e-4, rtol=1e-4
        )
        torch.testing.assert_close(outputs["rows"].outputs.data, states(prefix + [60]), atol=1e-4, rtol=1e-4)

        # "last" on a causal LM keeps prefix caching; "all" (every row) never reuses blocks
        engine.add_request("again", {"prompt_token_ids": prefix + [52]}, pooling_params=PoolingParams())
        hits = engine.kv_manager.prefix_cache_hits
        again = run(engine)["again"]
        assert again.num_cached_tokens == 20 and engine.kv_manager.prefix_cache_hits == hits + 20
        torch.testing.assert_close(
            torch.tensor(again.outputs.embedding), states(prefix + [52])[-1], atol=1e-4, rtol=1e-4
        )
        engine.add_request(
            "rows2", {"prompt_token_ids": prefix + [61]}, pooling_params=PoolingParams(task="token_embed")
        )
        assert run(engine)["rows2"].num_cached_tokens == 0 and engine.kv_manager.prefix_cache_hits == hits + 20

        # a "last"-pooled prompt longer than a step's budget is chunked; an "all" one is refused
        long = [(7 * i) % 400 + 3 for i in range(100)]
        engine.add_request("long", {"prompt_token_ids": long}, pooling_params=PoolingParams())
        torch.testing.assert_close(
            torch.tensor(run(engine)["long"].outputs.embedding), states(long)[-1], atol=1e-4, rtol=1e-4
        )
        assert engine.scheduler.num_prefill_chunks >= 2
    with pytest.raises(ValueError, match="the input is 100 tokens long; this model takes at most 48"):
        engine.add_request("x", {"prompt_token_ids": long}, pooling_params=PoolingParams(task="token_embed"))


def save_tiny_reranker(path) -> tuple[torch.nn.Module, int, int]:
    """A tiny Qwen3ForCausalLM whose tokenizer has "no" and "yes" tokens (an LLM reranker)."""
    model = save_tiny_model(path, "Qwen3ForCausalLM", seed=9, qk_scale=4.0, head_dim=16)
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["no", "yes"])
    tokenizer.save_pretrained(path)
    return model, tokenizer.convert_tokens_to_ids("no"), tokenizer.convert_tokens_to_ids("yes")


def test_generate_and_score_in_one_step_on_an_llm_reranker(tmp_path):
    model, no, yes = save_tiny_reranker(tmp_path)
    overrides = {"classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": True}
    config = EngineConfig(model=str(tmp_path), dtype="float32", block_size=4, max_model_len=128, hf_overrides=overrides)
    engine = LLMEngine(config, resolve_model(config))
    options = engine.info.options
    assert {"generate", "classify", "score"} <= set(options["supported_tasks"])
    assert options["num_labels"] == 1 and options["use_sep_token"] is False  # scored as one text, not a pair
    assert engine.default_pooling_task == "classify"
    shared = list(range(100, 124))  # a shared system prompt and query: six full blocks
    documents = [shared + [30 + i, 31 + i, 32 + i] for i in range(4)]
    greedy = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    engine.add_request("chat", {"prompt_token_ids": [5, 6, 7]}, greedy)
    engine.add_request("doc0", {"prompt_token_ids": documents[0]}, pooling_params=PoolingParams(task="score"))
    first = {o.request_id: o for o in engine.step()}
    assert set(first) == {"chat", "doc0"}
    for i, doc in enumerate(documents[1:], 1):
        engine.add_request(f"doc{i}", {"prompt_token_ids": doc}, pooling_params=PoolingParams(task="score"))
    engine.add_request("raw", {"prompt_token_ids": documents[0]}, pooling_params=PoolingParams(use_activation=False))
    outputs = first | run(engine)
    assert outputs["chat"].outputs[0].token_ids == hf_greedy(model, [5, 6, 7], 5)
    with torch.no_grad():
        for i, doc in enumerate(documents):
            logits = model(torch.tensor([doc])).logits[0, -1]
            margin = (logits[yes] - logits[no]).item()
            assert isinstance(outputs[f"doc{i}"].outputs, ScoringOutput)
            assert outputs[f"doc{i}"].outputs.score == pytest.approx(
                torch.sigmoid(torch.tensor(margin)).item(), abs=1e-4
            )
            if i:  # "last" pooling on a causal LM: the shared prefix computed for doc0 is reused
                assert outputs[f"doc{i}"].num_cached_tokens == 24
        logits = model(torch.tensor([documents[0]])).logits[0, -1]
    assert isinstance(outputs["raw"].outputs, ClassificationOutput)  # the default task: classify
    assert outputs["raw"].outputs.probs == [pytest.approx((logits[yes] - logits[no]).item(), abs=1e-4)]


@pytest.mark.parametrize(
    ("overrides", "dimensions", "refusal"),
    [
        ({}, 64, r"dimensions must be unset: the model does not support Matryoshka embeddings \(received 64\)"),
        ({"matryoshka_dimensions": [64, 128]}, 100, r"one of the model's Matryoshka sizes \[64, 128\], got 100"),
        ({"matryoshka_dimensions": [64, 128]}, 64, None),
    ],
)
def test_dimensions_follow_the_models_matryoshka_sizes(overrides, dimensions, refusal):
    # vLLM's rule: a model not trained to be cut refuses `dimensions`; one that lists its sizes takes only those
    config = EngineConfig(model=str(MINILM), dtype="float32", max_model_len=64, hf_overrides=overrides)
    engine = LLMEngine(config, resolve_model(config))
    assert engine.info.options["matryoshka"] == (overrides.get("matryoshka_dimensions") if overrides else None)
    params = PoolingParams(dimensions=dimensions)
    if refusal:
        with pytest.raises(ValueError, match=refusal):
            engine.add_request("x", "hi", pooling_params=params)
        return
    engine.add_request("x", "hi", pooling_params=params)
    assert len(run(engine)["x"].outputs.embedding) == dimensions
