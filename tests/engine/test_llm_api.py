"""The offline API on a tiny random Llama: prompts, sampling, stops, logprobs, n, errors, hooks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from llmp import LLM, SamplingParams, hookimpl, registry
from llmp.api import KVManagerSpec
from llmp.inputs import Prompt
from llmp.sampling_params import SamplingParamsError
from llmp.testing import hf_greedy, registered, save_tiny_llama, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("tiny-llama-400")
    # vocabulary = the tokenizer's, so every sampled id has text
    return path, save_tiny_llama(path, vocab_size=400, logit_scale=4.0)


@pytest.fixture(scope="module")
def llm(tiny) -> LLM:
    return LLM(str(tiny[0]), dtype="float32", block_size=4, max_model_len=256)


GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def test_outputs_follow_input_order_for_text_and_token_prompts(llm, tiny):
    tokenizer = llm.get_tokenizer()
    prompts = ["The quick brown fox", {"prompt_token_ids": [5, 6, 7]}, "Paged attention", {"prompt": "Café"}]
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt for o in outputs] == ["The quick brown fox", None, "Paged attention", "Café"]
    assert outputs[1].prompt_token_ids == [5, 6, 7]
    assert outputs[0].prompt_token_ids == tokenizer.encode("The quick brown fox")
    for output in outputs:
        completion = output.outputs[0]
        assert completion.token_ids == hf_greedy(tiny[1], output.prompt_token_ids, 20)
        full = tokenizer.decode(output.prompt_token_ids + completion.token_ids)
        assert completion.text == full[len(tokenizer.decode(output.prompt_token_ids)) :]
        assert completion.finish_reason == "length" and output.finished


def test_seeded_sampling_reproduces_whatever_the_batch(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=1234, ignore_eos=True)
    alone = llm.generate("The quick", params, use_tqdm=False)[0].outputs[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    batch = llm.generate(["Paged", "The quick", "Café"], [others, params, others], use_tqdm=False)
    assert batch[1].outputs[0].token_ids == alone
    other_seed = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=99, ignore_eos=True)
    assert llm.generate("The quick", other_seed, use_tqdm=False)[0].outputs[0].token_ids != alone


def test_top_k_1_equals_greedy(llm):
    greedy = llm.generate("The quick", GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    top1 = SamplingParams(temperature=0.8, top_k=1, max_tokens=20, ignore_eos=True)
    assert llm.generate("The quick", top1, use_tqdm=False)[0].outputs[0].token_ids == greedy


def test_n_sequences_share_the_prompt(llm):
    params = SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=7, ignore_eos=True)
    [output] = llm.generate("The quick", params, use_tqdm=False)
    assert [c.index for c in output.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 12 for c in output.outputs)
    assert len({tuple(c.token_ids) for c in output.outputs}) > 1  # seeds seed+0, seed+1, seed+2
    [again] = llm.generate("The quick", params, use_tqdm=False)
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in output.outputs]


def test_stop_string_spanning_tokens_is_cut_from_the_text(llm):
    reference = llm.generate("The quick", GREEDY, use_tqdm=False)[0].outputs[0]
    text = reference.text
    stop = text[5:9]
    assert len(stop) == 4 and text.find(stop) == 5
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop=[stop])
    completion = llm.generate("The quick", params, use_tqdm=False)[0].outputs[0]
    assert completion.text == text[:5]
    assert completion.finish_reason == "stop" and completion.stop_reason == stop
    assert len(completion.token_ids) < 20
    included = SamplingParams(
        temperature=0.0, max_tokens=20, ignore_eos=True, stop=stop, include_stop_str_in_output=True
    )
    assert llm.generate("The quick", included, use_tqdm=False)[0].outputs[0].text == text[:9]


def test_detokenize_false_gives_the_same_tokens_without_text(llm):
    """vLLM's ``detokenize=False``: token ids and logprobs, no text and no decoded tokens."""
    with_text = llm.generate("The quick", SamplingParams(temperature=0.0, max_tokens=8, logprobs=1), use_tqdm=False)
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=1, prompt_logprobs=1, detokenize=False)
    [output] = llm.generate("The quick", params, use_tqdm=False)
    completion, reference = output.outputs[0], with_text[0].outputs[0]
    assert reference.text and completion.text == ""
    assert completion.token_ids == reference.token_ids and completion.finish_reason == reference.finish_reason
    assert all(entry.decoded_token is None for step in completion.logprobs for entry in step.values())
    assert all(entry.decoded_token is None for step in output.prompt_logprobs[1:] for entry in step.values())
    with pytest.raises(SamplingParamsError, match="detokenize=True") as caught:
        SamplingParams(stop=["x"], detokenize=False)  # stop strings are found in the text
    assert caught.value.field == "stop"


