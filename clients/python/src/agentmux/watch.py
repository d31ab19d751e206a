"""What a watcher knows between connections, shared by `Client.watch` and `AsyncClient.watch` (which only
open the event streams and wait): where to resume, which events a resumed stream repeats, when the stream
has ended, and the typed errors.

- CUI: each event carries its sequence (`id:`); a cut connection resumes with `Last-Event-ID` after the
  last one seen, and a message at or before it is dropped. Each message is reduced into the state
  (`Update(message, state)`).
- Other formats carry no sequence: a cut connection subscribes again from the same `from`, and the events
  already delivered are skipped by count (every subscriber of a format reads the same rendition of the
  stream, so the events come again in the same order). Each event is its parsed JSON (`dict`); the end is the
  format's own last event (`[DONE]`, `RUN_FINISHED`, `message_stop`, `response.completed` ...).
- The typed errors, alike in every format: the service's lagged notice, in the format's own shape (CUI's
  `error` without a sequence, OpenAI's error object and AG-UI's `RUN_ERROR` with code `lagged`, ...: see
  `_lagged_message`), is a `LaggedError` naming where the service says to resume; and every answer names the
  stream's epoch (`x-agentmux-epoch`), which must stay the first answer's on every reconnect, else
  `EpochChangedError` (the formats other than CUI carry no epoch, and a resumed CUI subscription starts after
  the `stream_start` that names it, so the header is the one check for all).
- A connection that fails or closes before the end is retried after 100 ms, doubling to 5 s, at most
  `retries` times in a row; a `204` (nothing after that sequence, and the stream has ended) ends the watch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from .errors import AgentmuxError, EpochChangedError, LaggedError
from .reduce import StreamState, initial_state, reduce

#: The formats `GET /v1/streams/{id}/events` speaks.
FORMATS = ("cui", "openai", "ui-message", "ag-ui", "anthropic", "responses")
#: The `type` of each format's last event (besides `[DONE]`), after which its body ends.
_LAST = {
    "ag-ui": {"RUN_FINISHED", "RUN_ERROR"},
    "anthropic": {"message_stop", "error"},
    "responses": {"response.completed", "response.incomplete", "response.failed"},
}

#: The header naming the stream's epoch on every answer to a subscription.
EPOCH_HEADER = "x-agentmux-epoch"
#: How the service's lagged notice begins in every format; the UI message stream's (`{"type": "error",
#: "errorText"}`, all the AI SDK allows) has no code, so there the text is what tells it from a stream's error.
_LAGGED_TEXT = "the history this subscriber needs is no longer kept here"
#: Where the notice's text says to resume (every format's notice carries the same text).
_RESUME = re.compile(r"resume after sequence (\d+)")


@dataclass
class Update:
    """One CUI message as it arrived, and the stream's state with it applied."""

    message: dict[str, Any]
    state: StreamState


@dataclass
class WatchOptions:
    """How to watch: the format and its shaping options, where to start, the credential and the retries."""

    format: str = "cui"
    token: Optional[str] = None
    from_sequence: int = 0
    include_usage: Optional[bool] = None
    reasoning: Optional[str] = None
    agent_tools: Optional[str] = None
    retries: int = 8


