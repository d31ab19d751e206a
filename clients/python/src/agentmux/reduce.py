"""The delta reducer, exactly as agentmux applies it (src/output/reducer.rs and path.rs) and as the TypeScript
client's `reduce.ts` does: a message without a known `message_id` is a new message; a whole message with a
known id replaces it; a delta changes the value at its `delta_path` (the type's main field when absent, the
whole props when empty) by `append`, `replace`, `merge` or `set`. The state also follows the stream's
lifecycle events, so it serialises (`json.dumps`) to the same JSON as the service's snapshot
(`GET /v1/streams/{id}`): `{id, status, epoch, last_sequence, messages}`, in that order.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Optional

from .errors import DeltaError

_MAIN_FIELDS = {"text": "content", "thinking": "content", "loading": "message", "tool_call": "arguments"}
_INDEX = re.compile(r"^[0-9]+$")


class StreamState(dict):  # type: ignore[type-arg]
    """What a stream amounts to: a dict with the snapshot's keys in its order, and typed accessors."""

    def __init__(self) -> None:
        super().__init__(id="", status="open", epoch="", last_sequence=0, messages=[])
        self._slots: dict[str, int] = {}

    @property
    def id(self) -> str:
        """The stream's id (from its `stream_start`)."""
        return str(self["id"])

    @property
    def status(self) -> str:
        """`open`, or how it ended: `completed`, `cancelled`, `error`."""
        return str(self["status"])

    @property
    def epoch(self) -> str:
        """The stream's epoch: which history this is."""
        return str(self["epoch"])

    @property
    def last_sequence(self) -> int:
        """The last sequence applied."""
        return int(self["last_sequence"])

    @property
    def messages(self) -> list[dict[str, Any]]:
        """Every message with its deltas applied, in order of first appearance."""
        messages: list[dict[str, Any]] = self["messages"]
        return messages

    @classmethod
    def from_snapshot(cls, snapshot: dict[str, Any]) -> StreamState:
        """The state a snapshot (`GET /v1/streams/{id}`) describes, ready to reduce further messages."""
        state = cls()
        for key in ("id", "status", "epoch", "last_sequence", "messages"):
            if key in snapshot:
                state[key] = snapshot[key]
        for extra in snapshot.keys() - state.keys():
            state[extra] = snapshot[extra]
        state._slots = {m["message_id"]: i for i, m in enumerate(state.messages) if m.get("message_id")}
        return state


def initial_state() -> StreamState:
    """An empty stream's state."""
    return StreamState()


def main_field(kind: str) -> Optional[str]:
    """The field a delta without `delta_path` changes."""
    return _MAIN_FIELDS.get(kind)


def reduce(state: StreamState, message: dict[str, Any]) -> StreamState:
    """Applies `message` to `state` (in place) and returns it.

    >>> state = reduce(initial_state(), {"type": "text", "props": {"content": "Hel"}, "message_id": "m"})
    >>> _ = reduce(state, {"type": "text", "props": {"content": "lo"}, "message_id": "m", "delta": True})
    >>> state.messages[0]["props"]["content"]
    'Hello'
    """
    _follow(state, message)
    message_id = message.get("message_id")
    slot = state._slots.get(message_id) if isinstance(message_id, str) else None
    if slot is None:
        if isinstance(message_id, str):
            state._slots[message_id] = len(state.messages)
        state.messages.append(_to_state(message))
    elif message.get("delta"):
        state.messages[slot] = _apply_delta(state.messages[slot], message)
    else:
        state.messages[slot] = _to_state(message)
    return state


def _follow(state: StreamState, message: dict[str, Any]) -> None:
    """What the lifecycle says of the stream: its id and epoch, its status once it ends, its last sequence."""
    metadata = message.get("metadata") or {}
    sequence = metadata.get("sequence") if isinstance(metadata, dict) else None
    if isinstance(sequence, int) and sequence > state.last_sequence:
        state["last_sequence"] = sequence
    if message.get("type") != "event" or message.get("delta"):
        return
    props = message.get("props") or {}
    data = props.get("data") or {}
    if not isinstance(data, dict):
        return
    if props.get("event") == "stream_start":
        if isinstance(data.get("stream_id"), str):
            state["id"] = data["stream_id"]
        if isinstance(data.get("epoch"), str):
            state["epoch"] = data["epoch"]
    elif props.get("event") == "stream_end" and isinstance(data.get("status"), str):
        state["status"] = data["status"]


def _canonical(kind: str, props: Any, message_id: Any, block_id: Any, thread_id: Any, metadata: Any) -> dict[str, Any]:
    """The fields that are there, in the order the service writes them."""
    out: dict[str, Any] = {"type": kind, "props": props}
    for key, value in (("message_id", message_id), ("block_id", block_id), ("thread_id", thread_id)):
        if value is not None:
            out[key] = value
    if metadata is not None:
        out["metadata"] = metadata
    return out


def _to_state(message: dict[str, Any]) -> dict[str, Any]:
    """A message as state: no chunk id and no delta fields."""
    return _canonical(
        message.get("type") or "",
        copy.deepcopy(message.get("props") or {}),
        message.get("message_id"),
        message.get("block_id"),
        message.get("thread_id"),
        copy.deepcopy(message.get("metadata")),
    )


