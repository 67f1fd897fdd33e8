"""``POST /v1/chat/completions/batch`` (vLLM's): several conversations in one request, one choice each.

Each conversation is prepared as ``/v1/chat/completions`` prepares one (the same checks, template
and sampling parameters: a bad one is a 400 naming it), then all run at once and answer as one
``chat.completion`` whose ``choices[i]`` is conversation ``i``'s reply and whose ``usage`` sums
theirs. As in vLLM, ``n`` must be 1 and beam search is refused; a stream is refused too (vLLM
ignores ``stream`` here). Per conversation, ``prompt_token_ids`` and ``prompt_logprobs`` go in its
choice, where a single chat puts them beside the choices.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request

from llmp.frontend import APIError, bad_request
from llmp_frontend_openai import protocol as p
from llmp_frontend_openai.chat import ChatCompletion

if TYPE_CHECKING:
    from llmp_frontend_openai.frontend import OpenAIFrontend

PER_CHOICE = ("prompt_token_ids", "prompt_logprobs")  # a single chat's top-level keys that belong to one conversation


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> None:
    async def create_batch_chat_completion(body: p.BatchChatCompletionRequest, request: Request) -> Any:
        chats = await prepare(fe, body, request)
        return await fe.respond(request, False, lambda: answer(fe.new_id(request, "chatcmpl", body), chats))

    router.add_api_route(
        "/v1/chat/completions/batch",
        create_batch_chat_completion,
        methods=["POST"],
        summary="Several conversations in one request: one chat completion, a choice per conversation (vLLM's)",
    )


async def prepare(fe: OpenAIFrontend, body: p.BatchChatCompletionRequest, request: Request) -> list[ChatCompletion]:
    """One prepared ``ChatCompletion`` per conversation, all sent to the engine once every one is valid."""
    if not body.messages:
        raise bad_request("messages must hold at least one conversation (a list of messages)", "messages")
    if body.n is not None and body.n > 1:  # n < 1 is the chat route's own 400
        raise bad_request("Batch chat completions do not support `n > 1`. Please set `n` to 1.", "n")
    if body.use_beam_search:
        raise bad_request(
            "Batch chat completions do not support beam search. Please set `use_beam_search` to False.",
            "use_beam_search",
        )
    if body.stream:
        raise bad_request("batch chat completions are not streamed: set stream to false", "stream")
    chats = []
    for index, conversation in enumerate(body.messages):
        chat = ChatCompletion(fe, body.model_copy(update={"messages": conversation}), request)
        try:
            chat.prompt = await chat.prepare()
        except APIError as exc:
            param = exc.param if exc.param and exc.param != "messages" else f"messages[{index}]"
            raise APIError(exc.status, f"conversation {index}: {exc.message}", param=param) from None
        chats.append(chat)
    if hasattr(fe.engine, "check_capacity"):  # the server's gate: every conversation runs at once
        fe.engine.check_capacity(len(chats), "messages", "conversations")
    for chat in chats:
        chat.start(chat.prompt)
    return chats


async def answer(batch_id: str, chats: list[ChatCompletion]) -> dict[str, Any]:
    async with asyncio.TaskGroup() as group:  # one failing cancels (and so aborts) the others
        tasks = [group.create_task(chat.whole()) for chat in chats]
    responses = [task.result() for task in tasks]
    choices = []
    for index, response in enumerate(responses):
        [choice] = response["choices"]
        choices.append({**choice, "index": index, **{key: response[key] for key in PER_CHOICE if key in response}})
    batch = {key: value for key, value in responses[0].items() if key not in PER_CHOICE}
    return {**batch, "id": batch_id, "choices": choices, "usage": summed([r["usage"] for r in responses])}


def summed(usages: list[dict[str, Any]]) -> dict[str, Any]:
    """The usage objects added up, their ``*_details`` counts included."""
    total: dict[str, Any] = {}
    for usage in usages:
        for key, value in usage.items():
            if isinstance(value, dict):
                inner = total.setdefault(key, {})
                for name, count in value.items():
                    inner[name] = inner.get(name, 0) + (count or 0)
            else:
                total[key] = total.get(key, 0) + value
    return total
