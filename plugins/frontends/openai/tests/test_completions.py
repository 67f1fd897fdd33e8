"""``/v1/completions`` on a live server, through the official ``openai`` SDK (httpx for raw bodies)."""

from __future__ import annotations

import openai
import pytest
from openai_frontend_support import GREEDY, assert_error, extra

from llmp.testing import hf_greedy

PROMPT = "The quick brown fox"


def greedy(client, tiny, prompt=PROMPT, max_tokens=12, **kwargs):
    body = {"ignore_eos": True, "return_token_ids": True, **kwargs.pop("extra_body", {})}
    return client.completions.create(
        model=tiny.name, prompt=prompt, max_tokens=max_tokens, temperature=0, extra_body=body, **kwargs
    )


# -- greedy parity -------------------------------------------------------------------


@pytest.mark.parametrize("prompt", [PROMPT, "def add(a, b):", "Café, naïve"])
def test_greedy_completion_equals_transformers(client, tiny, prompt):
    response = greedy(client, tiny, prompt)
    choice = response.choices[0]
    prompt_ids = extra(choice, "prompt_token_ids")
    assert prompt_ids == tiny.tokenizer.encode(prompt)
    assert extra(choice, "token_ids") == hf_greedy(tiny.model, prompt_ids, 12)
    assert choice.text == tiny.tokenizer.decode(extra(choice, "token_ids"), skip_special_tokens=True)
    assert response.usage.prompt_tokens == len(prompt_ids)
    assert response.usage.completion_tokens == 12


def test_token_id_prompt_equals_the_text_prompt(client, tiny):
    by_text = greedy(client, tiny)
    ids = extra(by_text.choices[0], "prompt_token_ids")
    by_ids = greedy(client, tiny, prompt=ids)
    assert extra(by_ids.choices[0], "token_ids") == extra(by_text.choices[0], "token_ids")
    assert by_ids.choices[0].text == by_text.choices[0].text
    # a prompt holding <s> (id 0) too
    with_bos = greedy(client, tiny, prompt=[0, *ids])
    assert extra(with_bos.choices[0], "token_ids") == hf_greedy(tiny.model, [0, *ids], 12)


# -- basics ----------------------------------------------------------------------------


