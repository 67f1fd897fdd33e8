"""Which tasks a model serves: the primary task from the architecture's name or the options
(``task``, ``runner``, ``convert``), the tasks it supports, its pooler and score mode, ``hf_overrides``
and ``classifier_from_token``, and the one-line refusals. Config directories only (no weights):
resolution reads config.json, the tokenizer and the model class."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmp import hookimpl, plugins, registry
from llmp.api import ModelSpec, UnknownComponentError
from llmp.config import load_records
from llmp.frontend.startup import frontend_options
from llmp.model_files.resolve import check_resolved, resolve_model
from llmp.options import EngineConfig, FrontendOptions
from llmp.testing import TINY_DECODER, TINY_ENCODER, registered, run_llmp, tiny_pair_tokenizer, tiny_tokenizer

GENERATE = ("generate",)
EMBED = ("embed", "token_embed", "score")
CROSS_ENCODER = ("classify", "token_classify", "score")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMP_CACHE_DIR", str(tmp_path / "cache"))


def model_dir(path: Path, architecture: str, **values) -> Path:
    """A model directory of config.json (of ``architecture``'s config class) and a tiny tokenizer."""
    import transformers

    encoder = architecture.startswith(("Bert", "DistilBert", "Tiny"))  # Tiny*: records of this file, on BERT
    config_cls = (
        transformers.BertConfig if architecture.startswith("Tiny") else getattr(transformers, architecture).config_class
    )
    tokenizer = tiny_pair_tokenizer() if encoder else tiny_tokenizer()
    defaults = {**TINY_ENCODER, "vocab_size": len(tokenizer)} if encoder else dict(TINY_DECODER)
    config_cls(**{**defaults, "architectures": [architecture], **values}).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def resolve(path: Path, **options):
    return resolve_model(EngineConfig(model=str(path), **options))


def one_line_error(path: Path, **options) -> str:
    with pytest.raises(ValueError) as caught:
        resolve(path, **options)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


# -- auto: the architecture's name -----------------------------------------------------------


@pytest.mark.parametrize(
    ("architecture", "values", "task", "supported", "pooling", "score_mode"),
    [
        ("LlamaForCausalLM", {}, "generate", GENERATE, None, None),
        ("LlamaModel", {}, "embed", EMBED, "last", "bi-encoder"),
        ("LlamaForSequenceClassification", {"num_labels": 1}, "classify", CROSS_ENCODER, "last", "cross-encoder"),
        ("LlamaForSequenceClassification", {"num_labels": 3}, "classify", ("classify", "token_classify"), "last", None),
        ("Qwen3ForSequenceClassification", {"num_labels": 1}, "classify", CROSS_ENCODER, "last", "cross-encoder"),
        ("BertModel", {}, "embed", EMBED, "cls", "bi-encoder"),
        ("BertForSequenceClassification", {"num_labels": 1}, "classify", CROSS_ENCODER, "cls", "cross-encoder"),
    ],
)
def test_auto_serves_what_the_architecture_name_says(
    tmp_path, architecture, values, task, supported, pooling, score_mode
):
    model = resolve(model_dir(tmp_path / "m", architecture, **values))
    assert (model.spec.name, model.task) == (architecture, task)
    assert model.supported_tasks == supported and model.score_mode == score_mode
    assert (model.pooling.pooling_type if model.pooling else None) == pooling
    assert task == "embed" or model.pooling is None or model.pooling.normalize is False  # scores are not normalized


def test_a_classifier_no_plugin_names_is_served_by_the_suffix_record(tmp_path):
    model = resolve(model_dir(tmp_path / "m", "DistilBertForSequenceClassification", num_labels=1))
    assert model.spec.name == "*ForSequenceClassification" and model.spec.model_impl == "transformers"
    # transformers' classifier scores whole sequences: no per-token task is offered through it
    assert model.task == "classify" and model.supported_tasks == ("classify", "score")


class SuffixModels:
    """Records doing several tasks natively, and a shorter suffix record: the name decides."""

    @hookimpl
    def llmp_register_models(self):
        impl = "llmp_models_bert.model:BertForSequenceClassification"
        yield ModelSpec(name="TinyRewardModel", impl=impl, tasks=("classify", "reward"))
        yield ModelSpec(name="TinyForRewardModeling", impl=impl, tasks=("classify", "reward"))
        yield ModelSpec(name="TinyClassificationModel", impl=impl, tasks=("reward", "classify"))
        yield ModelSpec(name="*Classification", impl=impl, tasks=("classify",), model_impl="transformers")


@pytest.mark.parametrize(
    ("architecture", "task", "supported", "pooling"),
    [
        ("TinyRewardModel", "reward", ("token_classify", "classify"), "all"),
        ("TinyForRewardModeling", "reward", ("token_classify", "classify"), "all"),
        ("TinyClassificationModel", "classify", ("classify", "token_classify"), "cls"),
    ],
)
def test_the_name_picks_among_the_tasks_a_record_does(tmp_path, architecture, task, supported, pooling):
    with registered(SuffixModels()):
        model = resolve(model_dir(tmp_path / "m", architecture, num_labels=2))
    assert (model.task, model.supported_tasks, model.pooling.pooling_type) == (task, supported, pooling)


def test_select_model_takes_exact_names_then_the_longest_suffix_then_the_catch_all():
    plugins.load_plugins()
    with registered(SuffixModels()):
        assert registry.select_model(["BertForSequenceClassification"], "auto").name == "BertForSequenceClassification"
        assert registry.select_model(["FooForSequenceClassification"], "auto").name == "*ForSequenceClassification"
        assert registry.select_model(["FooForTokenClassification"], "auto").name == "*Classification"
        # an exact name later in the list beats a suffix match of the first
        assert registry.select_model(["FooForSequenceClassification", "BertModel"], "auto").name == "BertModel"
        # model_impl transformers: the native record of the exact name is not a candidate
        chosen = registry.select_model(["BertForSequenceClassification"], "transformers")
        assert chosen.name == "*ForSequenceClassification"
        assert registry.select_model(["FooForCausalLM"], "auto").name == "*"
    with pytest.raises(UnknownComponentError):
        registry.select_model(["FooForSequenceClassification"], "native")


# -- task, runner, convert -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "task", "supported", "pooling", "score_mode"),
    [
        ({"convert": "classify"}, "classify", ("classify", "token_classify"), "last", None),
        ({"task": "classify"}, "classify", ("classify", "token_classify"), "last", None),
        ({"convert": "reward"}, "reward", ("token_classify", "classify"), "all", None),
        ({"convert": "embed"}, "embed", EMBED, "last", "bi-encoder"),
        ({"runner": "pooling"}, "embed", EMBED, "last", "bi-encoder"),
        ({"task": "score"}, "embed", EMBED, "last", "bi-encoder"),  # not a classifier: the cosine of embeddings
        ({"runner": "generate"}, "generate", GENERATE, None, None),
    ],
)
def test_options_convert_a_causal_lm(tmp_path, options, task, supported, pooling, score_mode):
    path = model_dir(tmp_path / "llama", "LlamaForCausalLM")
    model = resolve(path, **options)
    assert model.spec.name == "LlamaForCausalLM"  # converted by as_pooling_model, not another record
    assert (model.task, model.supported_tasks, model.score_mode) == (task, supported, score_mode)
    assert (model.pooling.pooling_type if model.pooling else None) == pooling
    check_resolved(model, EngineConfig(model=str(path), **options))