def test_logprobs_true_and_minus_one_as_vllm(llm):
    """True: 1 (the top token beside the chosen one); -1: every token of the vocabulary (400 here)."""
    one = SamplingParams(temperature=0.0, max_tokens=2, logprobs=True, prompt_logprobs=True)
    assert (one.logprobs, one.prompt_logprobs) == (1, 1)
    every = SamplingParams(temperature=0.0, max_tokens=2, logprobs=-1, prompt_logprobs=-1)
    [output] = llm.generate("The quick", every, use_tqdm=False)
    assert all(len(step) == 400 for step in output.outputs[0].logprobs)
    assert len(output.prompt_logprobs[1]) == 400 and every.logprobs == -1  # the caller's params stay as given


def test_priority_may_be_one_for_all_and_use_tqdm_a_bar_class(tiny):
    made: list[dict] = []

    class Bar:  # tqdm's interface, as vLLM calls it
        def __init__(self, **kwargs):
            made.append(kwargs)
            self.n = 0

        def update(self, n):
            self.n += n

        def set_postfix_str(self, text, refresh=True):
            self.postfix = text

        def close(self):
            made.append({"closed": self.n})

    llm = LLM(str(tiny[0]), dtype="float32", max_model_len=64, scheduling_policy="priority")
    outputs = llm.generate(["a", "b"], GREEDY, priority=3, use_tqdm=Bar)
    assert len(outputs) == 2
    assert made == [{"total": 2, "desc": "Processed prompts", "dynamic_ncols": True}, {"closed": 2}]
    [chat] = llm.chat([{"role": "user", "content": "hi"}], GREEDY, priority=1, use_tqdm=False)
    assert chat.outputs[0].token_ids


def test_a_field_changed_after_construction_is_checked_and_used(llm):
    text = llm.generate("The quick", GREEDY, use_tqdm=False)[0].outputs[0].text
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    params.n = 0
    with pytest.raises(SamplingParamsError, match="n must be >= 1"):
        llm.generate("The quick", params, use_tqdm=False)
    params.n, params.stop = 1, text[5:9]  # one string, set late: normalised and honoured all the same
    completion = llm.generate("The quick", params, use_tqdm=False)[0].outputs[0]
    assert completion.text == text[:5] and completion.stop_reason == text[5:9]
    assert llm.generate("The quick", GREEDY, use_tqdm=False)[0].outputs[0].text == text  # the engine goes on


def test_a_stop_string_ending_on_the_last_allowed_token_is_the_finish_reason(llm):
    ids = llm.generate("The quick", GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    tokenizer = llm.get_tokenizer()
    texts = [tokenizer.decode(ids[:n]) for n in range(len(ids) + 1)]
    # the most tokens whose text is whole characters and grew with its last token
    n = next(n for n in range(len(ids), 0, -1) if "\ufffd" not in texts[n] and len(texts[n]) > len(texts[n - 1]))
    text = texts[n]
    stop = next(text[i:] for i in range(len(text) - 1, -1, -1) if text.find(text[i:]) == i and text[i:].strip())
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, stop=[stop])
    completion = llm.generate("The quick", params, use_tqdm=False)[0].outputs[0]
    assert list(completion.token_ids) == list(ids[:n]) and completion.text == text[: len(text) - len(stop)]
    assert completion.finish_reason == "stop" and completion.stop_reason == stop  # not "length"


