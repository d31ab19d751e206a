"""`Client`: agentmux's HTTP API from blocking code. The producer calls (`create_stream`, `append` with its
safe-retry conditions, `end_message`, `end_block`, `end`, `cancel`), `snapshot`, `watch` (any format, resumed
across cut connections, see `watch.py`), `chat` (a chat run started and watched), and `stream`, the batching
producer (`producer.py`). The requests themselves are built and read in `api.py`, shared with `AsyncClient`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import httpx
from httpx_sse import connect_sse

from . import api
from .api import Appended, Created, Ended
from .errors import AgentmuxError
from .producer import Producer
from .reduce import StreamState
from .watch import EPOCH_HEADER, Follower, Update, WatchOptions


@dataclass
class ChatRun:
    """A chat run: its stream, a token to watch it with, and its updates to the end."""

    stream_id: str
    read_token: Optional[str]
    updates: Iterator[Update]

    def __iter__(self) -> Iterator[Update]:
        return self.updates


class Client:
    """A client of the service at `base_url` (`api_key` where it has keys).

    >>> client = Client("http://127.0.0.1:8080")          # doctest: +SKIP
    >>> with client.stream() as run:                       # doctest: +SKIP
    ...     run.text("Hello")
    """

    def __init__(
        self,
        base_url: str,
        api_key: Optional[str] = None,
        *,
        timeout: float = api.DEFAULT_TIMEOUT,
        http_client: Optional[httpx.Client] = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self._owned = http_client is None
        self.http = http_client or httpx.Client(timeout=timeout, trust_env=False)

    def close(self) -> None:
        """Closes the connections (of an `httpx.Client` this client made)."""
        if self._owned:
            self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, request: api.Request) -> httpx.Response:
        return self.http.request(
            request.method,
            self.base_url + request.path,
            headers=request.headers,
            params=request.params,
            content=request.body,
        )

    def create_stream(self, model: Optional[str] = None, token_ttl: Optional[int] = None) -> Created:
        """Creates a stream: its id, epoch and tokens."""
        return api.created(api.checked(self._send(api.create_stream(self.api_key, model, token_ttl))))

    def _write(
        self, request: api.Request, retries: int = api.DEFAULT_RETRIES, attempted: Optional[Callable[[], None]] = None
    ) -> Appended:
        """Sends a write, and the same request again (for an append, the same condition and key) when an
        attempt fails for a reason a retry may fix: no answer, or `api.retryable`."""
        attempt = 0
        while True:
            attempt += 1
            if attempted is not None:
                attempted()
            try:
                response = self._send(request)
            except httpx.TransportError:
                if attempt > retries:
                    raise
                time.sleep(api.retry_delay(attempt))
                continue
            if response.status_code < 400 or attempt > retries or not api.retryable(response):
                return api.appended(response)
            time.sleep(api.retry_delay(attempt, api.retry_after(response)))

    def append(
        self,
        stream_id: str,
        messages: Union[Sequence[dict[str, Any]], dict[str, Any]],
        *,
        write_token: Optional[str] = None,
        after: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        retries: int = api.DEFAULT_RETRIES,
    ) -> Appended:
        """Appends one message or a batch under an `Idempotency-Key` (a fresh one unless given) and, with
        `after`, only when it follows that sequence; retried after a lost answer, a repeat that had landed is
        answered as the first time (`replayed`) and appends nothing."""
        key = idempotency_key if idempotency_key is not None else api.fresh_key()
        return self._write(api.append(self.api_key, stream_id, messages, write_token, after, key), retries)

    def end_message(
        self, stream_id: str, message_id: str, *, write_token: Optional[str] = None, retries: int = api.DEFAULT_RETRIES
    ) -> Appended:
        """Ends one message (its `message_end`, when it is open; ending what is not open ends nothing)."""
        return self._write(api.end_part(self.api_key, stream_id, "messages", message_id, write_token), retries)

    def end_block(
        self, stream_id: str, block_id: str, *, write_token: Optional[str] = None, retries: int = api.DEFAULT_RETRIES
    ) -> Appended:
        """Ends one block (its open messages' `message_end`, then its `block_end`, when it is open)."""
        return self._write(api.end_part(self.api_key, stream_id, "blocks", block_id, write_token), retries)

    def end(
        self, stream_id: str, outcome: Optional[dict[str, Any]] = None, *, write_token: Optional[str] = None
    ) -> Ended:
        """Ends the stream (`completed` without an outcome)."""
        return api.ended(self._send(api.end(self.api_key, stream_id, outcome, write_token)))

    def cancel(self, stream_id: str, *, write_token: Optional[str] = None) -> None:
        """Cancels the stream: its agent is told to stop and it ends `cancelled`."""
        api.checked(self._send(api.cancel(self.api_key, stream_id, write_token)))

    def snapshot(self, stream_id: str, *, token: Optional[str] = None) -> StreamState:
        """The stream as the service reduces it (`GET /v1/streams/{id}`)."""
        return StreamState.from_snapshot(api.checked(self._send(api.snapshot(self.api_key, stream_id, token))))

    def stream(
        self,
        model: Optional[str] = None,
        *,
        flush_interval: float = 0.005,
        max_batch: int = 256,
        token_ttl: Optional[int] = None,
    ) -> Producer:
        """A producer of a new stream: `with client.stream() as run: run.text("hi")`."""
        return Producer(self, model, flush_interval=flush_interval, max_batch=max_batch, token_ttl=token_ttl)

    def chat(self, *, model: Optional[str] = None, messages: Sequence[Any], **fields: Any) -> ChatRun:
        """Starts a chat run (`POST /v1/chat/completions`) and watches its stream."""
        body: dict[str, Any] = {"messages": list(messages), **fields}
        if model is not None:
            body["model"] = model
        request = api.chat(self.api_key, body)
        with self.http.stream(
            request.method,
            self.base_url + request.path,
            headers=request.headers,
            params=request.params,
            content=request.body,
        ) as response:
            if response.status_code >= 400:
                response.read()
                raise api.failure(response)
            stream_id = response.headers.get("x-agentmux-stream-id")
            read_token = response.headers.get("x-agentmux-read-token")
        if not stream_id:
            raise AgentmuxError("the answer named no stream (x-agentmux-stream-id)")
        token = None if self.api_key else read_token
        return ChatRun(stream_id, read_token, self.watch(stream_id, token=token))

    def watch(
        self,
        stream_id: str,
        *,
        format: str = "cui",
        token: Optional[str] = None,
        from_sequence: int = 0,
        include_usage: Optional[bool] = None,
        reasoning: Optional[str] = None,
        agent_tools: Optional[str] = None,
        retries: int = 8,
    ) -> Iterator[Any]:
        """The stream's updates to its end: `Update(message, state)` for CUI, each event's JSON otherwise."""
        options = WatchOptions(format, token, from_sequence, include_usage, reasoning, agent_tools, retries)
        return self._watch(Follower(stream_id, options))

    def _watch(self, follower: Follower) -> Iterator[Any]:
        url = self.base_url + api.stream_path(follower.stream_id, "/events")
        timeout = httpx.Timeout(self.timeout, read=None)
        while not follower.ended:
            headers = api.headers(self.api_key, follower.options.token, follower.headers())
            try:
                with connect_sse(
                    self.http, "GET", url, params=follower.params(), headers=headers, timeout=timeout
                ) as source:
                    response = source.response
                    follower.answered(response.headers.get(EPOCH_HEADER))
                    if response.status_code == 204:
                        return
                    if response.status_code >= 400:
                        response.read()
                        raise api.failure(response)
                    for event in source.iter_sse():
                        item = follower.on_event(event.data)
                        if item is not None:
                            yield item
                        if follower.ended:
                            return
            except httpx.TransportError as error:
                time.sleep(follower.retry_after_failure(error))
                continue
            # The body ended before the stream did: resume.
            time.sleep(follower.retry_after_failure(None))
