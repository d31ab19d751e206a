"""Reading what a bridge published: the stream's snapshot (`GET /v1/streams/{id}`), split into the producer's
messages and the stream's own lifecycle events."""

from __future__ import annotations

from typing import Any

import httpx

LIFECYCLE = {"stream_start", "stream_end", "message_start", "message_end", "block_start", "block_end"}


def snapshot(base_url: str, stream_id: str) -> dict[str, Any]:
    answer = httpx.get(f"{base_url}/v1/streams/{stream_id}", timeout=10, trust_env=False)
    answer.raise_for_status()
    return answer.json()  # type: ignore[no-any-return]


def is_lifecycle(message: dict[str, Any]) -> bool:
    return message["type"] == "event" and message["props"].get("event") in LIFECYCLE


def published(state: dict[str, Any]) -> list[tuple[str, Any, dict[str, Any]]]:
    """The producer's messages, deltas applied: (type, block id, props)."""
    return [(m["type"], m.get("block_id"), m["props"]) for m in state["messages"] if not is_lifecycle(m)]


def blocks(state: dict[str, Any]) -> list[tuple[str, str]]:
    """The blocks' starts and ends in order: (event, block id)."""
    return [
        (m["props"]["event"], m["props"]["data"]["block_id"])
        for m in state["messages"]
        if is_lifecycle(m) and m["props"]["event"] in ("block_start", "block_end")
    ]


def stream_end(state: dict[str, Any]) -> dict[str, Any]:
    last = state["messages"][-1]
    assert last["props"]["event"] == "stream_end", last
    return last["props"]["data"]  # type: ignore[no-any-return]