def test_a_converted_classifier_of_one_label_scores(tmp_path):
    model = resolve(model_dir(tmp_path / "llama", "LlamaForCausalLM", num_labels=1), convert="classify")
    assert model.supported_tasks == CROSS_ENCODER and model.score_mode == "cross-encoder"


def test_task_score_means_the_classifier_of_a_classifier_and_the_embeddings_of_an_embedder(tmp_path):
    cross = resolve(model_dir(tmp_path / "cross", "BertForSequenceClassification", num_labels=1), task="score")
    assert (cross.task, cross.score_mode) == ("classify", "cross-encoder")
    bi = resolve(model_dir(tmp_path / "bi", "BertModel"), task="score")
    assert (bi.task, bi.score_mode) == ("embed", "bi-encoder")
    check_resolved(cross, EngineConfig(model=str(tmp_path / "cross"), task="score"))
    native = resolve(tmp_path / "bi", convert="embed")  # converting an embedder to embed: no change
    assert native.task == "embed"
    check_resolved(native, EngineConfig(model=str(tmp_path / "bi"), convert="embed"))
    with pytest.raises(ValueError, match="^the resolved model has convert 'none' but the options ask for 'classify'"):
        check_resolved(native, EngineConfig(model=str(tmp_path / "bi"), convert="classify"))
    three = model_dir(tmp_path / "three", "BertForSequenceClassification", num_labels=3)
    assert one_line_error(three, task="score") == (
        "BertForSequenceClassification cannot score: it has 3 labels, and scoring takes a classifier of one "
        "(task='classify' serves it)"
    )