def test_stop_token_ids_and_min_tokens(llm):
    tokens = llm.generate("The quick", GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    stop_id = tokens[4]
    first = tokens.index(stop_id)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop_token_ids=[stop_id])
    completion = llm.generate("The quick", params, use_tqdm=False)[0].outputs[0]
    assert completion.token_ids == tokens[: first + 1]
    assert completion.finish_reason == "stop" and completion.stop_reason == stop_id
    # min_tokens bans the stop token until it is reached, so the output is at least that long
    params = SamplingParams(
        temperature=0.0, max_tokens=20, ignore_eos=True, stop_token_ids=[stop_id], min_tokens=first + 3
    )
    assert len(llm.generate("The quick", params, use_tqdm=False)[0].outputs[0].token_ids) >= first + 3


def test_logprobs_are_the_log_softmax_of_the_reference_logits(llm, tiny):
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    [output] = llm.generate({"prompt_token_ids": [5, 6, 7, 8]}, params, use_tqdm=False)
    completion = output.outputs[0]
    ids = output.prompt_token_ids + completion.token_ids
    with torch.no_grad():
        reference = tiny[1](torch.tensor([ids])).logits[0].float().log_softmax(-1)
    for step, entry in enumerate(completion.logprobs):
        row = reference[len(output.prompt_token_ids) - 1 + step]
        token = completion.token_ids[step]
        assert entry[token].rank == 1
        top = row.topk(3)
        assert set(entry) == set(top.indices.tolist()) | {token}
        for token_id, logprob in entry.items():
            assert logprob.logprob == pytest.approx(float(row[token_id]), abs=1e-4)
    assert completion.cumulative_logprob == pytest.approx(
        sum(completion.logprobs[i][t].logprob for i, t in enumerate(completion.token_ids)), abs=1e-5
    )
    assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == 4
    for position, entry in enumerate(output.prompt_logprobs[1:], start=1):
        token = ids[position]
        assert entry[token].logprob == pytest.approx(float(reference[position - 1, token]), abs=1e-4)
        assert entry[token].rank == int((reference[position - 1] > reference[position - 1, token]).sum()) + 1


def test_max_tokens_none_runs_to_the_context_limit(tiny):
    llm = LLM(str(tiny[0]), dtype="float32", block_size=4, max_model_len=40)
    params = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
    [output] = llm.generate({"prompt_token_ids": [5, 6, 7, 8, 9]}, params, use_tqdm=False)
    assert len(output.outputs[0].token_ids) == 35
    assert output.outputs[0].finish_reason == "length"
    # an explicit max_tokens past the context is no error offline: it ends at the context, as in vLLM
    params = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    [output] = llm.generate({"prompt_token_ids": [5, 6, 7, 8, 9]}, params, use_tqdm=False)
    assert len(output.outputs[0].token_ids) == 35 and output.outputs[0].finish_reason == "length"


