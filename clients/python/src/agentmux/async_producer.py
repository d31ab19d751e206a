"""`AsyncProducer`: a stream written from async code (`async with aclient.stream() as run:`). The same emit
methods as `Producer` (they only enqueue, so they are plain calls), sent by one task of the running loop
with the same batching, order, `after` condition and retries; `flush`, `end` and `cancel` are awaited.
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Optional, Union

import httpx

from . import api
from .emitter import Emitter
from .errors import AgentmuxError
from .outbox import Op, Outbox, PartEnd
from .outcome import outcome
from .producer import MAX_ATTEMPTS, _unexpected

if TYPE_CHECKING:
    from .async_client import AsyncClient


class AsyncProducer(Emitter):
    """A stream being written from async code; made by `AsyncClient.stream`."""

    def __init__(
        self,
        client: AsyncClient,
        model: Optional[str] = None,
        *,
        flush_interval: float = 0.005,
        max_batch: int = 256,
        token_ttl: Optional[int] = None,
    ) -> None:
        super().__init__()
        self._client = client
        self._model = model
        self._token_ttl = token_ttl
        self.flush_interval = flush_interval
        self.max_batch = max(1, max_batch)
        self.stream_id = ""
        self.epoch = ""
        self.read_token = ""
        self.write_token = ""
        #: The stream's last sequence as this producer last heard it.
        self.last_sequence = 0
        #: Requests sent (retries included), for whoever counts.
        self.requests = 0
        self._outbox = Outbox()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._in_flight = False
        self._urgent = False
        self._closing = False
        self._ended = False
        self._failure: Optional[AgentmuxError] = None
        self._task: Optional[asyncio.Task[None]] = None

    async def open(self) -> AsyncProducer:
        """Creates the stream and starts sending (`async with` calls it; once open, it does nothing)."""
        if self._task is not None:
            return self
        created = await self._client.create_stream(model=self._model, token_ttl=self._token_ttl)
        self.stream_id, self.epoch = created.id, created.epoch
        self.read_token, self.write_token = created.read_token, created.write_token
        self.last_sequence = 1  # stream_start
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aenter__(self) -> AsyncProducer:
        return await self.open()

    async def __aexit__(
        self, kind: Optional[type[BaseException]], error: Optional[BaseException], trace: Optional[TracebackType]
    ) -> None:
        if self._ended:
            await self._stop()
            return
        if error is None:
            try:
                await self.end()
            except AgentmuxError as refused:
                await self._end_failed(refused)
                raise
        else:
            await self._end_failed(error)

    async def _end_failed(self, error: BaseException) -> None:
        """Sends what was emitted before `error`, then ends the stream `error` with it as its outcome's."""
        self._urgent = True
        self._wake.set()
        try:
            await self._wait_idle()
            await self._client.end(self.stream_id, outcome("error", error=error), write_token=self.write_token)
        except (AgentmuxError, httpx.HTTPError):
            pass  # Ended already, or unreachable: the caller's own error is what it needs to see.
        finally:
            self._ended = True
            await self._stop()

    async def end(
        self,
        status: str = "completed",
        finish_reason: Optional[str] = None,
        usage: Optional[dict[str, Any]] = None,
        error: Union[str, dict[str, Any], BaseException, None] = None,
    ) -> api.Ended:
        """Sends what is pending, then ends the stream with this outcome."""
        await self.flush()
        ended = await self._client.end(
            self.stream_id, outcome(status, finish_reason, usage, error), write_token=self.write_token
        )
        self.last_sequence = max(self.last_sequence, ended.last_sequence)
        self._ended = True
        await self._stop()
        return ended

    async def cancel(self) -> None:
        """Sends what is pending, then cancels the stream (it ends `cancelled`)."""
        await self.flush()
        await self._client.cancel(self.stream_id, write_token=self.write_token)
        self._ended = True
        await self._stop()

    async def flush(self) -> None:
        """Waits until everything emitted so far is kept by the service; raises a refusal."""
        self._urgent = True
        self._wake.set()
        await self._wait_idle()
        self._raise_failure()

    async def _wait_idle(self) -> None:
        while (len(self._outbox) or self._in_flight) and self._failure is None:
            self._idle.clear()
            await self._idle.wait()
        self._urgent = False

    async def _stop(self) -> None:
        self._closing = True
        self._wake.set()
        if self._task is not None and self._task is not asyncio.current_task():
            await self._task

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _enqueue(self, item: Union[dict[str, Any], PartEnd]) -> None:
        self._raise_failure()
        if self._ended or self._task is None:
            raise RuntimeError("the producer is not open (use it in an `async with` block, or await open())")
        self._outbox.push(item)
        self._wake.set()

    async def _next(self) -> Optional[Op]:
        while not len(self._outbox) and not self._closing:
            self._wake.clear()
            await self._wake.wait()
        while len(self._outbox) and not self._urgent and not self._closing and not self._outbox.starts_with_end():
            if len(self._outbox) >= self.max_batch:
                break
            wait = (self._outbox.first_at or 0) + self.flush_interval - time.monotonic()
            if wait <= 0:
                break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except asyncio.TimeoutError:
                break
        op = self._outbox.take(self.max_batch)
        self._in_flight = op is not None
        return op

    async def _run(self) -> None:
        while True:
            op = await self._next()
            if op is None:
                self._idle.set()
                return
            try:
                answer = await self._send(op)
            except AgentmuxError as refused:
                self._failure = refused
            except Exception as error:  # noqa: BLE001 - whatever stops the sender is the producer's error
                self._failure = _unexpected(error)
            else:
                self.last_sequence = max(self.last_sequence, answer.last_sequence)
            self._in_flight = False
            if self._failure is not None:
                self._outbox.clear()
            self._idle.set()

    async def _send(self, op: Op) -> api.Appended:
        """Sends one op, retrying what may be retried; the same request each time, so a repeat is known."""
        if isinstance(op, PartEnd):
            request = api.end_part(self._client.api_key, self.stream_id, op.kind, op.id, self.write_token)
        else:
            request = api.append(self._client.api_key, self.stream_id, op, self.write_token, self.last_sequence, None)
        return await self._client._write(request, MAX_ATTEMPTS - 1, self._attempted)

    def _attempted(self) -> None:
        self.requests += 1
