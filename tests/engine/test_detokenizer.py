"""IncrementalDetokenizer and find_stop_string, on real tokenizers built offline.

Two tokenizers are trained on a tiny corpus at import time (well under a
second): a GPT-2 style byte-level BPE and a Llama style SentencePiece BPE with
byte fallback. Both split some characters (accented letters, CJK, emoji)
across several tokens, which is what the detokenizer must cope with.
"""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from llmp.engine.detokenizer import IncrementalDetokenizer, find_stop_string

CORPUS = [
    "Hello world, this is a test of the tokenizer.",
    "The quick brown fox jumps over the lazy dog.",
    "Café crème brûlée, naïve façade, résumé.",
    "日本語のテキストです。中文字符测试。",
    "Emoji 😀🎉👍🏽 and a family 👨‍👩‍👧 too.",
] * 20

TEXTS = [
    "Hello 世界 😀 naïve",
    "unseen Ωmega ✓ 🐍 end",  # characters absent from the corpus: byte tokens / rare bytes
    "Café crème brûlée",
    "日本語のテキスト",
    "👨‍👩‍👧 and 👍🏽!",
    "  leading spaces",
    "a  b   c ",
    "x",
    "Ünïcödé ßtraße — “quotes” … 😀😀",
    "The quick brown fox, 中文 and émojis 🎉 jump over the lazy dog again and again.",
]


def _byte_level_bpe() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|bos|>", "<|eos|>", "<|unk|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", unk_token="<|unk|>")


def _sentencepiece_bpe() -> PreTrainedTokenizerFast:
    """Llama's tokenizer.json layout: byte_fallback BPE, ▁ for spaces, Replace/ByteFallback/Fuse/Strip decoder."""
    normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.normalizer = normalizer
    # limit_alphabet leaves rare characters out of the vocabulary: they become <0xNN> byte tokens
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=60, show_progress=False
    )
    base.train_from_iterator(CORPUS, trainer)
    model = json.loads(base.to_str())["model"]
    vocab = dict(model["vocab"])
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizer
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.fixture(scope="module", params=["byte_level_bpe", "sentencepiece_bpe"])
def tokenizer(request: pytest.FixtureRequest) -> PreTrainedTokenizerFast:
    return {"byte_level_bpe": _byte_level_bpe, "sentencepiece_bpe": _sentencepiece_bpe}[request.param]()


def _texts() -> list[str]:
    rng = random.Random(0)
    words = " ".join(TEXTS).split(" ")
    mixed = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(10)]
    return TEXTS + mixed


def _run(tokenizer, prompt: list[int], output: list[int], skip: bool) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=skip)
    return [detok.add_token(t) for t in output]


def _expected(tokenizer, prompt: list[int], output: list[int], skip: bool) -> str | None:
    prompt_text = tokenizer.decode(prompt, skip_special_tokens=skip)
    full = tokenizer.decode(prompt + output, skip_special_tokens=skip)
    return full[len(prompt_text) :] if full.startswith(prompt_text) else None


def test_tokenizers_split_characters_across_tokens(tokenizer):
    """Precondition of the other tests: some single characters take several tokens."""
    split = 0
    for text in TEXTS:
        for token_id in tokenizer.encode(text, add_special_tokens=False):
            piece = tokenizer.decode([token_id])
            split += "\ufffd" in piece
    assert split >= 5
    assert tokenizer.decode(tokenizer.encode(TEXTS[0], add_special_tokens=False)) == TEXTS[0]


@pytest.mark.parametrize("bos", [False, True])
def test_deltas_concatenate_to_full_decode_at_every_split(tokenizer, bos):
    """Prompt = the first k tokens of a text, output = the rest plus EOS, for every k."""
    checked = 0
    for text in _texts():
        ids = tokenizer.encode(text, add_special_tokens=False)
        for k in range(len(ids) + 1):
            prompt = ([tokenizer.bos_token_id] if bos else []) + ids[:k]
            output = ids[k:] + [tokenizer.eos_token_id]
            expected = _expected(tokenizer, prompt, output, skip=True)
            if expected is None:  # the prompt ends inside a character
                continue
            deltas = _run(tokenizer, prompt, output, skip=True)
            assert "".join(deltas) == expected, (text, k, deltas)
            assert not any("\ufffd" in d for d in deltas), (text, k, deltas)
            checked += 1
    assert checked > 200


def test_text_is_emitted_as_soon_as_each_character_completes(tokenizer):
    """After every token, the text so far equals the full decode so far (unless that ends mid-character)."""
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        for k in range(0, len(ids) + 1, 3):
            prompt = [tokenizer.bos_token_id] + ids[:k]
            prompt_text = tokenizer.decode(prompt, skip_special_tokens=True)
            detok = IncrementalDetokenizer(tokenizer, prompt)
            so_far = ""
            for j, token in enumerate(ids[k:]):
                so_far += detok.add_token(token)
                full = tokenizer.decode(prompt + ids[k : k + j + 1], skip_special_tokens=True)
                if full.startswith(prompt_text) and not full.endswith("\ufffd"):
                    assert so_far == full[len(prompt_text) :], (text, k, j)
            assert detok.text == so_far


