"""The producer's emit methods, shared by `Producer` and `AsyncProducer`: each builds one typed message (the
props the schema gives its type, a `message_id` of its own) and enqueues it without waiting; the streaming
handles (`TextStream` for text and thinking, `ToolCallStream`) and `run.block()`. Which thread or task sends
what is enqueued is the producer's business (`_enqueue`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Optional, Union

from .outbox import PartEnd

#: The ids a message may be given by the caller, beside its props.
_IDS = ("message_id", "block_id", "thread_id")


def new_id(prefix: str = "m") -> str:
    """A fresh id: the prefix and 32 hex digits of a random UUID."""
    return f"{prefix}_{uuid.uuid4().hex}"


class Emitter:
    """The emit methods; a subclass provides `_enqueue` (never blocking) and the stream's identity."""

    def __init__(self) -> None:
        self._blocks: list[str] = []

    def _enqueue(self, item: Union[dict[str, Any], PartEnd]) -> None:
        raise NotImplementedError

    def _message(self, kind: str, props: dict[str, Any], ids: dict[str, Any], delta: bool = False) -> str:
        unknown = set(ids) - set(_IDS)
        if unknown:
            raise TypeError(f"unexpected keyword arguments: {sorted(unknown)}")
        message_id = ids.get("message_id") or new_id()
        message: dict[str, Any] = {"type": kind, "props": props, "message_id": message_id}
        block_id = ids.get("block_id") or (self._blocks[-1] if self._blocks else None)
        if block_id:
            message["block_id"] = block_id
        if ids.get("thread_id"):
            message["thread_id"] = ids["thread_id"]
        if delta:
            message["delta"] = True
        self._enqueue(message)
        return message_id

    def text(self, content: str, **ids: Any) -> str:
        """A whole `text` message; returns its message id. `ids`: `message_id`, `block_id`, `thread_id`."""
        return self._message("text", {"content": content}, ids)

    def thinking(self, content: str, **ids: Any) -> str:
        """A whole `thinking` message (the model's reasoning)."""
        return self._message("thinking", {"content": content}, ids)

    def loading(self, message: str, done: Optional[bool] = None, **ids: Any) -> str:
        """A `loading` indicator; emit it again with the same `message_id` and `done=True` when done."""
        props: dict[str, Any] = {"message": message}
        if done is not None:
            props["done"] = done
        return self._message("loading", props, ids)

    def tool_call(
        self,
        name: str,
        arguments: Union[str, dict[str, Any], None] = None,
        call_id: Optional[str] = None,
        server_side: bool = True,
        **ids: Any,
    ) -> str:
        """A whole `tool_call`; `arguments` as JSON text or a dict. The call's id is `call_id`, else its
        message id (which `tool_result` then names)."""
        message_id = ids.pop("message_id", None) or new_id("call")
        text = arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {})
        props = {"id": call_id or message_id, "name": name, "arguments": text, "server_side": server_side}
        return self._message("tool_call", props, {**ids, "message_id": message_id})

    def tool_result(
        self,
        call_id: str,
        result: Any = None,
        error: Union[str, dict[str, Any], None] = None,
        name: Optional[str] = None,
        **ids: Any,
    ) -> str:
        """A `tool_result` answering the call `call_id`: its `result` (any JSON) or its `error` (a message,
        or `{"message", "code"?}`)."""
        props: dict[str, Any] = {"call_id": call_id}
        if name is not None:
            props["name"] = name
        if error is not None:
            props["error"] = {"message": error} if isinstance(error, str) else error
        else:
            props["result"] = result
        return self._message("tool_result", props, ids)

    def _media(self, kind: str, url: str, props: dict[str, Any]) -> str:
        ids = {key: props.pop(key) for key in _IDS if key in props}
        return self._message(kind, {"url": url, **props}, ids)

    def image(self, url: str, **props: Any) -> str:
        """An `image` (`alt`, `width`, `height`, `detail` as props)."""
        return self._media("image", url, props)

    def audio(self, url: str, **props: Any) -> str:
        """An `audio` (`format`, `duration`, `transcript` ...)."""
        return self._media("audio", url, props)

    def video(self, url: str, **props: Any) -> str:
        """A `video` (`thumbnail`, `duration`, `autoplay` ...)."""
        return self._media("video", url, props)

    def file(self, url: str, **props: Any) -> str:
        """A `file` (`name`, `mime`, `size`)."""
        return self._media("file", url, props)

    def action(self, name: str, payload: Any = None, **ids: Any) -> str:
        """An `action` for the client application."""
        props: dict[str, Any] = {"name": name}
        if payload is not None:
            props["payload"] = payload
        return self._message("action", props, ids)

    def event(self, name: str, data: Optional[dict[str, Any]] = None, message: Optional[str] = None, **ids: Any) -> str:
        """An `event` (not one of the stream's own lifecycle names, which the service refuses)."""
        props: dict[str, Any] = {"event": name}
        if message is not None:
            props["message"] = message
        if data is not None:
            props["data"] = data
        return self._message("event", props, ids)

    def error(self, message: str, code: Optional[str] = None, **ids: Any) -> str:
        """An `error` message (the stream goes on; `end(status="error")` ends it failed)."""
        props: dict[str, Any] = {"message": message}
        if code is not None:
            props["code"] = code
        return self._message("error", props, ids)

    def custom(self, type: str, props: dict[str, Any], **ids: Any) -> str:
        """A message of a custom type with its props."""
        return self._message(type, dict(props), ids)

    def text_stream(self, **ids: Any) -> TextStream:
        """A `text` message sent in fragments: `append(fragment)`, then `end()` (or leave its `with`)."""
        return TextStream(self, "text", ids)

    def thinking_stream(self, **ids: Any) -> TextStream:
        """A `thinking` message sent in fragments."""
        return TextStream(self, "thinking", ids)

    def tool_call_stream(
        self, name: str, call_id: Optional[str] = None, server_side: bool = True, **ids: Any
    ) -> ToolCallStream:
        """A `tool_call` whose arguments stream in fragments; its end is what lets readers take them whole."""
        return ToolCallStream(self, name, call_id, server_side, ids)

    def block(self, block_id: Optional[str] = None) -> Block:
        """A block (one step of the agent): `with run.block() as block_id:`; the messages emitted inside
        carry its id, and it is ended on exit."""
        return Block(self, block_id or new_id("b"))