class Follower:
    """One watch's progress across its connections."""

    def __init__(self, stream_id: str, options: WatchOptions) -> None:
        if options.format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {options.format!r}")
        self.stream_id = stream_id
        self.options = options
        self.cui = options.format == "cui"
        self.state = initial_state()
        self.last = options.from_sequence
        self.epoch: Optional[str] = None
        self.delivered = 0
        self.seen = 0
        self.ended = False
        self.failures = 0

    def params(self) -> dict[str, str]:
        """The query of the next connection."""
        o = self.options
        params = {"format": o.format}
        if not self.cui and o.from_sequence:
            params["from"] = str(o.from_sequence)
        for name, value in (
            ("include_usage", o.include_usage),
            ("reasoning", o.reasoning),
            ("agent_tools", o.agent_tools),
        ):
            if value is not None:
                params[name] = str(value).lower() if isinstance(value, bool) else str(value)
        return params

    def headers(self) -> dict[str, str]:
        """The extra headers of the next connection (beside the credential)."""
        headers = {"accept": "text/event-stream"}
        if self.cui and self.last > 0:
            headers["last-event-id"] = str(self.last)
        return headers

    def answered(self, epoch: Optional[str]) -> None:
        """A new connection answered (naming the stream's epoch): the events it repeats are counted again, and
        its epoch must be the first answer's."""
        self.seen = 0
        if not epoch:
            return
        if self.epoch is None:
            self.epoch = epoch
        elif epoch != self.epoch:
            raise EpochChangedError(self.epoch, epoch)

    def on_event(self, data: str) -> Any:
        """The update (CUI) or event (other formats) an SSE event's data stands for, or None to skip it."""
        if not data:
            return None  # a block without data (the `retry:` hint): no event
        return self._cui(data) if self.cui else self._other(data)

    def _cui(self, data: str) -> Optional[Update]:
        message = json.loads(data)
        if not isinstance(message, dict):
            return None
        metadata = message.get("metadata") or {}
        sequence = metadata.get("sequence") if isinstance(metadata, dict) else None
        props = message.get("props") or {}
        if not isinstance(sequence, int):
            if message.get("type") == "error" and props.get("code") == "lagged":
                details = props.get("details") or {}
                resume_from = details.get("resume_from") if isinstance(details, dict) else None
                raise LaggedError(resume_from if isinstance(resume_from, int) else 0)
            sequence = 0
        if sequence != 0 and sequence <= self.last:
            return None
        self.last = max(self.last, sequence)
        self.failures = 0
        reduce(self.state, message)
        if message.get("type") == "event" and props.get("event") == "stream_end":
            self.ended = True
        return Update(message, self.state)

    def _other(self, data: str) -> Optional[dict[str, Any]]:
        if data == "[DONE]":
            self.ended = True
            return None
        self.seen += 1
        if self.seen <= self.delivered:
            return None
        event = json.loads(data)
        if isinstance(event, dict):
            notice = _lagged_message(self.options.format, event)
            if notice is not None:
                resume = _RESUME.search(notice)
                raise LaggedError(int(resume.group(1)) if resume else 0)
        self.delivered += 1
        self.failures = 0
        kind = event.get("type") if isinstance(event, dict) else None
        if kind in _LAST.get(self.options.format, ()):
            self.ended = True
        return event if isinstance(event, dict) else {"value": event}

    def retry_after_failure(self, error: Optional[BaseException]) -> float:
        """How long to wait before the next connection, or raises when the retries are spent."""
        self.failures += 1
        if self.failures > self.options.retries:
            if error is not None:
                raise error
            raise AgentmuxError(
                f"the stream {self.stream_id} closed before its end {self.options.retries} times", code="closed"
            )
        delay: float = min(5.0, 0.1 * 2.0 ** (self.failures - 1))
        return delay


def _lagged_message(format: str, event: dict[str, Any]) -> Optional[str]:
    """The text of the service's lagged notice when `event` is one, in that format's shape (`docs/http-api.md`,
    "Slow readers and `lagged`"); None for any other event, a stream's own error among them."""
    kind = event.get("type")
    error = event.get("error")
    if format == "ui-message":
        text = event.get("errorText")
        return text if kind == "error" and isinstance(text, str) and text.startswith(_LAGGED_TEXT) else None
    if format == "openai":
        notice = error if isinstance(error, dict) and error.get("code") == "lagged" else None
    elif format == "anthropic":
        notice = error if kind == "error" and isinstance(error, dict) and error.get("type") == "lagged" else None
    elif format == "ag-ui":
        notice = event if kind == "RUN_ERROR" and event.get("code") == "lagged" else None
    elif format == "responses":
        notice = event if kind == "error" and event.get("code") == "lagged" else None
    else:
        notice = None
    if notice is None:
        return None
    message = notice.get("message")
    return message if isinstance(message, str) else ""
