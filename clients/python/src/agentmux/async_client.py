"""`AsyncClient`: the same calls as `Client`, awaited, over an `httpx.AsyncClient`; `watch` is an async
iterator and `stream` an `AsyncProducer`. Requests are built and read by `api.py` and a watch's progress kept
by `watch.Follower`, as for `Client`, so the two behave alike.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Optional, Sequence, Union

import httpx
from httpx_sse import aconnect_sse

from . import api
from .api import Appended, Created, Ended
from .async_producer import AsyncProducer
from .errors import AgentmuxError
from .reduce import StreamState
from .watch import EPOCH_HEADER, Follower, Update, WatchOptions


@dataclass
class AsyncChatRun:
    """A chat run: its stream, a token to watch it with, and its updates to the end."""

    stream_id: str
    read_token: Optional[str]
    updates: AsyncIterator[Update]

    def __aiter__(self) -> AsyncIterator[Update]:
        return self.updates


class AsyncClient:
    """An async client of the service at `base_url` (`api_key` where it has keys)."""

    def __init__(
        self,
        base_url: str,
        api_key: Optional[str] = None,
        *,
        timeout: float = api.DEFAULT_TIMEOUT,
        http_client: Optional[httpx.AsyncClient] = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self._owned = http_client is None
        self.http = http_client or httpx.AsyncClient(timeout=timeout, trust_env=False)

    async def aclose(self) -> None:
        """Closes the connections (of an `httpx.AsyncClient` this client made)."""
        if self._owned:
            await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, request: api.Request) -> httpx.Response:
        return await self.http.request(
            request.method,
            self.base_url + request.path,
            headers=request.headers,
            params=request.params,
            content=request.body,
        )

    async def create_stream(self, model: Optional[str] = None, token_ttl: Optional[int] = None) -> Created:
        """Creates a stream: its id, epoch and tokens."""
        return api.created(api.checked(await self._send(api.create_stream(self.api_key, model, token_ttl))))

    async def _write(
        self, request: api.Request, retries: int = api.DEFAULT_RETRIES, attempted: Optional[Callable[[], None]] = None
    ) -> Appended:
        """Sends a write, and the same request again when an attempt fails for a reason a retry may fix (see
        `Client._write`)."""
        attempt = 0
        while True:
            attempt += 1
            if attempted is not None:
                attempted()
            try:
                response = await self._send(request)
            except httpx.TransportError:
                if attempt > retries:
                    raise
                await asyncio.sleep(api.retry_delay(attempt))
                continue
            if response.status_code < 400 or attempt > retries or not api.retryable(response):
                return api.appended(response)
            await asyncio.sleep(api.retry_delay(attempt, api.retry_after(response)))

    async def append(
        self,
        stream_id: str,
        messages: Union[Sequence[dict[str, Any]], dict[str, Any]],
        *,
        write_token: Optional[str] = None,
        after: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        retries: int = api.DEFAULT_RETRIES,
    ) -> Appended:
        """Appends one message or a batch; see `Client.append`."""
        key = idempotency_key if idempotency_key is not None else api.fresh_key()
        return await self._write(api.append(self.api_key, stream_id, messages, write_token, after, key), retries)

    async def end_message(
        self, stream_id: str, message_id: str, *, write_token: Optional[str] = None, retries: int = api.DEFAULT_RETRIES
    ) -> Appended:
        """Ends one message (its `message_end`, when it is open)."""
        return await self._write(api.end_part(self.api_key, stream_id, "messages", message_id, write_token), retries)

    async def end_block(
        self, stream_id: str, block_id: str, *, write_token: Optional[str] = None, retries: int = api.DEFAULT_RETRIES
    ) -> Appended:
        """Ends one block (its open messages' `message_end`, then its `block_end`, when it is open)."""
        return await self._write(api.end_part(self.api_key, stream_id, "blocks", block_id, write_token), retries)

    async def end(
        self, stream_id: str, outcome: Optional[dict[str, Any]] = None, *, write_token: Optional[str] = None
    ) -> Ended:
        """Ends the stream (`completed` without an outcome)."""
        return api.ended(await self._send(api.end(self.api_key, stream_id, outcome, write_token)))

    async def cancel(self, stream_id: str, *, write_token: Optional[str] = None) -> None:
        """Cancels the stream: its agent is told to stop and it ends `cancelled`."""
        api.checked(await self._send(api.cancel(self.api_key, stream_id, write_token)))

    async def snapshot(self, stream_id: str, *, token: Optional[str] = None) -> StreamState:
        """The stream as the service reduces it (`GET /v1/streams/{id}`)."""
        body = api.checked(await self._send(api.snapshot(self.api_key, stream_id, token)))
        return StreamState.from_snapshot(body)

    def stream(
        self,
        model: Optional[str] = None,
        *,
        flush_interval: float = 0.005,
        max_batch: int = 256,
        token_ttl: Optional[int] = None,
    ) -> AsyncProducer:
        """A producer of a new stream: `async with aclient.stream() as run: run.text("hi")`."""
        return AsyncProducer(self, model, flush_interval=flush_interval, max_batch=max_batch, token_ttl=token_ttl)

    async def chat(self, *, model: Optional[str] = None, messages: Sequence[Any], **fields: Any) -> AsyncChatRun:
        """Starts a chat run (`POST /v1/chat/completions`) and watches its stream."""
        body: dict[str, Any] = {"messages": list(messages), **fields}
        if model is not None:
            body["model"] = model
        request = api.chat(self.api_key, body)
        async with self.http.stream(
            request.method,
            self.base_url + request.path,
            headers=request.headers,
            params=request.params,
            content=request.body,
        ) as response:
            if response.status_code >= 400:
                await response.aread()
                raise api.failure(response)
            stream_id = response.headers.get("x-agentmux-stream-id")
            read_token = response.headers.get("x-agentmux-read-token")
        if not stream_id:
            raise AgentmuxError("the answer named no stream (x-agentmux-stream-id)")
        token = None if self.api_key else read_token
        return AsyncChatRun(stream_id, read_token, self.watch(stream_id, token=token))

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
    ) -> AsyncIterator[Any]:
        """The stream's updates to its end: `Update(message, state)` for CUI, each event's JSON otherwise."""
        options = WatchOptions(format, token, from_sequence, include_usage, reasoning, agent_tools, retries)
        return self._watch(Follower(stream_id, options))

    async def _watch(self, follower: Follower) -> AsyncIterator[Any]:
        url = self.base_url + api.stream_path(follower.stream_id, "/events")
        timeout = httpx.Timeout(self.timeout, read=None)
        while not follower.ended:
            headers = api.headers(self.api_key, follower.options.token, follower.headers())
            try:
                async with aconnect_sse(
                    self.http, "GET", url, params=follower.params(), headers=headers, timeout=timeout
                ) as source:
                    response = source.response
                    follower.answered(response.headers.get(EPOCH_HEADER))
                    if response.status_code == 204:
                        return
                    if response.status_code >= 400:
                        await response.aread()
                        raise api.failure(response)
                    async for event in source.aiter_sse():
                        item = follower.on_event(event.data)
                        if item is not None:
                            yield item
                        if follower.ended:
                            return
            except httpx.TransportError as error:
                await asyncio.sleep(follower.retry_after_failure(error))
                continue
            # The body ended before the stream did: resume.
            await asyncio.sleep(follower.retry_after_failure(None))
