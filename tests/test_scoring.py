"""``llmp.scoring``: the pair checks, the cross-encoder prompt of a pair, cosine scores and the rerank order."""

from __future__ import annotations

import math

import pytest

from llmp.scoring import (
    ScoreInputError,
    cosine_scores,
    cross_encoder_prompts,
    rerank_order,
    text_prompt,
    truncation_length,
    validate_score_input,
)
from llmp.testing import tiny_pair_tokenizer, tiny_tokenizer


def cross_encoder_prompt(tokenizer, query, document, **options):
    """The prompt of one pair."""
    return cross_encoder_prompts(tokenizer, [query], [document], **options)[0]


@pytest.fixture(scope="module")
def pair_tokenizer():
    return tiny_pair_tokenizer()


def test_pairs_one_to_one_one_to_many_and_many_to_many():
    assert validate_score_input("q", "d") == (["q"], ["d"])
    assert validate_score_input("q", ["a", "b", "c"]) == (["q", "q", "q"], ["a", "b", "c"])
    assert validate_score_input(["q"], ["a", "b"]) == (["q", "q"], ["a", "b"])
    assert validate_score_input(["q1", "q2"], ["a", "b"]) == (["q1", "q2"], ["a", "b"])


@pytest.mark.parametrize(
    ("data_1", "data_2", "message", "param"),
    [
        (["a", "b"], ["x", "y", "z"], "Input lengths must be either 1:1, 1:N or N:N", "documents"),
        (["a", "b"], [], "Input lengths must be either 1:1, 1:N or N:N", "documents"),
        ([], ["x"], "At least one text element must be given", "query"),
        ("q", [], "At least one text_pair element must be given", "documents"),
        ("", ["x"], "query must not hold an empty string", "query"),
        ("q", ["x", ""], "documents must not hold an empty string", "documents"),
        ("q", ["x", 3], "documents must be a string or a list of strings", "documents"),
        ("q\ud800", ["x"], "query holds text that is not valid Unicode (a lone surrogate)", "query"),
        ("q", ["x", "\udfffy"], "documents holds text that is not valid Unicode (a lone surrogate)", "documents"),
    ],
)
def test_bad_pairs_name_the_field(data_1, data_2, message, param):
    with pytest.raises(ScoreInputError) as caught:
        validate_score_input(data_1, data_2, names=("query", "documents"))
    assert str(caught.value) == message
    assert caught.value.param == param
    assert isinstance(caught.value, ValueError)


def test_default_names_are_vllms_data_fields():
    with pytest.raises(ScoreInputError) as caught:
        validate_score_input("q", "")
    assert caught.value.param == "data_2"
    assert str(caught.value) == "data_2 must not hold an empty string"


def test_truncation_length():
    assert truncation_length(None, 512) is None
    assert truncation_length(-1, 512) == 512
    assert truncation_length(1, 512) == 1
    assert truncation_length(100, 512) == 100
    assert truncation_length(512, 512) == 512
    with pytest.raises(ScoreInputError) as caught:
        truncation_length(600, 512)
    assert str(caught.value) == "truncate_prompt_tokens (600) must be <= max_model_len (512)"
    assert caught.value.param == "truncate_prompt_tokens"
    for keeps_nothing_or_less in (0, -2):  # as PoolingParams refuses them
        with pytest.raises(ScoreInputError) as caught:
            truncation_length(keeps_nothing_or_less, 512)
        assert str(caught.value) == f"truncate_prompt_tokens must be -1 or an integer >= 1, got {keeps_nothing_or_less}"
        assert caught.value.param == "truncate_prompt_tokens"


