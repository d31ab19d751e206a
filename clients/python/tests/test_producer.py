"""The blocking producer against a real agentmux: every helper and handle (read back with the snapshot and a
CUI watcher), batching, a retried append that had landed, a refused append, and the context manager's ends."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

import agentmux

from helpers import events, of_type, same, watch_all
from proxy import AnswerDroppingProxy


def test_every_helper_and_handle_is_read_back(server: Any) -> None:
    client = agentmux.Client(server.base_url)
    with client.stream("helpers") as run:
        text_id = run.text("Hello")
        run.thinking("pondering")
        loading = run.loading("searching")
        run.loading("searching", done=True, message_id=loading)
        call = run.tool_call("search", {"q": "cats"}, call_id="call-1")
        run.tool_result("call-1", result={"hits": 3}, name="search")
        run.tool_result("call-2", error="it broke")
        run.image("https://example.com/a.png", alt="a cat", width=10)
        run.audio("https://example.com/a.mp3", format="mp3")
        run.video("https://example.com/a.mp4")
        run.file("https://example.com/a.pdf", name="a.pdf")
        run.action("open", {"url": "/x"})
        run.event("progress", {"step": 1}, message="one")
        run.error("a recoverable problem", code="warn")
        run.custom("card", {"title": "T"})
        with run.text_stream() as streamed:
            for word in ["Hel", "lo ", "world"]:
                streamed.append(word)
        with run.thinking_stream() as thought:
            thought.append("hmm")
        with run.block() as block_id:
            in_block = run.text("inside")
            with run.tool_call_stream("lookup", call_id="call-3") as args:
                args.append('{"a":')
                args.append("1}")
        run.text("after")
    assert isinstance(text_id, str) and isinstance(call, str)
    state = client.snapshot(run.stream_id, token=run.read_token)
    _, watched = watch_all(client, run.stream_id, token=run.read_token)
    assert same(watched, state)
    assert state.status == "completed"
    by_id = {m.get("message_id"): m for m in state.messages}
    assert by_id[text_id]["props"] == {"content": "Hello"}
    assert by_id[loading]["props"] == {"message": "searching", "done": True}
    assert by_id[call]["props"] == {"id": "call-1", "name": "search", "arguments": '{"q": "cats"}', "server_side": True}
    results = of_type(state, "tool_result")
    assert results[0]["props"] == {"call_id": "call-1", "name": "search", "result": {"hits": 3}}
    assert results[1]["props"]["error"] == {"message": "it broke"}
    assert of_type(state, "image")[0]["props"]["alt"] == "a cat"
    assert of_type(state, "file")[0]["props"]["name"] == "a.pdf"
    assert of_type(state, "action")[0]["props"] == {"name": "open", "payload": {"url": "/x"}}
    assert of_type(state, "error")[0]["props"] == {"message": "a recoverable problem", "code": "warn"}
    assert of_type(state, "card")[0]["props"] == {"title": "T"}
    progress = [m for m in of_type(state, "event") if m["props"]["event"] == "progress"]
    assert progress[0]["props"] == {"event": "progress", "message": "one", "data": {"step": 1}}
    texts = [m["props"]["content"] for m in of_type(state, "text")]
    assert texts == ["Hello", "Hello world", "inside", "after"]
    assert [m["props"]["content"] for m in of_type(state, "thinking")] == ["pondering", "hmm"]
    assert by_id[in_block]["block_id"] == block_id
    streamed_call = by_id[args.id]
    assert streamed_call["props"]["arguments"] == '{"a":1}' and streamed_call["block_id"] == block_id
    # Each handle's end and the block's end were written by the end routes, before what followed them.
    sequence = {m.get("message_id"): m["metadata"]["sequence"] for m in state.messages}
    ended = {m["props"]["data"]["message_id"]: m["metadata"]["sequence"] for m in events(state, "message_end")}
    assert ended[streamed.id] < sequence[thought.id] and ended[args.id] < sequence[by_id[in_block]["message_id"]] + 10
    block_end = events(state, "block_end")
    assert block_end and block_end[0]["props"]["data"]["block_id"] == block_id
    assert block_end[0]["metadata"]["sequence"] < sequence[[m for m in of_type(state, "text")][-1]["message_id"]]
    assert run.last_sequence == state.last_sequence


def test_a_streamed_tool_call_reaches_its_input_before_the_end(server: Any) -> None:
    """The UI message stream's `tool-input-available` comes when the call's message ends, not at the end."""
    client = agentmux.Client(server.base_url)
    with client.stream() as run:
        with run.tool_call_stream("lookup") as call:
            call.append('{"city": ')
            call.append('"Paris"}')
        run.flush()
        seen: list[str] = []
        for event in client.watch(run.stream_id, format="ui-message"):
            seen.append(event["type"])
            if event["type"] == "tool-input-available":
                assert event["input"] == {"city": "Paris"}
                break
        run.text("the end comes after")
    assert "tool-input-available" in seen and "finish" not in seen


def test_a_token_loop_is_batched_and_every_token_arrives_in_order(server: Any) -> None:
    posts = 0

    def count(request: httpx.Request) -> None:
        nonlocal posts
        if request.method == "POST" and request.url.path.endswith("/messages"):
            posts += 1

    http = httpx.Client(event_hooks={"request": [count]}, trust_env=False)
    client = agentmux.Client(server.base_url, http_client=http)
    watcher = agentmux.Client(server.base_url)
    tokens = [f"t{i} " for i in range(1000)]
    seen: list[str] = []
    ready = threading.Event()
    with client.stream() as run:

        def read() -> None:
            for update in watcher.watch(run.stream_id):
                ready.set()
                message = update.message
                if message["type"] == "text":
                    seen.append(message["props"]["content"])

        reader = threading.Thread(target=read)
        reader.start()
        assert ready.wait(10)
        with run.text_stream() as text:
            for token in tokens:
                text.append(token)
    reader.join(30)
    assert "".join(seen) == "".join(tokens)
    assert of_type(watcher.snapshot(run.stream_id), "text")[0]["props"]["content"] == "".join(tokens)
    assert 1 <= posts <= 100, posts


def test_a_retried_append_that_landed_is_kept_once(server: Any) -> None:
    proxy = AnswerDroppingProxy(server.base_url)
    try:
        client = agentmux.Client(proxy.base_url)
        with client.stream() as run:
            run.text("once")
            run.flush()
            requests = run.requests
            run.text("twice")
        assert proxy.dropped and requests == 2
        # The log itself holds each message once (a whole message sent twice would be kept twice, though
        # the reduced state, replacing it by id, would not show it).
        messages, _ = watch_all(client, run.stream_id)
        assert [m["props"]["content"] for m in messages if m["type"] == "text"] == ["once", "twice"]
    finally:
        proxy.stop()


def test_append_conditions_and_their_refusals(server: Any) -> None:
    client = agentmux.Client(server.base_url)
    created = client.create_stream()
    message = {"type": "text", "props": {"content": "x"}, "message_id": "m"}
    first = client.append(created.id, [message], write_token=created.write_token, after=1, idempotency_key="k0")
    assert first.sequences == [2] and first.last_sequence == 2 and not first.replayed
    again = client.append(created.id, [message], write_token=created.write_token, after=1, idempotency_key="k0")
    assert again.sequences == [2] and again.replayed
    with pytest.raises(agentmux.AgentmuxError) as refused:
        client.append(created.id, [{**message, "message_id": "n"}], write_token=created.write_token, after=1)
    assert refused.value.status == 409 and refused.value.code == "sequence_conflict"
    assert refused.value.param == "after" and refused.value.last_sequence == 2
    keyed = client.append(created.id, [{**message, "message_id": "k"}], idempotency_key="key-1")
    assert client.append(created.id, [{**message, "message_id": "k"}], idempotency_key="key-1").replayed
    with pytest.raises(agentmux.AgentmuxError) as reused:
        client.append(created.id, [{**message, "message_id": "other"}], idempotency_key="key-1")
    assert reused.value.code == "idempotency_key_reused" and reused.value.last_sequence == keyed.last_sequence
    with pytest.raises(agentmux.AgentmuxError) as bad:
        client.append(created.id, [message], idempotency_key="")
    assert bad.value.status == 400 and bad.value.code == "invalid_value"
    client.end(created.id, write_token=created.write_token)


def test_a_refused_append_is_raised_by_the_next_call(server: Any) -> None:
    client = agentmux.Client(server.base_url)
    with pytest.raises(agentmux.AgentmuxError) as refused:
        with client.stream() as run:
            run.text("mine")
            run.flush()
            # Someone else writes the stream: the producer's next append no longer follows its last sequence.
            client.append(
                run.stream_id, [{"type": "text", "props": {"content": "theirs"}}], write_token=run.write_token
            )
            run.text("refused")
            run.flush()
    assert refused.value.code == "sequence_conflict" and refused.value.status == 409
    state = client.snapshot(run.stream_id)
    assert state.status == "error"
    assert [m["props"]["content"] for m in of_type(state, "text")] == ["mine", "theirs"]


def test_an_exception_in_the_block_ends_the_stream_error_and_is_raised(server: Any) -> None:
    client = agentmux.Client(server.base_url)
    with pytest.raises(ValueError, match="boom"):
        with client.stream() as run:
            run.text("before")
            raise ValueError("boom")
    state = client.snapshot(run.stream_id)
    assert state.status == "error"
    end = events(state, "stream_end")[0]["props"]["data"]
    assert end["error"] == {"message": "boom", "code": "ValueError"}
    assert of_type(state, "text")[0]["props"]["content"] == "before"


def test_end_with_an_outcome_and_cancel(server: Any) -> None:
    client = agentmux.Client(server.base_url)
    with client.stream() as run:
        run.text("done")
        ended = run.end(finish_reason="length", usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3})
    assert ended.status == "completed" and ended.last_sequence == run.last_sequence
    data = events(client.snapshot(run.stream_id), "stream_end")[0]["props"]["data"]
    assert data["finish_reason"] == "length" and data["usage"]["total_tokens"] == 3
    with client.stream() as other:
        other.text("stop me")
        other.cancel()
    assert client.snapshot(other.stream_id).status == "cancelled"
    with pytest.raises(RuntimeError):
        other.text("after the end")


def test_with_keys_the_producer_writes_with_the_key(keyed: Any) -> None:
    from conftest import KEY

    client = agentmux.Client(keyed.base_url, KEY)
    with client.stream() as run:
        run.text("hi")
    reader = agentmux.Client(keyed.base_url)
    assert reader.snapshot(run.stream_id, token=run.read_token).status == "completed"
    with pytest.raises(agentmux.AgentmuxError) as refused:
        reader.append(run.stream_id, {"type": "text", "props": {"content": "no"}}, write_token=run.read_token)
    assert refused.value.status == 403


class _RefusingFirst(httpx.BaseTransport):
    """Answers the first appends itself, with the refusals a retry may fix, before letting them through."""

    def __init__(self, answers: list[httpx.Response]) -> None:
        self.inner = httpx.HTTPTransport()
        self.answers = answers
        self.appends = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/messages"):
            self.appends += 1
            if self.answers:
                return self.answers.pop(0)
        return self.inner.handle_request(request)


def test_refusals_a_retry_may_fix_are_retried_and_others_are_not(server: Any) -> None:
    unreachable = {
        "error": {"message": "the writer could not be reached", "type": "server_error", "code": "writer_unreachable"}
    }
    limited = {"error": {"message": "slow down", "type": "rate_limit_error", "code": "rate_limit_exceeded"}}
    transport = _RefusingFirst(
        [httpx.Response(503, json=unreachable), httpx.Response(429, json=limited, headers={"retry-after": "1"})]
    )
    client = agentmux.Client(server.base_url, http_client=httpx.Client(transport=transport))
    started = time.monotonic()
    with client.stream() as run:
        run.text("through")
    assert transport.appends == 3 and time.monotonic() - started >= 1.0  # the retry-after was waited
    assert [m["props"]["content"] for m in of_type(client.snapshot(run.stream_id), "text")] == ["through"]
    final = {"error": {"message": "no", "type": "server_error", "code": "store_unavailable"}}
    transport = _RefusingFirst([httpx.Response(503, json=final, headers={"x-should-retry": "false"})])
    client = agentmux.Client(server.base_url, http_client=httpx.Client(transport=transport))
    with pytest.raises(agentmux.AgentmuxError) as refused:
        with client.stream() as run:
            run.text("refused")
    assert refused.value.code == "store_unavailable" and transport.appends == 1