class _Stream:
    """A message sent in fragments: the first chunk opens it, `end()` ends it by the end route."""

    def __init__(self, emitter: Emitter, kind: str, props: dict[str, Any], ids: dict[str, Any]) -> None:
        self._emitter = emitter
        self._kind = kind
        self._ended = False
        # Every fragment carries the ids of the first chunk, whatever block is open when it is appended.
        if not ids.get("block_id") and emitter._blocks:
            ids = {**ids, "block_id": emitter._blocks[-1]}
        self.id = emitter._message(kind, props, ids, delta=True)
        self._ids = {**ids, "message_id": self.id}

    def _fragment(self, field: str, fragment: str) -> None:
        if self._ended:
            raise RuntimeError(f"the {self._kind} message {self.id} has ended")
        if fragment:
            self._emitter._message(self._kind, {field: fragment}, dict(self._ids), delta=True)

    def end(self) -> None:
        """Ends the message (its `message_end`); a second call does nothing."""
        if not self._ended:
            self._ended = True
            self._emitter._enqueue(PartEnd("messages", self.id))

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()

    # `async with` too, for code that writes it under asyncio: entering and ending only enqueue, so both
    # forms do the same and neither waits.
    async def __aenter__(self) -> Any:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.end()


class TextStream(_Stream):
    """A `text` or `thinking` message streamed in fragments."""

    def __init__(self, emitter: Emitter, kind: str, ids: dict[str, Any]) -> None:
        super().__init__(emitter, kind, {"content": ""}, ids)

    def append(self, fragment: str) -> None:
        """Adds `fragment` to the text (merged with the fragments still pending)."""
        self._fragment("content", fragment)

    def __enter__(self) -> TextStream:
        return self


class ToolCallStream(_Stream):
    """A `tool_call` whose arguments stream in fragments; `call_id` is the id its result names."""

    def __init__(
        self, emitter: Emitter, name: str, call_id: Optional[str], server_side: bool, ids: dict[str, Any]
    ) -> None:
        message_id = ids.pop("message_id", None) or new_id("call")
        self.call_id = call_id or message_id
        props = {"id": self.call_id, "name": name, "arguments": "", "server_side": server_side}
        super().__init__(emitter, "tool_call", props, {**ids, "message_id": message_id})

    def append(self, fragment: str) -> None:
        """Adds a fragment of the arguments' JSON text."""
        self._fragment("arguments", fragment)

    def __enter__(self) -> ToolCallStream:
        return self


class Block:
    """A block of messages; a context manager giving its id."""

    def __init__(self, emitter: Emitter, block_id: str) -> None:
        self._emitter = emitter
        self.id = block_id
        self._ended = False

    def __enter__(self) -> str:
        self._emitter._blocks.append(self.id)
        return self.id

    def __exit__(self, *exc: object) -> None:
        self.end()

    async def __aenter__(self) -> str:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.end()

    def end(self) -> None:
        """Ends the block (the `message_end` of its open messages, then its `block_end`)."""
        if self.id in self._emitter._blocks:
            self._emitter._blocks.remove(self.id)
        if not self._ended:
            self._ended = True
            self._emitter._enqueue(PartEnd("blocks", self.id))