def test_cross_encoder_prompt_is_the_tokenizers_pair_encoding(pair_tokenizer):
    query, document = "the quick brown fox", "paged attention keeps blocks"
    prompt = cross_encoder_prompt(pair_tokenizer, query, document, use_sep_token=True, max_model_len=128)
    expected = pair_tokenizer(text=query, text_pair=document)
    assert prompt.token_ids == expected["input_ids"]
    assert prompt.token_type_ids == expected["token_type_ids"]
    assert prompt.token_ids[0] == pair_tokenizer.cls_token_id
    assert prompt.token_ids.count(pair_tokenizer.sep_token_id) == 2
    assert set(prompt.token_type_ids) == {0, 1}  # the document's segment is type 1


def test_cross_encoder_truncation_is_the_tokenizers_longest_first(pair_tokenizer):
    query, document = "the quick brown fox jumps", "continuous batching serves many requests at once step by step"
    whole = cross_encoder_prompt(pair_tokenizer, query, document, use_sep_token=True, max_model_len=128)
    cut = cross_encoder_prompt(
        pair_tokenizer, query, document, use_sep_token=True, truncate_prompt_tokens=12, max_model_len=128
    )
    expected = pair_tokenizer(text=query, text_pair=document, truncation=True, max_length=12)
    assert len(whole.token_ids) > 12
    assert cut.token_ids == expected["input_ids"] and len(cut.token_ids) == 12
    assert cut.token_type_ids == expected["token_type_ids"]
    assert cut.token_ids[-1] == pair_tokenizer.sep_token_id  # special tokens are kept
    everything = cross_encoder_prompt(
        pair_tokenizer, query, document, use_sep_token=True, truncate_prompt_tokens=-1, max_model_len=128
    )
    assert everything.token_ids == whole.token_ids


def test_a_pair_truncated_below_its_special_tokens_is_refused(pair_tokenizer):
    """The tokenizer would only warn and keep the pair whole: [CLS] q [SEP] d [SEP] has three."""
    for limit in (1, 2):
        with pytest.raises(ScoreInputError) as caught:
            cross_encoder_prompt(
                pair_tokenizer, "q fox", "a dog", use_sep_token=True, truncate_prompt_tokens=limit, max_model_len=128
            )
        assert str(caught.value) == f"truncate_prompt_tokens ({limit}) is below the 3 special tokens of a pair"
        assert caught.value.param == "truncate_prompt_tokens"
    bare = cross_encoder_prompt(
        pair_tokenizer, "q fox", "a dog", use_sep_token=True, truncate_prompt_tokens=3, max_model_len=128
    )
    assert bare.token_ids == [pair_tokenizer.cls_token_id] + [pair_tokenizer.sep_token_id] * 2


def test_an_over_long_pair_names_its_index_and_length(pair_tokenizer):
    document = " ".join(["fox"] * 40)
    with pytest.raises(ScoreInputError) as caught:
        cross_encoder_prompts(
            pair_tokenizer, ["q"] * 4, ["a", "b", "c", document], use_sep_token=True, max_model_len=16
        )
    length = len(pair_tokenizer(text="q", text_pair=document)["input_ids"])
    assert str(caught.value) == (
        f"the pair at index 3 is {length} tokens long; this model takes at most 16 "
        "(set truncate_prompt_tokens to truncate)"
    )
    assert caught.value.param == "data_2"


def test_pairs_tokenized_together_equal_each_alone(pair_tokenizer):
    queries = ["the quick brown fox", "paged attention", "a"]
    documents = ["jumps over the lazy dog", "keeps the cache in blocks of sixteen tokens", "b c d"]
    for limit in (None, 9):
        together = cross_encoder_prompts(
            pair_tokenizer, queries, documents, use_sep_token=True, truncate_prompt_tokens=limit, max_model_len=128
        )
        alone = [
            cross_encoder_prompt(
                pair_tokenizer, q, d, use_sep_token=True, truncate_prompt_tokens=limit, max_model_len=128
            )
            for q, d in zip(queries, documents, strict=True)
        ]
        assert together == alone


