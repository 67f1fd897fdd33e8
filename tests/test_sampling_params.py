"""SamplingParams: vLLM's defaults, normalisation, and a clear SamplingParamsError (naming the field) for every
bad value."""

from __future__ import annotations

import pytest

from llmp import CompletionOutput, RequestOutput, SamplingParams
from llmp.sampling_params import SamplingParamsError, StructuredOutputsParams, resolve_max_tokens


def test_defaults_and_normalisation():
    params = SamplingParams()
    assert (params.n, params.temperature, params.top_p, params.top_k, params.max_tokens) == (1, 1.0, 1.0, 0, 16)
    assert params.stop_strings == [] and params.stop_token_ids == [] and not params.is_greedy
    assert SamplingParams(stop="###").stop_strings == ["###"]
    assert SamplingParams(stop=["a", "b"]).stop_strings == ["a", "b"]
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(max_tokens=None).max_tokens is None


@pytest.mark.parametrize(
    ("kwargs", "message", "field"),
    [
        ({"n": 0}, "n must be >= 1", "n"),
        ({"temperature": -0.1}, "temperature must be >= 0.0", "temperature"),
        ({"top_p": 0.0}, r"top_p must be in \(0.0, 1.0\]", "top_p"),
        ({"top_p": 1.5}, r"top_p must be in \(0.0, 1.0\]", "top_p"),
        ({"top_k": -2}, "top_k must be >= 0 .0 or -1 disables it.", "top_k"),
        ({"min_p": 1.1}, r"min_p must be in \[0.0, 1.0\]", "min_p"),
        ({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2.0, 2.0\]", "presence_penalty"),
        ({"frequency_penalty": -3}, r"frequency_penalty must be in \[-2.0, 2.0\]", "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty must be > 0.0", "repetition_penalty"),
        ({"seed": 1.5}, "seed must be an integer", "seed"),
        ({"max_tokens": 0}, "max_tokens must be >= 1", "max_tokens"),
        ({"min_tokens": -1}, "min_tokens must be >= 0", "min_tokens"),
        ({"min_tokens": 5, "max_tokens": 4}, r"min_tokens must be <= max_tokens \(4\)", "min_tokens"),
        ({"stop": ""}, "stop must be a non-empty string", "stop"),
        ({"stop": ["ok", ""]}, "stop must be a non-empty string", "stop"),
        ({"stop_token_ids": [-1]}, r"stop_token_ids\[\] must be >= 0", "stop_token_ids"),
        ({"logprobs": -2}, "logprobs must be >= -1", "logprobs"),
        ({"prompt_logprobs": -2}, "prompt_logprobs must be >= -1", "prompt_logprobs"),
        ({"logit_bias": {5: 101.0}}, r"logit_bias\[5\] must be in \[-100.0, 100.0\]", "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias key must be >= 0", "logit_bias"),
        ({"allowed_token_ids": []}, "allowed_token_ids must not be empty", "allowed_token_ids"),
        ({"temperature": "hot"}, "temperature must be a finite number", "temperature"),
        ({"n": True}, "n must be an integer", "n"),
    ],
)
def test_invalid_values_name_the_field_and_range(kwargs, message, field):
    with pytest.raises(SamplingParamsError, match=message) as info:
        SamplingParams(**kwargs)
    assert info.value.field == field and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"json": {}, "regex": "a"}, {"choice": []}, {"regex": ""}, {"grammar": "  "}, {"json": 5}],
    ids=["none", "two", "empty-choice", "empty-regex", "blank-grammar", "json-not-schema"],
)
def test_invalid_structured_outputs_name_the_field(kwargs):
    with pytest.raises(SamplingParamsError) as info:
        StructuredOutputsParams(**kwargs)
    assert info.value.field == "structured_outputs"


def test_bad_words_are_kept_and_checked():
    assert SamplingParams(bad_words=["foo", "bar baz"]).bad_words == ["foo", "bar baz"]
    assert SamplingParams().bad_words is None
    for bad in (["ok", ""], "foo", [3]):
        with pytest.raises(SamplingParamsError, match="bad_words must be a list of non-empty strings") as info:
            SamplingParams(bad_words=bad)
        assert info.value.field == "bad_words"


