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
    assert http.get("/api/version").json() == {"version": "0.32.15"}  # the release the API was checked against
    for path in ("/api/version", "/api/tags"):  # HEAD answers like GET, without the body
        head, get = http.head(path), http.get(path)
        assert head.status_code == 200 and head.content == b"", path
        assert head.headers["content-type"] == get.headers["content-type"], path


def test_list_show_ps(client, server):
    (listed,) = client.list().models
    assert listed.model == "tiny:latest" and listed.size > 0 and listed.digest
    assert listed.details.family == "llama" and listed.details.format == "safetensors"
    assert listed.details.quantization_level == "F32" and listed.details.parameter_size.endswith("K")
    count = client.show("tiny").modelinfo["general.parameter_count"]
    assert listed.details.parameter_size == f"{count / 1000:.0f}K"  # Ollama's HumanNumber
    shown = client.show("Tiny:latest")
    # no tool or reasoning parser on this server; its vocabulary has fill-in-the-middle tokens (conftest)
    assert shown.capabilities == ["completion", "insert"]
    assert shown.modelinfo["general.architecture"] == "llama" and shown.modelinfo["llama.block_count"] == 2
    assert count > 0 and "{%" in shown.template
    assert ".Suffix" in shown.template  # how Continue's autocomplete tells that a model fills in the middle
    # what Copilot shows (the name asked for, as Ollama echoes it) and the window requests get here
    assert shown.modelinfo["general.basename"] == "Tiny:latest"
    assert shown.modelinfo["llama.context_length"] == 256
    lines = [line.split(None, 1) for line in shown.parameters.splitlines()]
    assert ["stop", '"</s>"'] in lines and ["num_ctx", "256"] in lines
    (running,) = client.ps().models
    assert running.model == "tiny:latest" and running.context_length == 256 and running.size_vram == 0
    # newer Ollama's tag list: capabilities, and the details' window and hidden size
    (tag,) = httpx.get(f"{server.url}/api/tags").json()["models"]
    assert tag["capabilities"] == ["completion", "insert"]
    hidden = shown.modelinfo["llama.embedding_length"]
    assert (tag["details"]["context_length"], tag["details"]["embedding_length"]) == (256, hidden)


def test_errors_are_ollamas(http):
    bad = http.post("/api/chat", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and set(bad.json()) == {"error"}
    missing = http.post("/api/show", json={"model": "nope"})
    assert missing.status_code == 404 and missing.json() == {"error": "model 'nope' not found"}
    empty = http.post("/api/chat")
    assert empty.status_code == 400 and empty.json() == {"error": "missing request body"}


def test_embeddings_of_a_model_that_does_not_embed_say_how_to_get_some(http):
    for path, body in (("/api/embed", {"input": "hi"}), ("/api/embeddings", {"prompt": "hi"})):
        response = http.post(path, json={"model": "tiny", **body})
        assert response.status_code == 400, path
        error = response.json()["error"]
        assert error.startswith('"tiny" does not support embeddings') and "llmp serve all-minilm" in error
        assert "--convert embed" in error


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
        chat = http.post("/api/chat", json={"model": "all-minilm", "messages": []})
        generate = http.post("/api/generate", json={"model": "all-minilm", "prompt": "hi"})
        shown = http.post("/api/show", json={"model": "all-minilm"}).json()
        listed = [m["model"] for m in http.get("/api/tags").json()["models"]]
    assert chat.status_code == 400 and chat.json()["error"].startswith('"all-minilm" does not support chat')
    assert generate.status_code == 400 and generate.json()["error"].startswith('"all-minilm" does not support generate')
    assert shown["capabilities"] == ["embedding"] and shown["details"]["family"] == "bert"
    # a packaged model's Hub id and Ollama tags are listed, and each selects the model
    assert listed == [
        "all-minilm:latest",
        "sentence-transformers/all-MiniLM-L6-v2:latest",
        "all-minilm:l6-v2",
        "all-minilm:22m",
    ]
    client = ollama.Client(host=embed_server.url, timeout=60)
    for name in listed:
        assert len(client.embed(model=name, input="hi").embeddings) == 1, name


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
    for whole in (0, -1, 384, 4096):  # as Ollama: dimensions of 0 or less, or not below the size, change nothing
        assert len(client.embed(model="all-minilm", input="Why", dimensions=whole).embeddings[0]) == 384
    assert client.embed(model="all-minilm", input=[]).embeddings == []
    old = client.embeddings(model="all-minilm", prompt="Why is the sky blue?")
    assert len(old.embedding) == 384
    with pytest.raises(ollama.ResponseError) as excinfo:
        client.embed(model="all-minilm", input="word " * 600, truncate=False)
    assert excinfo.value.status_code == 400 and "context length" in excinfo.value.error
    assert len(client.embed(model="all-minilm", input="word " * 600).embeddings[0]) == 384
    # truncated to num_ctx, the end of the text goes and [CLS] ... [SEP] stay (Ollama leaves room for them)
    long = " ".join(texts * 20)
    cut = client.embed(model="all-minilm", input=long, options={"num_ctx": 12})
    assert cut.prompt_eval_count == 12
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())  # right truncation keeps the specials too
    kept = tokenizer.decode(tokenizer(long, truncation=True, max_length=12)["input_ids"], skip_special_tokens=True)
    want = sentence_transformers_reference(minilm_dir(), [kept])[0].tolist()
    assert max(abs(a - b) for a, b in zip(cut.embeddings[0], want, strict=True)) < 1e-4


