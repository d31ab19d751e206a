"""`Producer`: a stream written from blocking code (`with client.stream() as run:`). The emit methods
(`Emitter`) only enqueue; one background thread sends: everything pending in one POST, at most
`flush_interval` after the first pending message, one request in flight at a time, in order. Every append
carries `after=<the stream's last sequence>`, so a retry after a lost answer (a connection error, a timeout,
a refusal the service says a retry may fix: `api.retryable`) is recognised by the service as a repeat and
appends nothing twice. The retries are `Client._write`'s, shared with the single calls. A
refused request stops the producer: the `AgentmuxError` is raised by the next emit, `flush` or `end`.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Optional, Union

import httpx

from . import api
from .emitter import Emitter
from .errors import AgentmuxError
from .outbox import Op, Outbox, PartEnd
from .outcome import outcome

if TYPE_CHECKING:
    from .client import Client

#: Attempts of one request before its error is the producer's.
MAX_ATTEMPTS = 8


def _unexpected(error: Exception) -> AgentmuxError:
    """A failure of the sender that is no answer of the service, as the producer's error."""
    if isinstance(error, httpx.HTTPError):
        return AgentmuxError(f"the service could not be reached: {error}", code="unreachable")
    return AgentmuxError(f"the producer failed: {error!r}", code="producer_failed")


class Producer(Emitter):
    """A stream being written; see the module doc. Made by `Client.stream`."""

    def __init__(
        self,
        client: Client,
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
        self._cond = threading.Condition()
        self._in_flight = False
        self._urgent = False
        self._closing = False
        self._ended = False
        self._failure: Optional[AgentmuxError] = None
        self._thread: Optional[threading.Thread] = None

    # Lifecycle.

    def open(self) -> Producer:
        """Creates the stream and starts sending (the `with` statement calls it; once open, it does nothing)."""
        if self._thread is not None:
            return self
        created = self._client.create_stream(model=self._model, token_ttl=self._token_ttl)
        self.stream_id, self.epoch = created.id, created.epoch
        self.read_token, self.write_token = created.read_token, created.write_token
        self.last_sequence = 1  # stream_start
        self._thread = threading.Thread(target=self._run, name=f"agentmux-producer-{created.id[:8]}", daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> Producer:
        return self.open()

    def __exit__(
        self, kind: Optional[type[BaseException]], error: Optional[BaseException], trace: Optional[TracebackType]
    ) -> None:
        if self._ended:
            self._stop()
            return
        if error is None:
            try:
                self.end()
            except AgentmuxError as refused:
                self._end_failed(refused)
                raise
        else:
            self._end_failed(error)

    def _end_failed(self, error: BaseException) -> None:
        """Sends what was emitted before `error`, then ends the stream `error` with it as its outcome's, as
        far as the service lets it."""
        with self._cond:
            self._urgent = True
            self._cond.notify_all()
        try:
            self._wait_idle()
            self._client.end(self.stream_id, outcome("error", error=error), write_token=self.write_token)
        except (AgentmuxError, httpx.HTTPError):
            pass  # Ended already, or unreachable: the caller's own error is what it needs to see.
        finally:
            self._ended = True
            self._stop()

    def end(
        self,
        status: str = "completed",
        finish_reason: Optional[str] = None,
        usage: Optional[dict[str, Any]] = None,
        error: Union[str, dict[str, Any], BaseException, None] = None,
    ) -> api.Ended:
        """Sends what is pending, then ends the stream with this outcome."""
        self.flush()
        ended = self._client.end(
            self.stream_id, outcome(status, finish_reason, usage, error), write_token=self.write_token
        )
        self.last_sequence = max(self.last_sequence, ended.last_sequence)
        self._ended = True
        self._stop()
        return ended

    def cancel(self) -> None:
        """Sends what is pending, then cancels the stream (it ends `cancelled`)."""
        self.flush()
        self._client.cancel(self.stream_id, write_token=self.write_token)
        self._ended = True
        self._stop()

    def flush(self) -> None:
        """Waits until everything emitted so far is kept by the service; raises a refusal."""
        with self._cond:
            self._urgent = True
            self._cond.notify_all()
        self._wait_idle()
        self._raise_failure()

    def _wait_idle(self) -> None:
        with self._cond:
            while (len(self._outbox) or self._in_flight) and self._failure is None:
                self._cond.wait()
            self._urgent = False

    def _stop(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    # Emitting.

    def _enqueue(self, item: Union[dict[str, Any], PartEnd]) -> None:
        self._raise_failure()
        if self._ended or self._thread is None:
            raise RuntimeError("the producer is not open (use it in a `with` block, or call open())")
        with self._cond:
            self._outbox.push(item)
            self._cond.notify_all()

    # Sending (the background thread).

    def _next(self) -> Optional[Op]:
        """The next op once it is due, or None when the producer is closing with nothing left."""
        with self._cond:
            while not len(self._outbox) and not self._closing:
                self._cond.wait()
            while len(self._outbox) and not self._urgent and not self._closing and not self._outbox.starts_with_end():
                if len(self._outbox) >= self.max_batch:
                    break
                wait = (self._outbox.first_at or 0) + self.flush_interval - time.monotonic()
                if wait <= 0:
                    break
                self._cond.wait(wait)
            op = self._outbox.take(self.max_batch)
            self._in_flight = op is not None
            return op

    def _run(self) -> None:
        while True:
            op = self._next()
            if op is None:
                return
            try:
                answer = self._send(op)
            except AgentmuxError as refused:
                failure: Optional[AgentmuxError] = refused
            except Exception as error:  # noqa: BLE001 - whatever stops the sender is the producer's error
                failure = _unexpected(error)
            else:
                failure = None
            with self._cond:
                self._in_flight = False
                if failure is not None:
                    self._failure = failure
                    self._outbox.clear()
                else:
                    self.last_sequence = max(self.last_sequence, answer.last_sequence)
                self._cond.notify_all()

    def _send(self, op: Op) -> api.Appended:
        """Sends one op, retrying what may be retried; the same request each time, so a repeat is known."""
        if isinstance(op, PartEnd):
            request = api.end_part(self._client.api_key, self.stream_id, op.kind, op.id, self.write_token)
        else:
            request = api.append(self._client.api_key, self.stream_id, op, self.write_token, self.last_sequence, None)
        return self._client._write(request, MAX_ATTEMPTS - 1, self._attempted)

    def _attempted(self) -> None:
        self.requests += 1
