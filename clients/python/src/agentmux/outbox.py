"""What a producer has emitted and not yet sent, in order: messages, and the ends of messages and blocks
(which go by their own routes). Shared by the thread of `Producer` and the task of `AsyncProducer`, which
only decide when to take the next batch; the batch itself is decided here: every pending message up to the
next end (at most `max_batch`), or that end alone.

A text-like delta (the main field of `text`, `thinking` or `tool_call`, appended) that continues the pending
message just before it, with nothing else in it, is merged into that one before sending: a token loop then
costs one message per batch and per message rather than one per token. Readers see the same text; only the
`chunk_count` of the message's `message_end` is smaller.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional, Union

from .reduce import main_field

_SAME = ("type", "message_id", "block_id", "thread_id")


@dataclass(frozen=True)
class PartEnd:
    """The end of one message (`kind` "messages") or one block (`kind` "blocks")."""

    kind: str
    id: str


Op = Union[list[dict[str, Any]], PartEnd]


class Outbox:
    """The pending ops, oldest first, and when the oldest pending message was emitted."""

    def __init__(self) -> None:
        self._items: deque[Union[dict[str, Any], PartEnd]] = deque()
        self.first_at: Optional[float] = None

    def __len__(self) -> int:
        return len(self._items)

    def push(self, item: Union[dict[str, Any], PartEnd]) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()
        last = self._items[-1] if self._items else None
        if isinstance(item, dict) and isinstance(last, dict) and _merge(last, item):
            return
        self._items.append(item)

    def starts_with_end(self) -> bool:
        return bool(self._items) and isinstance(self._items[0], PartEnd)

    def take(self, max_batch: int) -> Optional[Op]:
        """The next op: the ends first in line alone, else the messages before the next end."""
        if not self._items:
            return None
        head = self._items[0]
        if isinstance(head, PartEnd):
            self._items.popleft()
            op: Op = head
        else:
            batch: list[dict[str, Any]] = []
            while self._items and len(batch) < max_batch and isinstance(self._items[0], dict):
                batch.append(self._items.popleft())  # type: ignore[arg-type]
            op = batch
        self.first_at = time.monotonic() if self._items else None
        return op

    def clear(self) -> None:
        self._items.clear()
        self.first_at = None


def _merge(last: dict[str, Any], delta: dict[str, Any]) -> bool:
    """Appends `delta`'s text to `last` when both are the same message's appended text; says whether it did."""
    if not delta.get("delta") or not last.get("delta"):
        return False
    if any(last.get(key) != delta.get(key) for key in _SAME):
        return False
    plain = ("delta_path", "delta_action", "type_change", "metadata", "chunk_id")
    if any(delta.get(key) is not None for key in plain) or any(last.get(key) is not None for key in plain):
        return False
    field = main_field(str(delta.get("type", "")))
    props = delta.get("props") or {}
    before = (last.get("props") or {}).get(field)
    if field is None or set(props) != {field} or not isinstance(props[field], str) or not isinstance(before, str):
        return False
    last["props"][field] = before + props[field]
    return True