def test_a_model_that_cannot_do_the_task_says_so_in_one_line(tmp_path):
    bert = model_dir(tmp_path / "bert", "BertModel")
    assert one_line_error(bert, task="classify") == (
        "BertModel cannot classify: it has no classification head (use a *ForSequenceClassification checkpoint)"
    )
    assert one_line_error(bert, task="generate") == (
        "the BertModel model produces embeddings; it cannot generate text (task='generate')"
    )
    assert "cannot generate text (runner='generate')" in one_line_error(bert, runner="generate")
    cross = model_dir(tmp_path / "cross", "BertForSequenceClassification", num_labels=1)
    assert one_line_error(cross, task="embed") == (
        "BertForSequenceClassification cannot embed: it is a classifier (use an embedding checkpoint)"
    )
    assert one_line_error(cross, task="generate") == (
        "the BertForSequenceClassification model is a classifier; it cannot generate text (task='generate')"
    )
    llama = model_dir(tmp_path / "llama", "LlamaForCausalLM")
    assert "convert='none' refuses to convert it" in one_line_error(llama, task="embed", convert="none")
    assert one_line_error(llama, runner="generate", convert="classify") == (
        "runner 'generate' contradicts convert 'classify': they ask for different tasks"
    )
    assert one_line_error(llama, task="embed", convert="classify") == (
        "task 'embed' contradicts convert 'classify': they ask for different tasks"
    )


# -- hf_overrides and classifier_from_token ----------------------------------------------------


NO_YES = ["n", "y"]  # the reranker's "no" and "yes": single tokens of the tiny tokenizer


def reranker_dir(path: Path) -> tuple[Path, list[int]]:
    """A Qwen3 causal LM directory, and the ids of :data:`NO_YES` in its tokenizer."""
    model_dir(path, "Qwen3ForCausalLM", head_dim=16)
    ids = tiny_tokenizer().convert_tokens_to_ids(NO_YES)
    assert 2 not in ids  # <unk>
    return path, ids


def test_hf_overrides_swap_the_architecture_and_make_a_qwen3_reranker(tmp_path):
    path, ids = reranker_dir(tmp_path / "qwen3")
    overrides = {
        "architectures": ["Qwen3ForSequenceClassification"],
        "classifier_from_token": NO_YES,
        "is_original_qwen3_reranker": True,
    }
    model = resolve(path, hf_overrides=overrides)
    assert model.architectures == ("Qwen3ForSequenceClassification",)
    assert model.spec.name == "Qwen3ForSequenceClassification" and model.task == "classify"
    assert model.config.classifier_token_ids == ids and model.config.method == "from_2_way_softmax"
    assert model.config.num_labels == 1 and len(model.config.id2label) == 1
    assert model.supported_tasks == CROSS_ENCODER and model.score_mode == "cross-encoder"
    assert model.pooling.pooling_type == "last"
    assert model.hf_overrides == overrides
    check_resolved(model, EngineConfig(model=str(path), hf_overrides=overrides))
    check_resolved(model, EngineConfig(model=str(path)))  # not asked: any overrides do
    with pytest.raises(ValueError, match="^the resolved model has hf_overrides .* but the options ask for"):
        check_resolved(model, EngineConfig(model=str(path), hf_overrides={"architectures": ["Qwen3ForCausalLM"]}))
    with pytest.raises(ValueError, match="^the resolved model has runner 'pooling' but the options ask for 'generate'"):
        check_resolved(model, EngineConfig(model=str(path), runner="generate"))


def test_a_live_causal_lm_with_classifier_tokens_generates_and_scores(tmp_path):
    path, ids = reranker_dir(tmp_path / "qwen3")
    overrides = {"classifier_from_token": NO_YES, "method": "from_2_way_softmax"}
    model = resolve(path, hf_overrides=overrides)
    assert model.spec.name == "Qwen3ForCausalLM" and model.task == "generate" and model.pooling is None
    assert model.supported_tasks == ("generate", "classify", "score") and model.score_mode == "cross-encoder"
    assert model.config.classifier_token_ids == ids
    plain = resolve(path)
    assert plain.supported_tasks == GENERATE and not hasattr(plain.config, "classifier_token_ids")
    several = resolve(path, hf_overrides={"classifier_from_token": [*NO_YES, "a"]})  # no_post_processing
    assert several.supported_tasks == ("generate", "classify") and several.config.num_labels == 3