def test_no_sampling_params_means_the_generation_config_defaults(tiny, tmp_path):
    """vLLM's LLM.generate(prompts) and get_default_sampling_params: generation_config.json's values."""
    import json

    model_dir = tmp_path / "with-generation-config"
    shutil.copytree(tiny[0], model_dir)
    config = json.loads((model_dir / "generation_config.json").read_text())
    config.update(temperature=0.0, top_k=7, max_new_tokens=5, repetition_penalty=1.0)
    (model_dir / "generation_config.json").write_text(json.dumps(config))
    llm = LLM(str(model_dir), dtype="float32", max_model_len=64)
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_k, defaults.max_tokens) == (0.0, 7, 5)
    [output] = llm.generate({"prompt_token_ids": [1, 42, 7]})
    assert output.outputs[0].token_ids == hf_greedy(tiny[1], [1, 42, 7], 5)
    plain = LLM(str(tiny[0]), dtype="float32", max_model_len=64).get_default_sampling_params()
    assert plain == SamplingParams()
    # vLLM's generation_config argument: "vllm" (or "none") ignores the file; a directory gives its own
    # vLLM's override_generation_config: its values over the file's, or alone when the file is ignored
    overrides = {"top_k": 3, "max_new_tokens": 9}
    ignored = LLM(str(model_dir), dtype="float32", max_model_len=64, generation_config="vllm")
    assert ignored.get_default_sampling_params() == SamplingParams()
    ignored = LLM(str(model_dir), max_model_len=64, generation_config="vllm", override_generation_config=overrides)
    assert ignored.get_default_sampling_params() == SamplingParams(top_k=3, max_tokens=9)
    elsewhere = LLM(
        str(tiny[0]), max_model_len=64, generation_config=str(model_dir), override_generation_config={"top_k": 3}
    )
    defaults = elsewhere.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_k, defaults.max_tokens) == (0.0, 3, 5)
    with pytest.raises(ValueError, match="generation_config must be"):
        LLM(str(tiny[0]), generation_config="sometimes")
    with pytest.raises(ValueError, match="override_generation_config may set temperature.*not seed"):
        LLM(str(tiny[0]), override_generation_config={"seed": 1})


def test_generation_configs_extra_end_tokens_stop_naming_themselves(tiny, tmp_path):
    """vLLM's update_from_generation_config: end tokens beside the tokenizer's are stop tokens
    (stop_reason is the id); the tokenizer's own EOS stays unnamed; ignore_eos ignores both."""
    import json

    model_dir = tmp_path / "two-end-tokens"
    shutil.copytree(tiny[0], model_dir)
    config = json.loads((model_dir / "generation_config.json").read_text())
    eos = config["eos_token_id"]
    config["eos_token_id"] = [eos, 300]
    (model_dir / "generation_config.json").write_text(json.dumps(config))
    llm = LLM(str(model_dir), dtype="float32", max_model_len=64)
    params = SamplingParams(temperature=0.0, max_tokens=5, logit_bias={300: 100.0})
    [output] = llm.generate({"prompt_token_ids": [1, 42, 7]}, params, use_tqdm=False)
    seq = output.outputs[0]
    assert (seq.token_ids, seq.finish_reason, seq.stop_reason) == ([300], "stop", 300)
    assert params.stop_token_ids == []  # the caller's params stay as given
    [output] = llm.generate(
        {"prompt_token_ids": [1, 42, 7]},
        SamplingParams(temperature=0.0, max_tokens=5, logit_bias={eos: 100.0}),
        use_tqdm=False,
    )
    assert (output.outputs[0].finish_reason, output.outputs[0].stop_reason) == ("stop", None)
    listed = SamplingParams(temperature=0.0, max_tokens=5, logit_bias={eos: 100.0}, stop_token_ids=[eos])
    [output] = llm.generate({"prompt_token_ids": [1, 42, 7]}, listed, use_tqdm=False)
    # vLLM checks the end token before the stop tokens: listed among them, it still names nothing
    assert (output.outputs[0].finish_reason, output.outputs[0].stop_reason) == ("stop", None)
    assert listed.stop_token_ids == [eos]
    ignoring = SamplingParams(temperature=0.0, max_tokens=3, logit_bias={300: 100.0}, ignore_eos=True)
    [output] = llm.generate({"prompt_token_ids": [1, 42, 7]}, ignoring, use_tqdm=False)
    assert (output.outputs[0].token_ids, output.outputs[0].finish_reason) == ([300] * 3, "length")


