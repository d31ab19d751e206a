"""Small helpers the tests share: watching a stream to its end, and the messages of a state by type."""

from __future__ import annotations

import json
from typing import Any

import agentmux


def watch_all(
    client: agentmux.Client, stream_id: str, token: str | None = None, **options: Any
) -> tuple[list[dict[str, Any]], agentmux.StreamState]:
    """Every message a CUI watcher gets, and the state at the end."""
    messages: list[dict[str, Any]] = []
    state = agentmux.initial_state()
    for update in client.watch(stream_id, token=token, **options):
        messages.append(update.message)
        state = update.state
    return messages, state


def same(a: Any, b: Any) -> bool:
    """Whether two values serialise to the same JSON, key order included."""
    return json.dumps(a) == json.dumps(b)


def of_type(state: agentmux.StreamState, kind: str) -> list[dict[str, Any]]:
    return [m for m in state.messages if m["type"] == kind]


def events(state: agentmux.StreamState, name: str) -> list[dict[str, Any]]:
    return [m for m in state.messages if m["type"] == "event" and m["props"].get("event") == name]