def test_whole_text_as_output_after_bos(tokenizer):
    """The usual case: prompt is BOS plus a sentence, output a sentence with multi-token characters."""
    prompt = [tokenizer.bos_token_id] + tokenizer.encode("Hello world,", add_special_tokens=False)
    output = tokenizer.encode(" 日本語 😀 naïve façade ✓", add_special_tokens=False)
    deltas = _run(tokenizer, prompt, output, skip=True)
    assert "".join(deltas) == _expected(tokenizer, prompt, output, skip=True)
    assert "".join(deltas).strip() == "日本語 😀 naïve façade ✓"
    assert "" in deltas  # some token ended mid-character and emitted nothing yet
    assert not any("\ufffd" in d for d in deltas)


def test_a_prompt_ending_in_byte_tokens_leaves_no_character_unshown():
    """The context window starts inside a character: its stray bytes must not spoil the output's text.

    Byte fallback decodes a run of byte tokens with one invalid byte as U+FFFD for every byte, so
    a window that began mid-character once hid the output's "!" (a byte token) for good."""
    tokenizer = _sentencepiece_bpe()

    def byte_ids(text: str) -> list[int]:
        return tokenizer.convert_tokens_to_ids([f"<0x{b:02X}>" for b in text.encode()])

    for tail in ["😀🐍", "👍🏽", "Ω😀✓"]:
        for lead in ["a", "a b", "Hello world, a"]:
            prompt = tokenizer.encode(lead, add_special_tokens=False) + byte_ids(tail)
            for output in [byte_ids("!") + [tokenizer.eos_token_id], byte_ids("🐍 x"), tokenizer.encode(" ok")]:
                expected = _expected(tokenizer, prompt, output, skip=True)
                assert expected is not None and "\ufffd" not in expected
                assert "".join(_run(tokenizer, prompt, output, skip=True)) == expected, (lead, tail, output)


def test_special_tokens_dropped_when_skipping(tokenizer):
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    prompt = [bos] + tokenizer.encode("Hi", add_special_tokens=False) + [eos, bos]
    there, ok = (tokenizer.encode(t, add_special_tokens=False) for t in (" there 😀", " ok"))
    output = there + [eos, bos] + ok
    detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=True)
    deltas = [detok.add_token(t) for t in output]
    text = "".join(deltas)
    assert text == _expected(tokenizer, prompt, output, skip=True)
    assert "😀" in text and text.rstrip().endswith("ok")
    for special in (tokenizer.bos_token, tokenizer.eos_token):
        assert special not in text
    for token, delta in zip(output, deltas, strict=True):
        if token in (bos, eos):
            assert delta == ""


def test_special_tokens_kept_when_not_skipping(tokenizer):
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    prompt = [bos] + tokenizer.encode("Hi", add_special_tokens=False)
    there, ok = (tokenizer.encode(t, add_special_tokens=False) for t in (" there 😀", " ok"))
    output = there + [eos] + ok + [eos]
    deltas = _run(tokenizer, prompt, output, skip=False)
    text = "".join(deltas)
    assert text == _expected(tokenizer, prompt, output, skip=False)
    assert text.count(tokenizer.eos_token) == 2
    assert text.endswith(tokenizer.eos_token)
    assert deltas[-1] == tokenizer.eos_token
    # the prompt's BOS is context, not output
    assert tokenizer.bos_token not in text


def test_ids_past_the_vocabulary_emit_nothing(tokenizer):
    """Padded embedding rows can be sampled: they give no text and do not disturb what follows."""
    prompt = [tokenizer.bos_token_id] + tokenizer.encode("Hello", add_special_tokens=False)
    output = tokenizer.encode(" wörld 😀", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt)
    deltas = [detok.add_token(output[0]), detok.add_token(len(tokenizer) + 7)]
    deltas += [detok.add_token(t) for t in output[1:]]
    assert deltas[1] == ""
    assert "".join(deltas) == _expected(tokenizer, prompt, output, skip=True)


def test_prompt_ids_past_the_vocabulary_are_skipped(tokenizer):
    oov = len(tokenizer) + 3
    text_ids = tokenizer.encode("Hello 日本", add_special_tokens=False)
    output = tokenizer.encode("語 😀 ok", add_special_tokens=False)
    deltas = _run(tokenizer, [tokenizer.bos_token_id] + text_ids + [oov], output, skip=True)
    assert "".join(deltas) == _expected(tokenizer, [tokenizer.bos_token_id] + text_ids, output, skip=True)