def test_overrides_replace_config_values_and_reach_the_transformers_config(tmp_path):
    from llmp.model_files.config import transformers_config

    path = model_dir(tmp_path / "llama", "LlamaForCausalLM")
    model = resolve(path, hf_overrides={"max_position_embeddings": 256, "rms_norm_eps": 1e-3})
    assert model.context_len == 256 and model.config.rms_norm_eps == 1e-3
    assert resolve(path).context_len == TINY_DECODER["max_position_embeddings"]  # the cached config is untouched
    fallback = transformers_config(path, model.hf_overrides)
    assert fallback.max_position_embeddings == 256 and fallback.rms_norm_eps == 1e-3


def test_classifier_token_errors_are_one_line(tmp_path):
    path, _ = reranker_dir(tmp_path / "qwen3")
    unknown = one_line_error(path, hf_overrides={"classifier_from_token": ["n", "zzzzqqq"]})
    assert unknown.startswith("classifier_from_token 'zzzzqqq' is not a token of the tokenizer")
    assert "is_original_qwen3_reranker needs classifier_from_token naming two tokens" in one_line_error(
        path, hf_overrides={"is_original_qwen3_reranker": True}
    )
    assert "method must be from_2_way_softmax or no_post_processing" in one_line_error(
        path, hf_overrides={"classifier_from_token": ["n"], "method": "softmax"}
    )


# -- the options themselves --------------------------------------------------------------------


def test_the_new_options_are_engine_keywords_and_load_from_json():
    config = EngineConfig(runner="pooling", convert="embed", hf_overrides={"a": 1}, task="reward")
    assert config.keywords()["hf_overrides"] == {"a": 1} and config.keywords()["convert"] == "embed"
    built = load_records({"engine": EngineConfig}, {"hf_overrides": '{"architectures": ["X"]}'}, environ={})
    assert built["engine"].hf_overrides == {"architectures": ["X"]}
    built = load_records({"engine": EngineConfig}, {}, environ={"LLMP_HF_OVERRIDES": '{"a": {"b": 2}}'})
    assert built["engine"].hf_overrides == {"a": {"b": 2}}
    for field, value in (("runner", "embed"), ("convert", "score"), ("task", "rank")):
        with pytest.raises(ValueError, match=rf"^{field} must be .* or .*, got '{value}'$"):
            EngineConfig(**{field: value})
    with pytest.raises(ValueError, match="^hf_overrides must be a JSON object"):
        EngineConfig(hf_overrides="[1, 2]")
    assert FrontendOptions().max_score_pairs == 1024
    with pytest.raises(ValueError, match="max_score_pairs must be >= 1"):
        FrontendOptions(max_score_pairs=0)


def test_front_ends_get_the_supported_tasks():
    info = {"max_model_len": 512, "task": "classify", "supported_tasks": ["classify", "token_classify", "score"]}
    options = frontend_options(FrontendOptions(max_score_pairs=8), info, ["m"])
    assert options.task == "classify" and options.supported_tasks == ("classify", "token_classify", "score")
    assert options.max_score_pairs == 8


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["--hf-overrides", "{bad"],
            {},
            "llmp: error: --hf-overrides must be a JSON object, got '{bad' "
            "(Expecting property name enclosed in double quotes at column 2)",
        ),
        (["--hf-overrides", "[1]"], {}, "llmp: error: --hf-overrides must be a JSON object, got '[1]'"),
        ([], {"LLMP_HF_OVERRIDES": "{"}, "llmp: error: LLMP_HF_OVERRIDES must be a JSON object, got '{'"),
        (
            ["--runner", "generate", "--convert", "classify"],
            {},
            "llmp: error: --runner generate contradicts --convert classify: they ask for different tasks",
        ),
        (["--task", "rank"], {}, "llmp: error: --task must be auto, generate, embed, classify, score or reward"),
    ],
)
def test_serve_refuses_bad_task_options_in_one_line(args, env, message):
    result = run_llmp("serve", "--port", "1", *args, env=env, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(message), lines[0]


def test_serve_help_lists_the_task_options():
    shown = run_llmp("serve", "-h", env={"COLUMNS": "200"}).stdout
    for flag in ("--runner", "--convert", "--hf-overrides JSON", "--max-score-pairs", "reward"):
        assert flag in shown, flag
