"""SamplingParams: vLLM's defaults, normalisation, and a clear ValueError for every bad value."""

from __future__ import annotations

import pytest

from llmp import CompletionOutput, RequestOutput, SamplingParams


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
    ("kwargs", "message"),
    [
        ({"n": 0}, "n must be >= 1"),
        ({"temperature": -0.1}, "temperature must be >= 0.0"),
        ({"top_p": 0.0}, r"top_p must be in \(0.0, 1.0\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0.0, 1.0\]"),
        ({"top_k": -2}, "top_k must be >= 0 .0 or -1 disables it."),
        ({"min_p": 1.1}, r"min_p must be in \[0.0, 1.0\]"),
        ({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2.0, 2.0\]"),
        ({"frequency_penalty": -3}, r"frequency_penalty must be in \[-2.0, 2.0\]"),
        ({"repetition_penalty": 0}, "repetition_penalty must be > 0.0"),
        ({"seed": 1.5}, "seed must be an integer"),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"min_tokens": -1}, "min_tokens must be >= 0"),
        ({"min_tokens": 5, "max_tokens": 4}, r"min_tokens must be <= max_tokens \(4\)"),
        ({"stop": ""}, "stop must be a non-empty string"),
        ({"stop": ["ok", ""]}, "stop must be a non-empty string"),
        ({"stop_token_ids": [-1]}, r"stop_token_ids\[\] must be >= 0"),
        ({"logprobs": -1}, "logprobs must be >= 0"),
        ({"prompt_logprobs": -1}, "prompt_logprobs must be >= 0"),
        ({"logit_bias": {5: 101.0}}, r"logit_bias\[5\] must be in \[-100.0, 100.0\]"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias key must be >= 0"),
        ({"allowed_token_ids": []}, "allowed_token_ids must not be empty"),
        ({"temperature": "hot"}, "temperature must be a finite number"),
        ({"n": True}, "n must be an integer"),
    ],
)
def test_invalid_values_name_the_field_and_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_outputs_shape():
    completion = CompletionOutput(index=0, text="hi", token_ids=[1, 2], finish_reason="stop", stop_reason="\n")
    output = RequestOutput("r1", "p", [5], [completion], finished=True)
    assert completion.finished() and output.outputs[0].stop_reason == "\n"