def test_flush_emits_the_held_back_tail_like_a_full_decode(tokenizer):
    """A sequence that ends inside a character: flush gives what a full decode gives (with U+FFFD)."""
    flushed_something = 0
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        prompt = [tokenizer.bos_token_id] + ids[:2]
        for end in range(3, len(ids) + 1):
            output = ids[2:end]
            expected = _expected(tokenizer, prompt, output, skip=True)
            if expected is None:  # the prompt ends inside a character
                break
            detok = IncrementalDetokenizer(tokenizer, prompt)
            deltas = [detok.add_token(t) for t in output]
            tail = detok.flush()
            got = "".join(deltas) + tail
            if got != expected:
                # A byte-fallback decoder turns a whole run of byte tokens into U+FFFD when the
                # run ends mid-character, complete characters in it included; the incremental
                # text keeps those it already emitted. Only that difference is allowed.
                assert got.endswith("\ufffd") and expected.endswith("\ufffd"), (text, end)
                assert got.rstrip("\ufffd").startswith(expected.rstrip("\ufffd")), (text, end)
            assert detok.text == "".join(deltas) + tail
            flushed_something += tail != ""
            assert detok.flush() == ""  # nothing left the second time
    assert flushed_something >= 3


def test_flush_with_nothing_held_back_is_empty(tokenizer):
    prompt = [tokenizer.bos_token_id] + tokenizer.encode("Hi", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt)
    deltas = [detok.add_token(t) for t in tokenizer.encode(" 😀 done", add_special_tokens=False)]
    assert detok.flush() == ""
    assert detok.text == "".join(deltas)
    # decoding continues normally after a flush
    more = [detok.add_token(t) for t in tokenizer.encode(" ünï", add_special_tokens=False)]
    assert "".join(more).strip() == "ünï"


# ---------------------------------------------------------------- find_stop_string


def _stream(deltas: list[str], stops: list[str], include: bool) -> tuple[int, tuple[str, int] | None, str]:
    """Feed deltas as the output processor does; return the call index that found a stop, the result, the text."""
    text = ""
    for i, delta in enumerate(deltas):
        text += delta
        found = find_stop_string(text, len(delta), stops, include)
        if found is not None:
            return i, found, text
    return -1, None, text


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_split_across_deltas_is_found(include):
    index, found, text = _stream(["Hel", "lo <", "|en", "d|", "> tail"], ["<|end|>"], include)
    assert index == 4  # only the delta that completes it
    stop, cut = found
    assert stop == "<|end|>"
    assert text[:cut] == ("Hello <|end|>" if include else "Hello ")


def test_stop_string_not_completed_is_not_found():
    assert _stream(["Hello <", "|en", "d"], ["<|end|>"], False)[1] is None
    assert find_stop_string("abc", 3, ["abcd"], False) is None


def test_stop_string_in_old_text_is_not_found_again():
    # "STOP" lies wholly before the 3 new characters: an earlier call would have found it
    assert find_stop_string("xSTOP!!!", 3, ["STOP"], False) is None
    # one new character completing it is enough
    assert find_stop_string("xSTOP", 1, ["STOP"], False) == ("STOP", 1)


@pytest.mark.parametrize(("include", "cut"), [(False, 2), (True, 5)])
def test_cut_excludes_stop_unless_include(include, cut):
    assert find_stop_string("ab###cd###", 8, ["###"], include) == ("###", cut)


def test_earliest_occurrence_of_a_stop_string():
    assert find_stop_string("a;b;c", 5, [";"], False) == (";", 1)
    assert find_stop_string("a;b;c", 5, [";"], True) == (";", 2)


def test_earliest_stop_when_first_listed_is_earliest():
    assert find_stop_string("say hello world", 15, ["hello", "world"], False) == ("hello", 4)


def test_earliest_stop_among_several_in_one_delta():
    # One delta completes both stops; the text must be cut at the earlier one, else the
    # emitted text "say hello " would contain the stop string "hello".
    assert find_stop_string("say hello world", 15, ["world", "hello"], False) == ("hello", 4)
    assert find_stop_string("say hello world", 15, ["world", "hello"], True) == ("hello", 9)


def test_spaces_between_special_tokens_false_joins_consecutive_special_tokens():
    """vLLM's fast-detokenizer rule: with special tokens kept, one that follows another is its bare
    content. A WordPiece decoder (the packaged MiniLM's) puts a space between any two tokens."""
    from llmp.model_files.tokenizer import load_tokenizer
    from llmp.testing import minilm_dir

    tokenizer = load_tokenizer(minilm_dir())
    prompt = tokenizer.encode("hello world", add_special_tokens=False)
    word, sep, cls = prompt[-1], tokenizer.sep_token_id, tokenizer.cls_token_id

    def text(**flags: bool) -> str:
        detok = IncrementalDetokenizer(tokenizer, prompt, **flags)
        return "".join(detok.add_token(t) for t in (word, sep, cls, sep, word)) + detok.flush()

    assert text(skip_special_tokens=False) == " world [SEP] [CLS] [SEP] world"
    assert text(skip_special_tokens=False, spaces_between_special_tokens=False) == " world [SEP][CLS][SEP] world"
    assert text(skip_special_tokens=True, spaces_between_special_tokens=False) == " world world"