def test_api_key_guards_all_but_the_banner_and_version(guarded_server):
    with httpx.Client(base_url=guarded_server.url, timeout=60) as http:
        assert http.get("/").text == "Ollama is running"
        assert http.get("/api/version").status_code == 200
        refused = http.get("/api/tags")
        assert refused.status_code == 401 and set(refused.json()) == {"error"}
    keyed = ollama.Client(host=guarded_server.url, timeout=60, headers={"Authorization": "Bearer Secret-Key-42"})
    assert [m.model for m in keyed.list().models] == ["tiny:latest"]


def test_an_error_before_the_first_streamed_line_is_a_real_status(guarded_server):
    # the server's --request-timeout is shorter than any reply: the request fails before its first token
    # (a prompt of some length: the tiny model answers a two-token one in about a millisecond on a fast CPU)
    key = {"Authorization": "Bearer Secret-Key-42"}
    prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 25)
    with httpx.Client(base_url=guarded_server.url, timeout=60, headers=key) as http:
        for path, body in (
            ("/api/chat", {"messages": [{"role": "user", "content": prompt}]}),
            ("/api/generate", {"prompt": prompt}),
        ):
            response = http.post(path, json={"model": "tiny", **body})  # streamed: Ollama's default
            assert response.status_code == 408, response.text
            assert set(response.json()) == {"error"} and "--request-timeout" in response.json()["error"]


def test_the_default_gguf_model_as_ollama_lists_it(default_server):
    from llmp.frontend import packaged_model

    gguf = packaged_model("smollm2:135m").location()
    client = ollama.Client(host=default_server.url, timeout=60)
    listed = client.list().models
    assert [m.model for m in listed] == ["HuggingFaceTB/SmolLM2-135M-Instruct:latest", "smollm2:135m"]
    for model in listed:  # the GGUF file's size, not that of llmp's small record of it
        assert model.size == gguf.stat().st_size and model.details.format == "gguf"
        assert model.details.quantization_level == "Q4_1" and model.details.parameter_size == "134.52M"
    shown = client.show("smollm2:135m")
    assert shown.modelinfo["general.basename"] == "smollm2:135m"
    assert 'stop                           "<|im_end|>"' in shown.parameters.splitlines()
    # the OpenAI API on the same server takes the names /api/tags lists, as Ollama's /v1 does
    for name in (m.model for m in listed):
        body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        reply = httpx.post(f"{default_server.url}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200 and reply.json()["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct", name
    unknown = {"model": "smollm2:360m", "messages": [{"role": "user", "content": "Hi"}]}
    assert httpx.post(f"{default_server.url}/v1/chat/completions", json=unknown, timeout=60).status_code == 404


def test_a_gguf_file_named_by_its_hash_reports_the_quantisation_its_header_names(tmp_path, monkeypatch):
    # a GGUF file downloaded from the Hub is a blob named by its hash: the facts read the header, not the name
    import gguf
    from llmp_frontend_ollama.facts import read_facts

    from llmp import LLM
    from llmp.frontend import gguf_source
    from llmp.testing import save_tiny_gguf

    monkeypatch.setenv("LLMP_CACHE_DIR", str(tmp_path / "cache"))
    blob = tmp_path / "blobs" / "0f3c9a7e51d2"
    blob.parent.mkdir()
    save_tiny_gguf(blob, file_type=gguf.LlamaFileType.MOSTLY_Q8_0, tensor_type=gguf.GGMLQuantizationType.Q8_0)
    link = tmp_path / "snapshot" / "tiny.gguf"  # as the Hub cache links a snapshot's file to its blob
    link.parent.mkdir()
    link.symlink_to(blob)
    llm = LLM(str(link), max_model_len=64)
    model_dir = llm.engine.model.model_dir
    assert gguf_source(model_dir) == blob
    facts = read_facts(str(model_dir), None)
    assert (facts.format, facts.quantization_level, facts.size) == ("gguf", "Q8_0", blob.stat().st_size)