def test_response_shape(client, tiny):
    response = client.completions.create(
        model=tiny.name, prompt=PROMPT, max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    assert response.id.startswith("cmpl-")
    assert response.object == "text_completion"
    assert response.model == tiny.name
    assert len(response.choices) == 1 and response.choices[0].index == 0
    assert response.choices[0].finish_reason == "length"
    assert response.choices[0].logprobs is None
    usage = response.usage
    assert usage.completion_tokens == 5 and usage.total_tokens == usage.prompt_tokens + 5


def test_default_max_tokens_is_16(client, tiny):
    response = client.completions.create(model=tiny.name, prompt=PROMPT, temperature=0, extra_body={"ignore_eos": True})
    assert response.usage.completion_tokens == 16


def test_empty_model_name_gets_the_served_name(http, tiny):
    response = http.post("/v1/completions", json={"model": "", "prompt": PROMPT, "max_tokens": 2})
    assert response.status_code == 200, response.text
    assert response.json()["model"] == tiny.name


# -- streaming -----------------------------------------------------------------------------


def test_streamed_text_equals_non_streamed(client, tiny):
    whole = greedy(client, tiny, max_tokens=16)
    chunks = list(client.completions.create(model=tiny.name, prompt=PROMPT, max_tokens=16, stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    finishes = [(i, c.choices[0].finish_reason) for i, c in enumerate(chunks) if c.choices[0].finish_reason]
    assert finishes == [(len(chunks) - 1, "length")]
    assert all(c.usage is None for c in chunks)


def test_stream_include_usage(client, tiny):
    chunks = list(
        client.completions.create(
            model=tiny.name, prompt=PROMPT, max_tokens=9, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    *content, last = chunks
    assert content and all(c.usage is None and c.choices for c in content)
    assert last.choices == []
    assert last.usage.completion_tokens == 9
    assert last.usage.prompt_tokens == len(tiny.tokenizer.encode(PROMPT))
    assert last.usage.total_tokens == last.usage.prompt_tokens + 9


def test_stream_continuous_usage_stats(client, tiny):
    chunks = list(
        client.completions.create(
            model=tiny.name,
            prompt=PROMPT,
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            **GREEDY,
        )
    )
    assert all(c.usage is not None for c in chunks)
    completion = [c.usage.completion_tokens for c in chunks]
    assert completion == sorted(completion) and completion[-1] == 7
    # several prompts: each chunk's usage is its own choice's (its prompt, its tokens so far), as vLLM's;
    # the prompt's ids come with a choice's first chunk only
    prompts = [PROMPT, "A different and longer prompt than the first"]
    chunks = list(
        client.completions.create(
            model=tiny.name,
            prompt=prompts,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
    )
    lengths = [len(tiny.tokenizer.encode(text)) for text in prompts]
    seen: dict[int, int] = {}
    for chunk in chunks[:-1]:
        index = chunk.choices[0].index
        assert chunk.usage.prompt_tokens == lengths[index], chunk
        assert (extra(chunk.choices[0], "prompt_token_ids") is not None) == (index not in seen), chunk
        seen[index] = chunk.usage.completion_tokens
    assert seen == {0: 4, 1: 4} and chunks[-1].usage.completion_tokens == 8
    # as vLLM: continuous_usage_stats only adds to include_usage
    for options in ({"continuous_usage_stats": True}, {"include_usage": False, "continuous_usage_stats": True}):
        chunks = list(
            client.completions.create(
                model=tiny.name, prompt=PROMPT, max_tokens=3, stream=True, stream_options=options, **GREEDY
            )
        )
        assert all(c.usage is None for c in chunks), options


def test_stream_options_without_stream_is_refused(http):
    response = http.post("/v1/completions", json={"prompt": PROMPT, "stream_options": {"include_usage": False}})
    assert_error(response, 400, param="stream_options")


# -- n, several prompts ----------------------------------------------------------------------


def test_n_choices(client, tiny):
    response = client.completions.create(
        model=tiny.name, prompt=PROMPT, max_tokens=4, n=3, temperature=1, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in response.choices)
    assert response.usage.completion_tokens == 12


def test_several_prompts_with_n_are_prompt_major(client, tiny):
    prompts = [PROMPT, "def add(a, b):"]
    response = client.completions.create(
        model=tiny.name,
        prompt=prompts,
        max_tokens=3,
        n=2,
        temperature=1,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    owners = [extra(c, "prompt_token_ids") for c in response.choices]
    assert owners == [tiny.tokenizer.encode(p) for p in prompts for _ in range(2)]
    assert response.usage.prompt_tokens == sum(len(tiny.tokenizer.encode(p)) for p in prompts)
    assert response.usage.completion_tokens == 12


def test_several_prompts_greedy_each_equal_alone(client, tiny):
    prompts = [PROMPT, "def add(a, b):"]
    together = client.completions.create(model=tiny.name, prompt=prompts, max_tokens=6, **GREEDY)
    alone = [greedy(client, tiny, p, max_tokens=6).choices[0].text for p in prompts]
    assert [c.text for c in together.choices] == alone


def test_streamed_several_prompts(client, tiny):
    chunks = list(
        client.completions.create(
            model=tiny.name,
            prompt=[PROMPT, "def add(a, b):"],
            max_tokens=4,
            n=2,
            temperature=1,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    finished = [c.choices[0].index for c in chunks if c.choices[0].finish_reason]
    assert sorted(finished) == [0, 1, 2, 3]


# -- echo, stop, logprobs ---------------------------------------------------------------------


def test_echo(client, tiny):
    response = greedy(client, tiny, max_tokens=4, echo=True)
    alone = greedy(client, tiny, max_tokens=4)
    assert response.choices[0].text == PROMPT + alone.choices[0].text
    # null is false, as vLLM's `echo: bool | None`
    assert greedy(client, tiny, max_tokens=4, extra_body={"echo": None}).choices[0].text == alone.choices[0].text


def test_echo_token_ids(client, tiny):
    ids = tiny.tokenizer.encode(PROMPT)
    response = greedy(client, tiny, prompt=ids, max_tokens=3, echo=True)
    assert response.choices[0].text.startswith(tiny.tokenizer.decode(ids))


def test_echo_with_logprobs(client, tiny):
    prompt_len = len(tiny.tokenizer.encode(PROMPT))
    response = greedy(client, tiny, max_tokens=4, echo=True, logprobs=1)
    logprobs = response.choices[0].logprobs
    assert response.choices[0].text.startswith(PROMPT)
    assert len(logprobs.tokens) == len(logprobs.text_offset) == prompt_len + 4
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in logprobs.token_logprobs[1:])
    assert "".join(logprobs.tokens[1:prompt_len]) == " quick brown fox"


def test_echo_with_max_tokens_0_scores_the_prompt(client, tiny):
    """vLLM's prompt scoring (lm-evaluation-harness's loglikelihood): echo, logprobs and max_tokens 0
    answer the prompt alone with its logprobs, which are those of a longer request's prompt part."""
    prompt_len = len(tiny.tokenizer.encode(PROMPT))
    scored = greedy(client, tiny, max_tokens=0, echo=True, logprobs=1)
    choice, longer = scored.choices[0], greedy(client, tiny, max_tokens=2, echo=True, logprobs=1).choices[0]
    assert (choice.text, choice.finish_reason, scored.usage.completion_tokens) == (PROMPT, "length", 0)
    assert choice.logprobs.tokens == longer.logprobs.tokens[:prompt_len]
    assert choice.logprobs.token_logprobs == longer.logprobs.token_logprobs[:prompt_len]
    with pytest.raises(openai.BadRequestError, match="max_tokens must be >= 1"):
        greedy(client, tiny, max_tokens=0)  # without echo there is nothing to answer


def test_logprobs_minus_one_is_the_whole_vocabulary_past_the_servers_limit(http):
    response = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "logprobs": -1})
    assert_error(response, 400, param="logprobs")
    assert "logprobs=-1 (the whole vocabulary" in response.json()["error"]["message"]


def test_echo_logprobs_tokens_spell_the_prompt(client, tiny):
    response = greedy(client, tiny, max_tokens=2, echo=True, logprobs=1)
    logprobs = response.choices[0].logprobs
    ids = tiny.tokenizer.encode(PROMPT)
    assert logprobs.tokens[: len(ids)] == [tiny.tokenizer.decode([i]) for i in ids]  # ['The', ' quick', ...]
    assert "".join(logprobs.tokens).startswith(PROMPT)
    assert logprobs.text_offset[:3] == [0, 3, 9]


def test_streamed_text_offsets_go_on_from_chunk_to_chunk(client, tiny):
    for echo in (False, True):
        whole = greedy(client, tiny, max_tokens=5, echo=echo, logprobs=1).choices[0].logprobs.text_offset
        chunks = client.completions.create(
            model=tiny.name, prompt=PROMPT, max_tokens=5, echo=echo, logprobs=1, stream=True, **GREEDY
        )
        assert [o for c in chunks for o in (c.choices[0].logprobs.text_offset if c.choices else [])] == whole


def test_streamed_echo(client, tiny):
    chunks = list(
        client.completions.create(model=tiny.name, prompt=PROMPT, max_tokens=4, stream=True, echo=True, **GREEDY)
    )
    whole = greedy(client, tiny, max_tokens=4, echo=True)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


def test_stop_string(client, tiny):
    full = greedy(client, tiny, max_tokens=24).choices[0].text
    stop = next(
        full[i : i + 2] for i in range(2, len(full) - 1) if full[i : i + 2].isascii() and full[i : i + 2].isalnum()
    )
    expected = full[: full.index(stop)]
    cut = greedy(client, tiny, max_tokens=24, stop=[stop, "no-such-stop"])
    assert cut.choices[0].text == expected
    assert cut.choices[0].finish_reason == "stop"
    assert extra(cut.choices[0], "stop_reason") == stop
    kept = greedy(client, tiny, max_tokens=24, stop=stop, extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].text == expected + stop


def test_streamed_stop_string_across_tokens(client, tiny):
    """A stop string made of the end of one token and the start of the next: streaming must hold text back."""
    full = greedy(client, tiny, max_tokens=30, logprobs=0).choices[0]
    tokens = full.logprobs.tokens
    stop = next(
        a[-1] + b[0]
        for a, b in zip(tokens[1:], tokens[2:])
        if a and b and (a[-1] + b[0]).isascii() and (a[-1] + b[0]).isalnum()
    )
    expected = full.text[: full.text.index(stop)]
    whole = greedy(client, tiny, max_tokens=30, stop=stop).choices[0]
    assert whole.text == expected and whole.finish_reason == "stop"
    chunks = list(
        client.completions.create(model=tiny.name, prompt=PROMPT, max_tokens=30, stop=stop, stream=True, **GREEDY)
    )
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stop_token_ids(client, tiny):
    full = extra(greedy(client, tiny, max_tokens=12).choices[0], "token_ids")
    stop_id = full[4]
    cut = greedy(client, tiny, max_tokens=12, extra_body={"stop_token_ids": [stop_id]})
    choice = cut.choices[0]
    assert extra(choice, "token_ids") == full[: full.index(stop_id) + 1]
    assert choice.finish_reason == "stop"
    assert extra(choice, "stop_reason") == stop_id


def test_min_tokens_hold_back_stop_tokens(client, tiny):
    first = extra(greedy(client, tiny, max_tokens=1).choices[0], "token_ids")[0]
    response = client.completions.create(
        model=tiny.name,
        prompt=PROMPT,
        max_tokens=10,
        temperature=0,
        extra_body={"stop_token_ids": [first], "min_tokens": 4, "return_token_ids": True},
    )
    ids = extra(response.choices[0], "token_ids")
    assert len(ids) >= 4 and first not in ids[:4]
    assert response.choices[0].finish_reason == ("stop" if first in ids else "length")


def test_allowed_token_ids(client, tiny):
    response = client.completions.create(
        model=tiny.name,
        prompt=PROMPT,
        max_tokens=10,
        temperature=1,
        extra_body={"allowed_token_ids": [70, 71, 72], "return_token_ids": True},
    )
    assert set(extra(response.choices[0], "token_ids")) <= {70, 71, 72}


def test_skip_special_tokens(client, tiny):
    body = {"logit_bias": {"1": 100}, "ignore_eos": True, "return_token_ids": True}
    shown = client.completions.create(
        model=tiny.name, prompt=PROMPT, max_tokens=3, temperature=0, extra_body={**body, "skip_special_tokens": False}
    )
    assert extra(shown.choices[0], "token_ids") == [1, 1, 1]
    assert shown.choices[0].text == "</s></s></s>"
    hidden = client.completions.create(model=tiny.name, prompt=PROMPT, max_tokens=3, temperature=0, extra_body=body)
    assert hidden.choices[0].text == ""
    # without ignore_eos, </s> ends the completion
    eos = client.completions.create(
        model=tiny.name, prompt=PROMPT, max_tokens=3, temperature=0, extra_body={"logit_bias": {"1": 100}}
    )
    assert eos.choices[0].finish_reason == "stop" and eos.usage.completion_tokens == 1


def test_logprobs_zero_gives_the_sampled_token_only(client, tiny):
    response = greedy(client, tiny, max_tokens=5, logprobs=0)
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
    for token, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert top == {token: value}


def test_logprobs_three_keep_the_sampled_token(client, tiny):
    """Keyed by token text, entries of tokens with the same text merge (ids 400-511 of this model have no text
    in its 400-token tokenizer; see test_server_ops for the exact count with --return-tokens-as-token-ids)."""
    response = greedy(client, tiny, max_tokens=6, logprobs=3)
    logprobs = response.choices[0].logprobs
    for token, top in zip(logprobs.tokens, logprobs.top_logprobs, strict=True):
        assert 1 <= len(top) <= 4 and token in top
    distinct = [
        (tok, val, top)
        for tok, val, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True)
        if len(top) >= 3
    ]
    assert distinct
    for token, value, top in distinct:
        assert top[token] == value == max(top.values())


@pytest.mark.parametrize("count", [21, 30])
def test_too_many_logprobs(http, count):
    assert_error(http.post("/v1/completions", json={"prompt": PROMPT, "logprobs": count}), 400, param="logprobs")
    assert http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "logprobs": 20}).status_code == 200


def test_prompt_logprobs(client, tiny):
    response = greedy(client, tiny, max_tokens=2, extra_body={"prompt_logprobs": 2})
    entries = extra(response.choices[0], "prompt_logprobs")
    prompt_ids = tiny.tokenizer.encode(PROMPT)
    assert len(entries) == len(prompt_ids) and entries[0] is None
    for token_id, entry in zip(prompt_ids[1:], entries[1:], strict=True):
        assert str(token_id) in entry and len(entry) <= 3
        assert all(v["logprob"] <= 0 for v in entry.values())


def test_prompt_logprobs_with_stream_is_refused(http):
    response = http.post("/v1/completions", json={"prompt": PROMPT, "stream": True, "prompt_logprobs": 1})
    assert_error(response, 400, param="prompt_logprobs")


# -- bad prompts -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt",
    [[5, 512], [5, -1], "", [], [[]], [[3, 4], [600]]],
    ids=["out-of-vocab", "negative", "empty-text", "empty-list", "empty-ids", "oov-in-batch"],
)
def test_bad_prompts_are_refused(http, prompt):
    assert_error(http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}), 400)
    assert http.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 1}).status_code == 200


