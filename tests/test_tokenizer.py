"""llmp's Tokenizer (tokenizer.json read by Hugging Face tokenizers alone) against transformers' tokenizer
of the same directory, and what loads which."""

from __future__ import annotations

import json
import pickle
import random
import subprocess
import sys

import pytest
from transformers import PreTrainedTokenizerFast

from llmp.model_files.tokenizer import Tokenizer, load_tokenizer, transformers_tokenizer
from llmp.testing import TINY_CORPUS, tiny_tokenizer

TEXTS = [
    *TINY_CORPUS,
    "",
    " ",
    "  two  spaces\n\n\ta tab",
    "<s>inside</s> specials <unk>",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
    "Ünïcödé 🙂 東京",
]


def default_model_tokenizer_dir():
    """The default model's tokenizer as llmp reads it from its GGUF file (written once into llmp's cache)."""
    from llmp.config import EngineConfig
    from llmp.model_files.resolve import resolve_model
    from llmp.options import DEFAULT_MODEL

    return resolve_model(EngineConfig(model=DEFAULT_MODEL)).tokenizer


def run_fresh(script: str) -> str:
    """``script``'s output, run by a fresh interpreter (one that has not imported transformers yet)."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module", params=["tiny", "default-model"])
def tokenizer_dir(request, tmp_path_factory):
    if request.param == "default-model":
        return default_model_tokenizer_dir()
    path = tmp_path_factory.mktemp("tiny-tokenizer")
    tiny_tokenizer().save_pretrained(path)
    return str(path)


def test_answers_as_transformers_tokenizer_of_the_same_directory(tokenizer_dir):
    light = load_tokenizer(tokenizer_dir)
    full = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    assert isinstance(light, Tokenizer)
    for name in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"):
        assert getattr(light, name) == getattr(full, name), name
        assert getattr(light, f"{name}_id") == getattr(full, f"{name}_id"), name
    assert light.all_special_tokens == full.all_special_tokens
    assert light.all_special_ids == full.all_special_ids
    assert (light.vocab_size, len(light)) == (full.vocab_size, len(full))
    assert light.get_vocab() == full.get_vocab()
    assert {i: str(t) for i, t in light.added_tokens_decoder.items()} == {
        i: str(t) for i, t in full.added_tokens_decoder.items()
    }
    assert light.num_special_tokens_to_add() == full.num_special_tokens_to_add()
    rng = random.Random(0)
    for text in TEXTS:
        for add_special_tokens in (True, False):
            assert light.encode(text, add_special_tokens=add_special_tokens) == full.encode(
                text, add_special_tokens=add_special_tokens
            ), text
        assert light.tokenize(text) == full.tokenize(text)
        ids = full.encode(text) + [rng.randrange(len(full)) for _ in range(24)] + full.all_special_ids
        for skip in (False, True):
            assert light.decode(ids, skip_special_tokens=skip) == full.decode(ids, skip_special_tokens=skip)
            assert light.convert_ids_to_tokens(ids, skip_special_tokens=skip) == full.convert_ids_to_tokens(
                ids, skip_special_tokens=skip
            )
        assert light.decode([ids, ids[:3]]) == full.decode([ids, ids[:3]])
        assert light.batch_decode([ids, ids[:3]], skip_special_tokens=True) == full.batch_decode(
            [ids, ids[:3]], skip_special_tokens=True
        )
        assert light.decode(ids[0]) == full.decode(ids[0])
        assert light.convert_ids_to_tokens(ids[0]) == full.convert_ids_to_tokens(ids[0])
        tokens = full.convert_ids_to_tokens(ids)
        assert light.convert_tokens_to_string(tokens) == full.convert_tokens_to_string(tokens)
        assert light.convert_tokens_to_ids([*tokens, "not a token"]) == full.convert_tokens_to_ids(
            [*tokens, "not a token"]
        )


def test_what_it_does_not_do_itself_is_transformers_tokenizers(tokenizer_dir):
    light = load_tokenizer(tokenizer_dir)
    full = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    rendered = light.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == full.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert light("a b c")["input_ids"] == full("a b c")["input_ids"]
    assert light.encode("a b c", truncation=True, max_length=2) == full.encode("a b c", truncation=True, max_length=2)
    assert isinstance(transformers_tokenizer(light), PreTrainedTokenizerFast)
    assert transformers_tokenizer(full) is full
    copy = pickle.loads(pickle.dumps(light))
    assert copy.encode(TEXTS[0]) == light.encode(TEXTS[0])
    with pytest.raises(AttributeError):
        light.no_such_attribute  # noqa: B018
    assert light.encode(["pre", "split"], is_split_into_words=True) == full.encode(
        ["pre", "split"], is_split_into_words=True
    )
    with pytest.raises(TypeError, match="read-only"):  # its vocabulary is the engine's
        light.add_tokens(["<new>"])


@pytest.mark.parametrize(
    "change",
    [
        {"add_bos_token": True},  # transformers rewrites the post-processor
        {"split_special_tokens": True},
        {"bos_token": "<never-seen>"},  # transformers adds it to the vocabulary
    ],
)
def test_a_config_it_does_not_reproduce_loads_transformers_tokenizer(tmp_path, change):
    tiny_tokenizer().save_pretrained(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **change}))
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, PreTrainedTokenizerFast)


def test_the_default_model_loads_and_generates_without_importing_transformers():
    """Its engine (LLM(), a generate, the detokenizer, the end tokens) never needs transformers: the memory
    loading the model adds is the weights and tokenizers' tokenizer (docs/benchmarks.md)."""
    script = (
        "import sys\n"
        "from llmp import LLM, SamplingParams\n"
        "llm = LLM(num_threads=1)\n"
        "out = llm.generate(['The capital of France is'], SamplingParams(max_tokens=4, temperature=0))\n"
        "assert len(out[0].outputs[0].token_ids) == 4, out\n"
        "assert out[0].outputs[0].text, out\n"
        "print('transformers' in sys.modules)\n"
    )
    assert run_fresh(script).split()[-1] == "False"


def test_threads_first_using_transformers_tokenizer_together_all_get_it(tmp_path):
    """The first chat template of a process imports transformers; threads asking at once (the API server's
    requests) wait for one import instead of failing on a half-imported module."""
    tiny_tokenizer().save_pretrained(tmp_path)
    script = (
        "import sys, concurrent.futures\n"
        "from llmp.model_files.tokenizer import load_tokenizer\n"
        f"tokenizer = load_tokenizer({str(tmp_path)!r})\n"
        "assert 'transformers' not in sys.modules\n"
        "messages = [{'role': 'user', 'content': 'hi'}]\n"
        "with concurrent.futures.ThreadPoolExecutor(8) as pool:\n"
        "    done = list(pool.map(lambda _: tokenizer.apply_chat_template(messages, tokenize=False), range(8)))\n"
        "assert len(set(done)) == 1, done\n"
    )
    run_fresh(script)
