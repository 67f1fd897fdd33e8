"""Several engine clients on one engine process (what ``llmp serve --api-server-count`` runs on):
each attached client gets its own outputs, with request ids that may equal another client's; a
detached client's requests are aborted; only the client that started the engine may stop it."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from pathlib import Path

import pytest

from llmp import SamplingParams
from llmp.api import LLMPError
from llmp.async_llm import AsyncLLM, EngineAttachment
from llmp.testing import save_tiny_llama

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama-clients")
    save_tiny_llama(path, vocab_size=400)
    return path


def _attachment(engine: AsyncLLM) -> EngineAttachment:
    base = os.path.join(tempfile.gettempdir(), f"llmp-test-{uuid.uuid4().hex[:8]}")
    return EngineAttachment(f"ipc://{base}-in", f"ipc://{base}-out", engine.engine_pid)


async def _attach(engine: AsyncLLM) -> tuple[AsyncLLM, int]:
    attachment = _attachment(engine)
    client = AsyncLLM(engine.model, wait=False, attach=attachment, max_model_len=128, dtype="float32")
    index = await engine.attach_client(attachment)
    await asyncio.to_thread(client.wait_ready)
    return client, index


async def _tokens(engine: AsyncLLM, prompt: str, request_id: str) -> list[int]:
    final = None
    async for final in engine.generate(prompt, GREEDY, request_id=request_id):
        pass
    return list(final.outputs[0].token_ids)


def test_attached_clients_share_the_engine_and_get_only_their_outputs(model_dir: Path):
    async def scenario() -> None:
        engine = AsyncLLM(model_dir, max_model_len=128, dtype="float32")
        try:
            first, index_1 = await _attach(engine)
            second, index_2 = await _attach(engine)
            assert (index_1, index_2) == (1, 2) and first.info == engine.info
            prompts = ["one two three", "four five", "six"]
            expected = [await _tokens(engine, p, f"alone-{i}") for i, p in enumerate(prompts)]
            # the same request ids from three clients at once, each with its own prompt
            runs = [_tokens(client, prompts[i], "same-id") for i, client in enumerate((engine, first, second))]
            assert await asyncio.gather(*runs) == expected

            # a detached client's request is aborted in the engine; the others carry on
            long = SamplingParams(max_tokens=100, ignore_eos=True)
            stream = first.generate("a long one", long, request_id="long").__aiter__()
            await stream.__anext__()
            assert (await engine.stats())["num_running"] == 1
            assert await engine.detach_client(index_1) == 1
            assert (await engine.stats())["num_running"] == 0
            first.shutdown()  # closes its sockets only: the engine is not its own
            await stream.aclose()
            assert await _tokens(second, prompts[0], "after") == expected[0]

            # the engine is client 0's to stop or to attach clients to
            for method, args in (("shutdown", ()), ("attach_client", ("ipc://x", "ipc://y")), ("detach_client", (2,))):
                with pytest.raises(LLMPError, match="client 0 alone"):
                    await second._call(method, *args)
            assert engine.is_running and second.is_running
            second.shutdown()
        finally:
            await asyncio.to_thread(engine.shutdown)
        assert not engine.is_running

    asyncio.run(scenario())