def test_prompt_records_keep_text_ids_and_the_special_tokens_choice(tiny, tmp_path):
    from tokenizers import processors

    model_dir = tmp_path / "bos"
    shutil.copytree(tiny[0], model_dir)
    tokenizer = tiny_tokenizer()  # the same vocabulary, now adding <s> (id 0) in front of every text
    tokenizer._tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tokenizer.save_pretrained(model_dir)
    llm = LLM(str(model_dir), dtype="float32", max_model_len=64)
    plain, templated = llm.generate(
        [Prompt(text="The quick"), Prompt(text="<s>The quick", add_special_tokens=False)], GREEDY, use_tqdm=False
    )
    assert plain.prompt_token_ids[0] == 0 and plain.prompt_token_ids == templated.prompt_token_ids
    assert (plain.prompt, templated.prompt) == ("The quick", "<s>The quick")
    [chat] = llm.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False)
    assert chat.prompt_token_ids.count(0) == 2  # the template's own two <s>: no BOS added in front
    [given] = llm.generate(Prompt(text="shown", token_ids=[5, 6, 7]), GREEDY, use_tqdm=False)
    assert (given.prompt, given.prompt_token_ids) == ("shown", [5, 6, 7])
    with pytest.raises(TypeError, match="text or its token ids"):
        Prompt()


def test_bad_prompts_raise_clear_errors_and_leave_the_engine_working(llm):
    with pytest.raises(SamplingParamsError, match="maximum context length is 256 tokens") as too_long:
        llm.generate({"prompt_token_ids": [5] * 300}, GREEDY, use_tqdm=False)
    assert too_long.value.field == "input_tokens"
    with pytest.raises(SamplingParamsError, match="maximum context length is 256 tokens"):  # none left to generate
        llm.generate({"prompt_token_ids": [5] * 256}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="empty"):
        llm.generate({"prompt_token_ids": []}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match=r"token id 400 is out of range \[0, 400\)"):
        llm.generate({"prompt_token_ids": [5, 400]}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="logit_bias token id 999"):
        llm.generate("x", SamplingParams(logit_bias={999: 1.0}), use_tqdm=False)
    with pytest.raises(ValueError, match="stop_token_ids token id 999"):
        llm.generate("x", SamplingParams(stop_token_ids=[999]), use_tqdm=False)
    with pytest.raises(ValueError, match="'multi_modal_data' .llmp serves text models"):  # refused, not dropped
        llm.generate({"prompt": "x", "multi_modal_data": {"image": None}}, GREEDY, use_tqdm=False)
    from llmp import TextPrompt, TokensPrompt  # vLLM's dict types

    assert llm.generate([TextPrompt(prompt="x"), TokensPrompt(prompt_token_ids=[5, 6])], GREEDY, use_tqdm=False)
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams or a list of them, got dict"):
        llm.generate("x", {"max_tokens": 3}, use_tqdm=False)
    with pytest.raises(TypeError, match="prompt"):
        llm.generate([3.5], GREEDY, use_tqdm=False)
    # a failure part-way through a batch queues nothing
    with pytest.raises(ValueError):
        llm.generate(["fine", {"prompt_token_ids": []}], GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    assert llm.generate("The quick", GREEDY, use_tqdm=False)[0].outputs[0].finish_reason == "length"


def test_abort_ends_a_request_with_finish_reason_abort(llm):
    engine = llm.engine
    engine.add_request("to-abort", "The quick", SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    [final] = engine.abort_request("to-abort")
    assert final.finished and final.outputs[0].finish_reason == "abort"
    assert not engine.has_unfinished_requests()
    assert engine.kv_manager.usage == 0.0


def test_chat_renders_the_template(llm):
    assert llm.llm_engine is llm.engine  # vLLM's name, and its get_tokenizer
    assert llm.llm_engine.get_tokenizer().encode("hi") == llm.get_tokenizer().encode("hi")
    conversation = [{"role": "user", "content": "hello"}]
    assert llm.render_chat(conversation) == "<s>user: hello</s><s>assistant: "
    [output] = llm.chat(conversation, GREEDY, use_tqdm=False)
    assert output.prompt == "<s>user: hello</s><s>assistant: "
    assert output.prompt_token_ids == llm.get_tokenizer().encode(output.prompt, add_special_tokens=False)
    # OpenAI's developer role, for a template that never names it: a system message, first (vLLM's rule)
    developer = [{"role": "system", "content": "a"}, *conversation, {"role": "developer", "content": "b"}]
    assert llm.render_chat(developer) == "<s>system: a\n\nb</s><s>user: hello</s><s>assistant: "
    naming = "{% for m in messages %}{{ m['role'] == 'developer' and 'D' or m['role'] }};{% endfor %}"
    assert llm.render_chat(developer, naming, add_generation_prompt=False) == "system;user;D;"
    prefilled = [*conversation, {"role": "assistant", "content": "Hi"}]
    with pytest.raises(ValueError, match="continue_final_message and add_generation_prompt are not compatible"):
        llm.chat(prefilled, GREEDY, use_tqdm=False, continue_final_message=True)  # as transformers and vLLM
    [output] = llm.chat(prefilled, GREEDY, use_tqdm=False, continue_final_message=True, add_generation_prompt=False)
    assert output.prompt.endswith("<s>assistant: Hi")


PARTS_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}:{% for part in m['content'] %}[{{ part['text'] }}]{% endfor %};{% endfor %}"
)