def test_llm_reranker_prompt_is_the_joined_text_truncated_from_the_left():
    tokenizer = tiny_tokenizer()
    query, document = "The quick brown fox", " jumps over the lazy dog."
    prompt = cross_encoder_prompt(tokenizer, query, document, use_sep_token=False, max_model_len=512)
    assert prompt.token_ids == tokenizer.encode(query + document)
    assert prompt.token_type_ids is None
    cut = cross_encoder_prompt(
        tokenizer, query, document, use_sep_token=False, truncate_prompt_tokens=4, max_model_len=512
    )
    assert cut.token_ids == tokenizer.encode(query + document)[-4:]


def test_llm_reranker_prompt_through_a_score_template():
    tokenizer = tiny_tokenizer()
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    prompt = cross_encoder_prompt(
        tokenizer, "the fox", "a dog", use_sep_token=False, max_model_len=512, chat_template=template
    )
    assert prompt.token_ids == tokenizer.encode("<query>the fox\n<document>a dog\n")
    with pytest.raises(ScoreInputError, match="score template could not be applied"):
        cross_encoder_prompt(tokenizer, "q", "d", use_sep_token=False, max_model_len=512, chat_template="{{ nope(")
    with pytest.raises(ScoreInputError, match="only to LLM rerankers"):
        cross_encoder_prompt(
            tiny_pair_tokenizer(), "q", "d", use_sep_token=True, max_model_len=512, chat_template=template
        )


def test_text_prompt_truncates_from_the_left_and_checks_the_length():
    tokenizer = tiny_tokenizer()
    text = "Paged attention keeps the KV cache in fixed-size blocks."
    ids = tokenizer.encode(text)
    assert text_prompt(tokenizer, text, max_model_len=512).token_ids == ids
    assert text_prompt(tokenizer, text, truncate_prompt_tokens=3, max_model_len=512).token_ids == ids[-3:]
    with pytest.raises(ScoreInputError, match=f"the text is {len(ids)} tokens long; this model takes at most 3"):
        text_prompt(tokenizer, text, max_model_len=3)
    # a tokenizer that puts [CLS] and [SEP] around a text keeps them: its text loses its start (vLLM's cut)
    bert = tiny_pair_tokenizer()
    ids, plain = bert.encode(text), bert.encode(text, add_special_tokens=False)
    assert ids == [bert.cls_token_id, *plain, bert.sep_token_id]
    cut = text_prompt(bert, text, truncate_prompt_tokens=4, max_model_len=512).token_ids
    assert cut == [bert.cls_token_id, *plain[-2:], bert.sep_token_id]
    bert.truncation_side = "left"
    assert cut == bert(text, truncation=True, max_length=4)["input_ids"]  # what transformers' own truncation gives


def test_cosine_scores():
    scores = cosine_scores(
        [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [3.0, 4.0]], [[0.0, 2.0], [2.0, 2.0], [1.0, 0.0], [-3.0, -4.0]]
    )
    assert scores[0] == pytest.approx(0.0)
    assert scores[1] == pytest.approx(1.0)
    assert scores[2] == 0.0  # a zero vector
    assert scores[3] == pytest.approx(-1.0)
    a, b = [0.3, -1.2, 2.5], [1.1, 0.4, -0.7]
    dot = sum(x * y for x, y in zip(a, b))
    assert cosine_scores([a], [b])[0] == pytest.approx(dot / math.hypot(*a) / math.hypot(*b))
    with pytest.raises(ValueError):
        cosine_scores([[1.0]], [[1.0], [2.0]])


def test_rerank_order_is_descending_stable_and_cut():
    scores = [0.1, 0.9, 0.5, 0.9, -2.0]
    assert rerank_order(scores) == [1, 3, 2, 0, 4]  # the tie (1, 3) keeps input order
    assert rerank_order(scores, 0) == [1, 3, 2, 0, 4]
    assert rerank_order(scores, None) == [1, 3, 2, 0, 4]
    assert rerank_order(scores, -1) == [1, 3, 2, 0, 4]
    assert rerank_order(scores, 2) == [1, 3]
    assert rerank_order(scores, 10) == [1, 3, 2, 0, 4]
    assert rerank_order([], 3) == []