def test_unsupported_fields_are_refused(http):
    assert_error(http.post("/v1/completions", json={"prompt": PROMPT, "suffix": "x"}), 400, param="suffix")
    assert_error(http.post("/v1/completions", json={"prompt": PROMPT, "best_of": 2}), 400, param="best_of")


def test_truncate_prompt_tokens_keeps_the_last_tokens(client, tiny):
    text = "one two three four five six seven eight"
    ids = extra(greedy(client, tiny, prompt=text, max_tokens=1).choices[0], "prompt_token_ids")
    cut = greedy(client, tiny, prompt=text, max_tokens=6, extra_body={"truncate_prompt_tokens": 3})
    assert extra(cut.choices[0], "prompt_token_ids") == ids[-3:]
    assert cut.usage.prompt_tokens == 3
    assert extra(cut.choices[0], "token_ids") == hf_greedy(tiny.model, ids[-3:], 6)
    echoed = greedy(client, tiny, prompt=ids, max_tokens=1, echo=True, extra_body={"truncate_prompt_tokens": 3})
    assert echoed.choices[0].text.startswith(tiny.tokenizer.decode(ids[-3:]))
    fits = greedy(client, tiny, prompt=ids, max_tokens=1, extra_body={"truncate_prompt_tokens": -1})
    assert extra(fits.choices[0], "prompt_token_ids") == ids  # -1: the context length, which it fits


