"""The async client against a real agentmux: the producer's helpers, handles and batching under
`async with`, its error end, a refused append, a retried append kept once, and the async watcher resumed
across a cut connection, a chat run, and every message of a token loop in order."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

import agentmux

from helpers import events, of_type, same
from proxy import AnswerDroppingProxy, CuttingProxy


async def watch_all(client: agentmux.AsyncClient, stream_id: str, **options: Any) -> tuple[list[dict[str, Any]], Any]:
    messages: list[dict[str, Any]] = []
    state = agentmux.initial_state()
    async for update in client.watch(stream_id, **options):
        messages.append(update.message)
        state = update.state
    return messages, state


async def test_the_async_producer_writes_what_a_watcher_reads(server: Any) -> None:
    posts = 0

    async def count(request: httpx.Request) -> None:
        nonlocal posts
        if request.method == "POST" and request.url.path.endswith("/messages"):
            posts += 1

    client = agentmux.AsyncClient(server.base_url, http_client=httpx.AsyncClient(event_hooks={"request": [count]}))
    watcher = agentmux.AsyncClient(server.base_url)
    tokens = [f"a{i} " for i in range(1000)]
    async with client.stream("async") as run:
        reader = asyncio.ensure_future(watch_all(watcher, run.stream_id, token=run.read_token))
        run.thinking("planning")
        with run.block() as block_id:
            with run.tool_call_stream("lookup", call_id="c1") as call:
                call.append('{"q":')
                call.append('"x"}')
            run.tool_result("c1", result=[1, 2])
        with run.text_stream() as text:
            for i, token in enumerate(tokens):
                text.append(token)
                if i % 100 == 0:
                    await asyncio.sleep(0)
        run.image("https://example.com/i.png")
        run.custom("card", {"n": 1})
        await run.flush()
        assert run.last_sequence > 1
    messages, state = await reader
    assert same(state, await watcher.snapshot(run.stream_id))
    assert state.status == "completed"
    deltas = "".join(m["props"]["content"] for m in messages if m["type"] == "text")
    assert deltas == "".join(tokens) and of_type(state, "text")[0]["props"]["content"] == "".join(tokens)
    assert of_type(state, "tool_call")[0]["props"]["arguments"] == '{"q":"x"}'
    assert of_type(state, "tool_call")[0]["block_id"] == block_id
    assert of_type(state, "tool_result")[0]["props"]["result"] == [1, 2]
    assert of_type(state, "card")[0]["props"] == {"n": 1} and of_type(state, "image")
    assert events(state, "block_end")[0]["props"]["data"]["block_id"] == block_id
    assert 1 <= posts <= 100, posts


async def test_handles_and_blocks_take_async_with_as_with(server: Any) -> None:
    client = agentmux.AsyncClient(server.base_url)
    async with client.stream("async-with") as run:
        async with run.block() as block_id:
            async with run.thinking_stream() as thinking:
                thinking.append("hm")
            async with run.tool_call_stream("lookup", call_id="c2") as call:
                call.append("{}")
    state = await client.snapshot(run.stream_id)
    assert of_type(state, "thinking")[0]["props"]["content"] == "hm"
    assert of_type(state, "tool_call")[0]["block_id"] == block_id
    ended = [e["props"]["data"]["message_id"] for e in events(state, "message_end")]
    assert thinking.id in ended and call.id in ended
    assert events(state, "block_end")[0]["props"]["data"]["block_id"] == block_id


async def test_an_exception_in_async_with_ends_the_stream_error(server: Any) -> None:
    client = agentmux.AsyncClient(server.base_url)
    with pytest.raises(KeyError):
        async with client.stream() as run:
            run.text("before")
            raise KeyError("missing")
    state = await client.snapshot(run.stream_id)
    assert state.status == "error"
    assert events(state, "stream_end")[0]["props"]["data"]["error"]["code"] == "KeyError"
    assert of_type(state, "text")[0]["props"]["content"] == "before"


async def test_a_refused_async_append_is_raised(server: Any) -> None:
    client = agentmux.AsyncClient(server.base_url)
    with pytest.raises(agentmux.AgentmuxError) as refused:
        async with client.stream() as run:
            run.event("stream_end")  # the stream's own name: refused
            await run.flush()
    assert refused.value.status == 400 and refused.value.code == "invalid_message"
    assert (await client.snapshot(run.stream_id)).status == "error"


async def test_an_async_retried_append_is_kept_once(server: Any) -> None:
    proxy = AnswerDroppingProxy(server.base_url)
    try:
        client = agentmux.AsyncClient(proxy.base_url)
        async with client.stream() as run:
            run.text("once")
            await run.flush()
            requests = run.requests
            ended = await run.end(status="completed", finish_reason="stop")
        assert proxy.dropped and requests == 2 and ended.status == "completed"
        messages, _ = await watch_all(client, run.stream_id)
        assert [m["props"]["content"] for m in messages if m["type"] == "text"] == ["once"]
    finally:
        proxy.stop()


async def test_the_async_watcher_resumes_a_cut_connection_and_watches_a_chat(server: Any) -> None:
    producer = agentmux.AsyncClient(server.base_url)
    created = await producer.create_stream()
    batch = [{"type": "text", "props": {"content": f"w{i} "}, "message_id": "m", "delta": True} for i in range(20)]
    await producer.append(created.id, batch, write_token=created.write_token, after=1)
    await producer.end(created.id, write_token=created.write_token)
    proxy = CuttingProxy(server.base_url, b"\nid: 7\n")
    try:
        messages, state = await watch_all(agentmux.AsyncClient(proxy.base_url), created.id)
    finally:
        proxy.stop()
    assert proxy.cut
    sequences = [m["metadata"]["sequence"] for m in messages]
    assert sequences == list(range(1, len(sequences) + 1)) and state.status == "completed"
    run = await producer.chat(model="echo", messages=[{"role": "user", "content": "async hello"}])
    final = None
    async for update in run:
        final = update.state
    assert final is not None and final.status == "completed"
    assert "".join(m["props"]["content"] for m in of_type(final, "text")) == "async hello"
