"""The HTTP requests of agentmux's API and the reading of their answers, shared by `Client` and `AsyncClient`
(which only send them, one with a blocking and one with an async `httpx` client): each call is a
`Request` value built here and an answer read here, so the two clients cannot drift apart. Also what a
producer retries and how long it waits (`retry_delay`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence
from urllib.parse import quote

import httpx

from .errors import AgentmuxError

#: How long a request may take by default (connect, read, write, pool), in seconds.
DEFAULT_TIMEOUT = 30.0
#: Attempts after the first that a single write (`append`, `end_message`, `end_block`) makes by default.
DEFAULT_RETRIES = 3


@dataclass(frozen=True)
class Created:
    """A stream just created: its id, its epoch and its two tokens."""

    id: str
    epoch: str
    read_token: str
    write_token: str
    token_expires_at: Optional[int] = None


@dataclass(frozen=True)
class Appended:
    """What an append (or the end of a message or block) wrote: the sequences of the messages sent, the
    stream's last sequence right after it, and whether this answer is a repeat's (the batch had landed)."""

    sequences: list[int]
    last_sequence: int
    replayed: bool = False


@dataclass(frozen=True)
class Ended:
    """A stream's end: its status and last sequence."""

    id: str
    status: str
    last_sequence: int


@dataclass
class Request:
    """One request, ready for either client to send."""

    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    body: Optional[bytes] = None


def stream_path(stream_id: str, rest: str = "") -> str:
    return f"/v1/streams/{quote(stream_id, safe='')}{rest}"


def headers(
    api_key: Optional[str], credential: Optional[str], extra: Optional[dict[str, str]] = None
) -> dict[str, str]:
    """The request's headers: `credential` (a token) where given, else the client's key."""
    out = dict(extra or {})
    key = credential if credential is not None else api_key
    if key:
        out["authorization"] = f"Bearer {key}"
    return out


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def create_stream(api_key: Optional[str], model: Optional[str], token_ttl: Optional[int]) -> Request:
    body: dict[str, Any] = {}
    if model is not None:
        body["model"] = model
    if token_ttl is not None:
        body["token_ttl"] = token_ttl
    return Request("POST", "/v1/streams", headers(api_key, None, {"content-type": "application/json"}), {}, _json(body))


def append(
    api_key: Optional[str],
    stream_id: str,
    messages: Sequence[Any] | dict[str, Any],
    write_token: Optional[str],
    after: Optional[int],
    idempotency_key: Optional[str],
) -> Request:
    extra = {"content-type": "application/json"}
    if idempotency_key is not None:
        extra["idempotency-key"] = idempotency_key
    params = {} if after is None else {"after": str(after)}
    body = messages if isinstance(messages, dict) else list(messages)
    return Request(
        "POST", stream_path(stream_id, "/messages"), headers(api_key, write_token, extra), params, _json(body)
    )


def end(
    api_key: Optional[str], stream_id: str, outcome: Optional[dict[str, Any]], write_token: Optional[str]
) -> Request:
    body = b"" if outcome is None else _json(outcome)
    extra = {"content-type": "application/json"} if outcome is not None else {}
    return Request("POST", stream_path(stream_id, "/end"), headers(api_key, write_token, extra), {}, body)


def cancel(api_key: Optional[str], stream_id: str, write_token: Optional[str]) -> Request:
    return Request("POST", stream_path(stream_id, "/cancel"), headers(api_key, write_token))


def end_part(api_key: Optional[str], stream_id: str, kind: str, part_id: str, write_token: Optional[str]) -> Request:
    """`POST /v1/streams/{id}/messages/{message_id}/end` (`kind` "messages") or `/blocks/{block_id}/end`."""
    path = stream_path(stream_id, f"/{kind}/{quote(part_id, safe='')}/end")
    return Request("POST", path, headers(api_key, write_token), {}, b"")


def snapshot(api_key: Optional[str], stream_id: str, token: Optional[str]) -> Request:
    return Request("GET", stream_path(stream_id), headers(api_key, token))


def chat(api_key: Optional[str], body: dict[str, Any]) -> Request:
    return Request(
        "POST",
        "/v1/chat/completions",
        headers(api_key, None, {"content-type": "application/json"}),
        {"accept": "cui"},
        _json({**body, "stream": True}),
    )


def failure(response: httpx.Response) -> AgentmuxError:
    """The error an answer that is not a success stands for (its body read already)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    return AgentmuxError.from_body(response.status_code, body, response.reason_phrase)


def checked(response: httpx.Response) -> Any:
    """The answer's JSON, or the `AgentmuxError` it stands for."""
    if response.status_code >= 400:
        raise failure(response)
    if not response.content:
        return None
    return response.json()


def created(body: Any) -> Created:
    return Created(
        id=body["id"],
        epoch=body["epoch"],
        read_token=body["read_token"],
        write_token=body["write_token"],
        token_expires_at=body.get("token_expires_at"),
    )


def appended(response: httpx.Response) -> Appended:
    body = checked(response) or {}
    sequences = [int(s) for s in body.get("sequences", [])]
    last = body.get("last_sequence")
    return Appended(
        sequences=sequences,
        last_sequence=int(last) if isinstance(last, int) else (sequences[-1] if sequences else 0),
        replayed=response.headers.get("idempotent-replayed", "").lower() == "true",
    )


def ended(response: httpx.Response) -> Ended:
    body = checked(response) or {}
    return Ended(
        id=str(body.get("id", "")), status=str(body.get("status", "")), last_sequence=int(body.get("last_sequence", 0))
    )


def retry_after(response: httpx.Response) -> Optional[float]:
    """How long the service asked to wait before a retry (`retry-after`, whole seconds), if it did."""
    value = response.headers.get("retry-after")
    try:
        asked = float(value) if value is not None else 0.0
    except ValueError:
        return None
    return asked if asked > 0 else None


def retryable(response: httpx.Response) -> bool:
    """Whether a write may be sent again, by the TypeScript client's rule: a 5xx the service does not mark
    `x-should-retry: false` (`503 writer_unreachable`, say), or a 429 with `retry-after`. (A lost answer, no
    response at all, is retried too.)"""
    if response.headers.get("x-should-retry", "").lower() == "false":
        return False
    return response.status_code >= 500 or (response.status_code == 429 and retry_after(response) is not None)


def retry_delay(attempt: int, asked: Optional[float] = None) -> float:
    """The wait before retry `attempt` (from 1): 100 ms doubling, at most 2 s, or the `retry-after` the
    service gave (at most 10 s), as the TypeScript client waits."""
    if asked is not None:
        return min(10.0, asked)
    delay: float = min(2.0, 0.1 * 2.0 ** (attempt - 1))
    return delay


def fresh_key() -> str:
    """A new idempotency key: 128 random bits in hex."""
    return uuid.uuid4().hex