@pytest.mark.parametrize("value", [0, -2, 10**6])
def test_bad_truncate_prompt_tokens_is_refused(http, value):
    body = {"prompt": PROMPT, "max_tokens": 1, "truncate_prompt_tokens": value}
    assert_error(http.post("/v1/completions", json=body), 400, contains="truncate_prompt_tokens")


def test_return_tokens_as_token_ids_per_request(client, tiny):
    response = greedy(client, tiny, max_tokens=3, logprobs=2, extra_body={"return_tokens_as_token_ids": True})
    choice = response.choices[0]
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in extra(choice, "token_ids")]
    assert all(key.startswith("token_id:") for top in choice.logprobs.top_logprobs for key in top)
    plain = greedy(client, tiny, max_tokens=3, logprobs=2)  # the server's default: text
    assert "".join(plain.choices[0].logprobs.tokens) == plain.choices[0].text


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("length_penalty", 0.5),  # without use_beam_search
        ("thinking_token_budget", 16),
        ("repetition_detection", {"max_pattern_size": 4}),
        ("kv_transfer_params", {"do_remote_decode": True}),
        ("vllm_xargs", {"threshold": 1}),
        ("prompt_embeds", "AAAA"),
        ("ec_transfer_params", {"a": 1}),
        ("logprob_token_ids", [5, 6]),
        ("watermarking", True),
        ("stream_interval", 4),
        ("truncation_side", "right"),
    ],
)
def test_vllm_fields_for_what_llmp_does_not_do_are_refused_when_set(http, field, value):
    """Never ignored: a 400 naming the field when set, the idle value (vLLM's default) accepted."""
    body = {"prompt": PROMPT, "max_tokens": 1}
    response = http.post("/v1/completions", json={**body, field: value})
    assert_error(response, 400, param=field)
    assert field in response.json()["error"]["message"]
    idle = {"length_penalty": 1.0, "vllm_xargs": {}, "watermarking": False, "stream_interval": 1}.get(field)
    idle = {"truncation_side": "left"}.get(field, idle)
    assert http.post("/v1/completions", json={**body, field: idle}).status_code == 200


