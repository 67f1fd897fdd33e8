"""Tests of the TGI front-end beyond the conformance kit's: TGI's own client, huggingface_hub's
InferenceClient, against a live server."""

import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import ValidationError
from llmp import registry
from llmp.testing import save_tiny_llama, serving

KEY = "tgi-test-key"


def test_registered_lazily_with_its_probe():
    spec = registry.get_component("frontend", "tgi")
    assert spec.distribution == "llmp-frontend-tgi"
    assert (spec.impl, spec.probe) == ("llmp_frontend_tgi.frontend:TGIFrontend", "llmp_frontend_tgi.probe:TGIProbe")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    model = tmp_path_factory.mktemp("model")
    save_tiny_llama(model)
    with serving(model, "--frontend", "tgi", "--api-key", KEY, "--max-model-len", "64") as server:
        yield InferenceClient(f"{server.url}/tgi", api_key=KEY)


def test_generates_whole_with_details(client):
    answer = client.text_generation("The quick brown", max_new_tokens=6, details=True)
    assert answer.details.finish_reason == "length" and answer.details.generated_tokens == 6
    assert [token.text for token in answer.details.tokens] and all(t.logprob <= 0 for t in answer.details.tokens)
    assert answer.generated_text == client.text_generation("The quick brown", max_new_tokens=6)  # greedy


def test_streams_token_by_token_to_the_same_text(client):
    whole = client.text_generation("The quick brown", max_new_tokens=6)
    events = list(client.text_generation("The quick brown", max_new_tokens=6, stream=True, details=True))
    assert len(events) == 6 and "".join(event.token.text for event in events) == whole
    assert events[-1].generated_text == whole and events[-1].details.finish_reason == "length"
    assert all(event.generated_text is None for event in events[:-1])


def test_a_bad_parameter_is_tgi_s_validation_error(client):
    with pytest.raises(ValidationError, match="temperature"):
        client.text_generation("The quick brown", max_new_tokens=6, temperature=0.0, do_sample=True)
    with pytest.raises(ValidationError, match="parameters.watermark is not supported"):
        client.text_generation("The quick brown", max_new_tokens=6, watermark=True)