def test_chat_content_reaches_the_template_in_the_format_it_reads(llm):
    parts = [{"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "input_text", "text": "lo"}]}]
    # a template reading text gets OpenAI's text parts joined with newlines, as vLLM's "string" format
    assert llm.render_chat(parts) == "<s>user: hel\nlo</s><s>assistant: "
    [output] = llm.chat(parts, GREEDY, use_tqdm=False)
    assert output.prompt == "<s>user: hel\nlo</s><s>assistant: "
    # one that loops over a message's content gets text parts ("auto" detects it), text or parts given
    text = [{"role": "user", "content": "hi"}]
    assert llm.render_chat(text, PARTS_TEMPLATE) == "user:[hi];"
    assert llm.render_chat(parts, PARTS_TEMPLATE) == "user:[hel][lo];"
    assert llm.chat(text, GREEDY, chat_template=PARTS_TEMPLATE, use_tqdm=False)[0].prompt == "user:[hi];"
    # forced formats, as --chat-template-content-format
    assert llm.render_chat(text, PARTS_TEMPLATE, content_format="string") == "user:[][];"  # iterates characters
    assert llm.render_chat(text, content_format="openai").startswith("<s>user: [{'type': 'text'")
    with pytest.raises(ValueError, match="'image_url' are not supported"):
        llm.render_chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(ValueError, match="must be auto, string or openai, not 'OpenAI'"):
        llm.chat(text, GREEDY, chat_template_content_format="OpenAI", use_tqdm=False)
    # as vLLM shapes them: empty text is one empty part, no content no part, a tool result stays text
    shapes = [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": [{"type": "text", "text": "4"}, {"type": "text", "text": "2"}]},
    ]
    assert llm.render_chat(shapes, PARTS_TEMPLATE) == "user:[];assistant:;tool:[][][];"  # "4\n2": 3 characters


def test_content_format_detection_follows_the_loops_over_content():
    from llmp.chat_template import content_format_of

    class NoTemplate:
        chat_template = None

    openai = [
        PARTS_TEMPLATE,
        "{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}",
        "{% for m in messages %}{% set c = m['content'] %}{% for p in c %}{{ p.text }}{% endfor %}{% endfor %}",
        "{% for m in messages %}{% for p in m.content | selectattr('type', 'eq', 'text') %}{% endfor %}{% endfor %}",
        {"default": "{{ messages }}", "tool_use": PARTS_TEMPLATE},  # any of a tokenizer's named templates
        # a macro looping over its parameter, given a message's content (Qwen3-VL's render_content)
        "{% macro r(c) %}{% for p in c %}{{ p.text }}{% endfor %}{% endmacro %}"
        "{% for m in messages %}{{ r(m['content']) }}{% endfor %}",
        "{% macro r(x, c) %}{% for p in c %}{{ p.text }}{% endfor %}{% endmacro %}"
        "{% for m in messages %}{% set body = m.content %}{{ r(1, c=body) }}{% endfor %}",
    ]
    string = [
        "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "{% for m in messages %}{% for line in m.content.split('\\n') %}{{ line }}{% endfor %}{% endfor %}",
        "{% if %}",  # a template jinja cannot parse fails when rendered
        "{% macro r(c) %}{% for p in c %}{{ p }}{% endfor %}{% endmacro %}{{ r(messages) }}",
    ]
    assert [content_format_of(NoTemplate(), t) for t in openai] == ["openai"] * len(openai)
    assert [content_format_of(NoTemplate(), t) for t in string] == ["string"] * len(string)


def test_engine_life_cycle_hooks_see_the_chosen_components(tiny):
    seen = []

    class Observer:
        @hookimpl
        def llmp_engine_started(self, info):
            seen.append(("started", info))

        @hookimpl
        def llmp_engine_stopped(self, info):
            seen.append(("stopped", info))

    with registered(Observer(), "observer"):
        llm = LLM(str(tiny[0]), dtype="float32", max_model_len=64)
        llm.shutdown()
    assert [event for event, _ in seen] == ["started", "stopped"]
    info = seen[0][1]
    chosen = registry.select_kernels(None, "cpu").name  # cpu-native when its library loads, else cpu
    assert (info.kernels, info.scheduler, info.kv_manager, info.device) == (chosen, "default", "default", "cpu")


def test_max_model_len_beyond_the_models_context_is_refused(tiny):
    with pytest.raises(ValueError, match=r"exceeds the model's context \(max_position_embeddings = 512\)"):
        LLM(str(tiny[0]), max_model_len=1000)


def test_cache_salt_keeps_prefix_cache_hits_within_a_salt(tiny):
    """vLLM's ``cache_salt`` on a prompt: the same prompt hits the prefix cache under its own salt only,
    and its greedy output is the same under any salt."""
    llm = LLM(str(tiny[0]), dtype="float32", block_size=4, max_model_len=256)
    ids = list(range(5, 30))

    def run(salt: str | None):
        prompt = {"prompt_token_ids": ids, **({"cache_salt": salt} if salt is not None else {})}
        return llm.generate(prompt, GREEDY, use_tqdm=False)[0]

    first = run("tenant-a")
    assert first.num_cached_tokens == 0
    assert run("tenant-a").num_cached_tokens == 24  # every full block but the one holding the last token
    other, plain = run("tenant-b"), run(None)
    assert other.num_cached_tokens == 0 and plain.num_cached_tokens == 0
    assert run(None).num_cached_tokens == 24
    assert first.outputs[0].token_ids == other.outputs[0].token_ids == plain.outputs[0].token_ids
    with pytest.raises(TypeError, match="cache_salt must be a non-empty string"):
        llm.generate({"prompt_token_ids": ids, "cache_salt": ""}, GREEDY, use_tqdm=False)
    assert Prompt(token_ids=ids, cache_salt="s").cache_salt == "s"


class UnsaltedKV(registry.load_component("kv_manager", "default")):
    supports_cache_salt = False  # a manager that would let salts share blocks


class UnsaltedKVPlugin:
    @hookimpl
    def llmp_register_kv_managers(self):
        yield KVManagerSpec(name="unsalted", impl=f"{__name__}:UnsaltedKV")


def test_a_salted_prompt_is_refused_by_a_kv_manager_that_does_not_key_by_salt(tiny):
    prompt = {"prompt_token_ids": [5, 6, 7], "cache_salt": "tenant-a"}
    with registered(UnsaltedKVPlugin()):
        llm = LLM(str(tiny[0]), dtype="float32", block_size=4, max_model_len=64, kv_manager="unsalted")
        with pytest.raises(ValueError, match="does not key cached blocks by cache salt"):
            llm.generate(prompt, GREEDY, use_tqdm=False)
        assert llm.generate({"prompt_token_ids": [5, 6, 7]}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
        uncached = LLM(
            str(tiny[0]),
            dtype="float32",
            block_size=4,
            max_model_len=64,
            kv_manager="unsalted",
            enable_prefix_caching=False,
        )
        assert uncached.generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0].token_ids  # no cache to salt
