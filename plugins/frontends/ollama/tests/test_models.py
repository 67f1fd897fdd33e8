"""Ollama's model routes (/api/tags, /api/show, /api/ps, /api/version), the banner on "/", errors in
Ollama's shape, the routes llmp has no use for, and embeddings with the real all-MiniLM-L6-v2."""

from __future__ import annotations

import math

import httpx
import ollama
import pytest

from llmp.testing import minilm_dir, sentence_transformers_reference


def test_banner_and_version(http):
    assert http.get("/").text == "Ollama is running"
    assert http.head("/").status_code == 200
    version = http.get("/api/version").json()["version"]
    assert tuple(int(x) for x in version.split(".")) >= (0, 13, 0)


def test_list_show_ps(client, server):
    (listed,) = client.list().models
    assert listed.model == "tiny:latest" and listed.size > 0 and listed.digest
    assert listed.details.family == "llama" and listed.details.format == "safetensors"
    assert listed.details.quantization_level == "F32" and listed.details.parameter_size.endswith("K")
    shown = client.show("tiny:latest")
    assert shown.capabilities == ["completion"]  # no tool or reasoning parser on this server
    assert shown.modelinfo["general.architecture"] == "llama" and shown.modelinfo["llama.block_count"] == 2
    assert shown.modelinfo["general.parameter_count"] > 0 and "{%" in shown.template
    (running,) = client.ps().models
    assert running.model == "tiny:latest" and running.context_length == 512 and running.size_vram == 0


def test_errors_are_ollamas(http):
    bad = http.post("/api/chat", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and set(bad.json()) == {"error"}
    missing = http.post("/api/show", json={"model": "nope"})
    assert missing.status_code == 404 and missing.json() == {"error": 'model "nope" not found, try pulling it first'}


def test_model_management_routes_say_what_to_use(client, http):
    assert client.pull("tiny").status == "success"  # served already: nothing to fetch
    with pytest.raises(ollama.ResponseError) as excinfo:
        client.pull("llama3.2")
    assert excinfo.value.status_code == 501 and "llmp pull llama3.2" in excinfo.value.error
    for method, path in (
        ("DELETE", "/api/delete"),
        ("POST", "/api/copy"),
        ("POST", "/api/create"),
        ("POST", "/api/push"),
    ):
        response = http.request(method, path, json={"model": "tiny", "source": "tiny", "destination": "x"})
        assert response.status_code == 501 and "llmp serve" in response.json()["error"], path


def test_generation_routes_follow_the_task(embed_server):
    with httpx.Client(base_url=embed_server.url, timeout=60) as http:
        assert http.post("/api/chat", json={"model": "all-minilm", "messages": []}).status_code == 404
        shown = http.post("/api/show", json={"model": "all-minilm"}).json()
    assert shown["capabilities"] == ["embedding"] and shown["details"]["family"] == "bert"


def test_embed_matches_sentence_transformers(embed_server):
    client = ollama.Client(host=embed_server.url, timeout=60)
    texts = ["Why is the sky blue?", "Why is the grass green?"]
    reply = client.embed(model="all-minilm:latest", input=texts)
    expected = sentence_transformers_reference(minilm_dir(), texts)
    assert len(reply.embeddings) == 2 and all(len(v) == 384 for v in reply.embeddings)
    for got, want in zip(reply.embeddings, expected.tolist(), strict=True):
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4
    assert reply.prompt_eval_count > 0 and reply.total_duration > 0
    short = client.embed(model="all-minilm", input="Why is the sky blue?", dimensions=8)
    assert len(short.embeddings[0]) == 8 and math.isclose(math.hypot(*short.embeddings[0]), 1, rel_tol=1e-4)
    assert client.embed(model="all-minilm", input=[]).embeddings == []
    old = client.embeddings(model="all-minilm", prompt="Why is the sky blue?")
    assert len(old.embedding) == 384
    with pytest.raises(ollama.ResponseError) as excinfo:
        client.embed(model="all-minilm", input="word " * 600, truncate=False)
    assert excinfo.value.status_code == 400 and "context length" in excinfo.value.error
    assert len(client.embed(model="all-minilm", input="word " * 600).embeddings[0]) == 384


def test_api_key_guards_all_but_the_banner_and_version(auth_server):
    with httpx.Client(base_url=auth_server.url, timeout=60) as http:
        assert http.get("/").text == "Ollama is running"
        assert http.get("/api/version").status_code == 200
        refused = http.get("/api/tags")
        assert refused.status_code == 401 and set(refused.json()) == {"error"}
    keyed = ollama.Client(host=auth_server.url, timeout=60, headers={"Authorization": "Bearer Secret-Key-42"})
    assert [m.model for m in keyed.list().models] == ["tiny:latest"]