def test_unknown_fields_are_accepted_and_named_in_the_log(http, server):
    body = {"prompt": PROMPT, "max_tokens": 1, "no_such_field_xq": 1}
    assert http.post("/v1/completions", json=body).status_code == 200
    assert "present in the request but ignored: no_such_field_xq" in server.log()


# -- beam search (vLLM's use_beam_search) ------------------------------------------------


def test_beam_search_equals_transformers_beam_search(client, tiny):
    from llmp.testing import hf_beam_search

    body = {"use_beam_search": True, "ignore_eos": True, "return_token_ids": True}
    response = client.completions.create(
        model=tiny.name, prompt=PROMPT, max_tokens=5, n=3, temperature=0, extra_body=body
    )
    prompt_ids = tiny.tokenizer.encode(PROMPT)
    beams = hf_beam_search(tiny.model, prompt_ids, 3, 5)
    assert [extra(choice, "token_ids") for choice in response.choices] == beams
    assert [choice.index for choice in response.choices] == [0, 1, 2]
    assert {choice.finish_reason for choice in response.choices} == {"length"}
    assert response.usage.completion_tokens == 15
    streamed = client.completions.create(
        model=tiny.name, prompt=PROMPT, max_tokens=5, n=3, temperature=0, extra_body=body, stream=True
    )
    texts = {}
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert [texts[i] for i in range(3)] == [choice.text for choice in response.choices]


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"top_p": 0.5}, "top_p"),
        ({"seed": 3}, "seed"),
        ({"logprobs": 2}, "logprobs"),
        ({"stop": ["x"]}, "stop"),
        ({"structured_outputs": {"regex": "[a-z]+"}}, "use_beam_search"),
        ({"n": 1000}, "n"),
    ],
)
def test_beam_search_refuses_what_it_cannot_honour(http, tiny, fields, param):
    body = {"model": tiny.name, "prompt": PROMPT, "max_tokens": 3, "use_beam_search": True, **fields}
    assert_error(http.post("/v1/completions", json=body), 400, param=param)
    body = {"model": tiny.name, "prompt": PROMPT, "max_tokens": 3, "length_penalty": 0.5}  # without beam search
    assert_error(http.post("/v1/completions", json=body), 400, param="length_penalty", contains="use_beam_search")
    # values that change nothing, which many clients send always, are taken
    neutral = {"top_p": 1.0, "top_k": -1, "frequency_penalty": 0.0, "presence_penalty": 0, "min_p": 0}
    body = {"model": tiny.name, "prompt": PROMPT, "max_tokens": 2, "use_beam_search": True, "n": 2, **neutral}
    assert http.post("/v1/completions", json=body).status_code == 200


def test_beam_search_keeps_the_cache_salt(ops_http):
    """Each beam step runs under the request's cache_salt: a later request of that salt reads the prompt's
    blocks from the prefix cache, one of another salt does not (--enable-prompt-tokens-details counts them)."""
    prompt = "salted beams " + " ".join(f"w{i}" for i in range(24))
    beams = {"prompt": prompt, "max_tokens": 2, "n": 2, "use_beam_search": True, "cache_salt": "tenant-a"}
    assert ops_http.post("/v1/completions", json=beams).status_code == 200

    def cached(salt: str) -> int:
        body = {"prompt": prompt, "max_tokens": 1, "cache_salt": salt}
        return ops_http.post("/v1/completions", json=body).json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("tenant-b") == 0 and cached("tenant-a") > 0