def _segments(delta: dict[str, Any]) -> list[str]:
    path = delta.get("delta_path")
    if path == "":
        return []
    if path is not None:
        return str(path).split(".")
    main = main_field(delta.get("type") or "")
    return [] if main is None else [main]


class _PathError(Exception):
    def __init__(self, segment: str, conflict: Optional[tuple[str, str]] = None) -> None:
        super().__init__(segment)
        self.segment = segment
        self.conflict = conflict


def _apply_delta(current: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    kind = delta.get("type") or ""
    if kind != current.get("type") and not delta.get("type_change"):
        raise DeltaError(
            f'delta of type "{kind}" for message "{current.get("message_id") or ""}" of type '
            f'"{current.get("type")}" (set type_change to change it)',
            "type",
        )
    segments = _segments(delta)
    field = "props" if not segments else "props." + ".".join(segments)
    action = delta.get("delta_action") or ("merge" if not segments else "append")
    props = delta.get("props") or {}
    if not segments:
        value: Any = props
    else:
        value = _get(props[segments[0]], segments[1:]) if segments[0] in props else _MISSING
        if value is _MISSING:
            raise DeltaError("the delta carries no value at its delta_path", field)
    # On a copy: a delta that cannot apply changes nothing.
    root = copy.deepcopy(current.get("props") or {})
    try:
        _apply(root, segments, action, value)
    except _PathError as error:
        if error.conflict:
            reason = f"cannot {action} {error.conflict[1]} to {error.conflict[0]}"
        else:
            reason = f'no object or array at "{error.segment}" (only set creates the way)'
        raise DeltaError(reason, field) from None
    metadata = delta.get("metadata")
    return _canonical(
        kind,
        root,
        current.get("message_id"),
        delta.get("block_id") if delta.get("block_id") is not None else current.get("block_id"),
        delta.get("thread_id") if delta.get("thread_id") is not None else current.get("thread_id"),
        copy.deepcopy(metadata) if metadata is not None else current.get("metadata"),
    )


_MISSING = object()


def _kind_name(value: Any) -> str:
    if value is None or value is _MISSING:
        return "null"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an object"


def _index(segment: str) -> Optional[int]:
    return int(segment) if _INDEX.match(segment) else None


def _get(node: Any, path: list[str]) -> Any:
    for segment in path:
        if isinstance(node, dict):
            node = node.get(segment, _MISSING)
        elif isinstance(node, list):
            i = _index(segment)
            node = node[i] if i is not None and i < len(node) else _MISSING
        else:
            return _MISSING
        if node is _MISSING:
            return _MISSING
    return node


def _array_index(segment: str, length: int) -> int:
    i = _index(segment)
    if i is None or i > length:
        raise _PathError(segment)
    return i


def _child(node: Any, segment: str, create: bool) -> Any:
    if isinstance(node, dict):
        if node.get(segment) is None:
            if not create:
                raise _PathError(segment)
            node[segment] = {}
        return node[segment]
    if isinstance(node, list):
        i = _array_index(segment, len(node))
        if i >= len(node):
            raise _PathError(segment)
        return node[i]
    raise _PathError(segment)


def _check(target: Any, action: str, value: Any) -> None:
    present = None if target is _MISSING else target
    if action in ("replace", "set"):
        ok = True
    elif action == "append":
        ok = present is None or (isinstance(value, str) if isinstance(present, str) else isinstance(present, list))
    else:
        ok = (present is None or isinstance(present, dict)) and isinstance(value, dict)
    if not ok:
        raise _PathError("", ("nothing" if present is None else _kind_name(present), _kind_name(value)))


def _written(target: Any, action: str, value: Any) -> Any:
    """The new value of `target` after `action` with `value`."""
    if action == "append" and isinstance(target, str) and isinstance(value, str):
        return target + value
    if action == "append" and isinstance(target, list):
        return target + copy.deepcopy(value) if isinstance(value, list) else [*target, copy.deepcopy(value)]
    if action == "merge" and isinstance(target, dict) and isinstance(value, dict):
        for key, item in value.items():
            target[key] = copy.deepcopy(item)
        return target
    return copy.deepcopy(value)


def _apply(root: dict[str, Any], path: list[str], action: str, value: Any) -> None:
    if not path:
        _check(root, action, value)
        result = _written(root, action, value)
        if result is not root:
            # Only a merge or a replace reaches the whole props; a replace with a non-object leaves them
            # empty, as in the service (its props stay an object).
            root.clear()
            if isinstance(result, dict):
                root.update(result)
        return
    leaf = path[-1]
    node: Any = root
    for segment in path[:-1]:
        node = _child(node, segment, action == "set")
    if isinstance(node, dict):
        current = node.get(leaf, _MISSING)
        _check(current, action, value)
        node[leaf] = copy.deepcopy(value) if current is _MISSING else _written(current, action, value)
    elif isinstance(node, list):
        i = _array_index(leaf, len(node))
        current = node[i] if i < len(node) else _MISSING
        _check(current, action, value)
        if i < len(node):
            node[i] = _written(current, action, value)
        else:
            node.append(copy.deepcopy(value))
    else:
        raise _PathError(leaf)