def test_max_tokens_none_is_the_rest_of_the_context():
    assert resolve_max_tokens(None, 10, 64) == 54
    assert resolve_max_tokens(5, 10, 64) == 5
    with pytest.raises(SamplingParamsError, match="max_model_len=64") as info:
        resolve_max_tokens(65, 1, 64)
    assert info.value.field == "max_tokens"
    with pytest.raises(SamplingParamsError, match="maximum context length is 64 tokens") as info:
        resolve_max_tokens(None, 64, 64)
    assert info.value.field == "input_tokens"


def test_outputs_shape():
    completion = CompletionOutput(index=0, text="hi", token_ids=[1, 2], finish_reason="stop", stop_reason="\n")
    output = RequestOutput("r1", "p", [5], [completion], finished=True)
    assert completion.finished() and output.outputs[0].stop_reason == "\n"


def test_an_error_names_its_field_as_the_request_spells_it():
    """A front-end gets the message in its protocol's words from the error itself (no rewriting)."""
    with pytest.raises(SamplingParamsError) as caught:
        SamplingParams(max_tokens=0)
    assert (caught.value.field, str(caught.value)) == ("max_tokens", "max_tokens must be >= 1, got 0")
    assert caught.value.message_for("max_completion_tokens") == "max_completion_tokens must be >= 1, got 0"
    with pytest.raises(SamplingParamsError) as caught:
        SamplingParams(stop=["stop must", ""])  # a value spelling the field stays as sent
    assert caught.value.message_for("stop_sequences") == (
        "stop_sequences must be a non-empty string or a list of them, got ['stop must', '']"
    )
    with pytest.raises(SamplingParamsError) as caught:
        resolve_max_tokens(600, 10, 512)
    assert caught.value.message_for("max_output_tokens") == (
        "max_output_tokens=600 cannot be greater than max_model_len=512"
    )


def test_a_sampling_request_takes_a_bodys_declared_fields_by_name():
    from pydantic import BaseModel, ConfigDict

    from llmp.frontend import SamplingRequest

    class Body(BaseModel):
        model_config = ConfigDict(extra="allow")
        temperature: float | None = None
        max_completion_tokens: int | None = None
        structured_outputs: dict | None = None
        ignore_eos: bool = False

    body = Body(temperature=0.5, max_completion_tokens=7, structured_outputs={"regex": "a"}, ignore_eos=True, seed=3)
    request = SamplingRequest.from_body(body, max_tokens=body.max_completion_tokens, names={"max_tokens": "mct"})
    assert (request.temperature, request.ignore_eos, request.max_tokens) == (0.5, True, 7)
    assert request.seed is None  # an extra key the client sent is not a declared field: not read
    assert request.structured_outputs is None  # the compiled constraint is the handler's to give
    assert request.names == {"max_tokens": "mct"}


@pytest.mark.parametrize("flag", ["ignore_eos", "include_stop_str_in_output", "skip_special_tokens"])
def test_a_flag_that_is_not_a_bool_is_refused_naming_it(flag):
    """A front-end passing raw JSON once got such a request accepted, then lost by the engine."""
    with pytest.raises(SamplingParamsError, match=f"{flag} must be true or false, got 'maybe'") as caught:
        SamplingParams(**{flag: "maybe"})
    assert caught.value.field == flag


def test_vllms_normalisations_of_stop_and_seed():
    assert SamplingParams(stop="x").stop == ["x"]  # code that iterates stop sees strings, as with vLLM's
    assert SamplingParams(seed=-1).seed is None  # vLLM's and Ollama's "no seed": each request samples anew
    with pytest.raises(SamplingParamsError, match="stop must be a non-empty string or a list of them, got 5"):
        SamplingParams(stop=5)


def test_vllms_bounds_on_temperature_and_greedy_choices():
    with pytest.raises(SamplingParamsError, match=r"temperature must be in \[0.0, 2.0\], got 2.5"):
        SamplingParams(temperature=2.5)
    with pytest.raises(SamplingParamsError, match="n must be 1 with greedy sampling") as caught:
        SamplingParams(n=2, temperature=0.0)
    assert caught.value.field == "n"
    assert SamplingParams(n=2, temperature=2.0).n == 2


def test_clone_is_a_deep_copy():
    params = SamplingParams(stop=["a"], logit_bias={3: 1.0}, seed=5)
    copied = params.clone()
    copied.stop.append("b")
    copied.logit_bias[4] = 2.0
    assert (params.stop, params.logit_bias, copied.seed) == (["a"], {3: 1.0}, 5)
