"""The watcher against a real agentmux: resumed across a connection killed mid-event (CUI with
`Last-Event-ID`, another format from the same `from`) with every message exactly once, a start after a
sequence, a chat run, and an error answer as `AgentmuxError`. The typed errors (`LaggedError`,
`EpochChangedError`) in every format are `test_watch_errors.py`'s."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import agentmux

from helpers import of_type, same, watch_all
from proxy import CuttingProxy


def text(content: str, message_id: str = "m") -> dict[str, Any]:
    return {"type": "text", "props": {"content": content}, "message_id": message_id, "delta": True}


def test_a_cut_cui_connection_resumes_with_every_message_once(server: Any) -> None:
    producer = agentmux.Client(server.base_url)
    created = producer.create_stream()
    words = [f"w{i} " for i in range(40)]
    producer.append(created.id, [text(w) for w in words], write_token=created.write_token)
    producer.end(created.id, write_token=created.write_token)
    proxy = CuttingProxy(server.base_url, b"\nid: 10\n")
    connections = 0

    def count(request: httpx.Request) -> None:
        nonlocal connections
        if request.url.path.endswith("/events"):
            connections += 1

    try:
        watcher = agentmux.Client(proxy.base_url, http_client=httpx.Client(event_hooks={"request": [count]}))
        messages, state = watch_all(watcher, created.id, token=created.read_token)
    finally:
        proxy.stop()
    assert proxy.cut and connections == 2
    sequences = [m["metadata"]["sequence"] for m in messages]
    assert sequences == list(range(1, sequences[-1] + 1)) and len(sequences) == 44
    assert of_type(state, "text")[0]["props"]["content"] == "".join(words)
    assert state.status == "completed"
    assert same(state, producer.snapshot(created.id))


def test_a_cut_openai_connection_resumes_from_the_same_start(server: Any) -> None:
    producer = agentmux.Client(server.base_url)
    created = producer.create_stream()
    words = [f"v{i} " for i in range(30)]
    producer.append(created.id, [text(w) for w in words], write_token=created.write_token)
    producer.end(created.id, write_token=created.write_token)
    straight = list(producer.watch(created.id, format="openai"))
    proxy = CuttingProxy(server.base_url, b'"v12 "')
    try:
        resumed = list(agentmux.Client(proxy.base_url).watch(created.id, format="openai"))
    finally:
        proxy.stop()
    assert proxy.cut
    assert resumed == straight
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in resumed if c.get("choices"))
    assert content == "".join(words)


def test_a_watcher_from_a_sequence_gets_what_follows_it(server: Any) -> None:
    client = agentmux.Client(server.base_url)
    created = client.create_stream()
    client.append(created.id, [text("a "), text("b "), text("c ")], write_token=created.write_token)
    client.end(created.id, write_token=created.write_token)
    messages, _ = watch_all(client, created.id, from_sequence=3)
    assert [m["metadata"]["sequence"] for m in messages] == [4, 5, 6, 7]
    # After the last sequence of an ended stream: nothing (204).
    assert list(client.watch(created.id, from_sequence=7)) == []


def test_a_chat_run_is_watched_to_its_end(server: Any) -> None:
    client = agentmux.Client(server.base_url)
    run = client.chat(model="echo", messages=[{"role": "user", "content": "hello there"}])
    state = None
    for update in run:
        state = update.state
    assert state is not None and state.status == "completed" and state.id == run.stream_id
    assert "".join(m["props"]["content"] for m in state.messages if m["type"] == "text") == "hello there"


def test_an_error_answer_is_an_agentmux_error(keyed: Any) -> None:
    with pytest.raises(agentmux.AgentmuxError) as missing:
        list(agentmux.Client(keyed.base_url).watch("0" * 32))
    assert missing.value.status == 401 and missing.value.code == "missing_credentials"
    with pytest.raises(ValueError):
        agentmux.Client(keyed.base_url).watch("x", format="nope")
