"""The watcher's typed errors in every format, sync and async, against a real agentmux: `LaggedError` for a
watcher left behind past the retention (each format's own lagged notice, with where to resume), a stream's
own error is not one, and `EpochChangedError` when a reconnect's answer names another epoch than the first's
(`x-agentmux-epoch`), in CUI and in formats that carry no epoch (the same epoch resuming is
`test_watch.py`'s cut connections)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, AsyncIterator, Iterator

import httpx
import pytest

import agentmux
from agentmux.api import Created
from agentmux.watch import FORMATS

from conftest import RETENTION_MS


def text(content: str, message_id: str = "m") -> dict[str, Any]:
    return {"type": "text", "props": {"content": content}, "message_id": message_id, "delta": True}


def open_stream(client: agentmux.Client) -> Created:
    """A stream with a first message, for watchers to start on before `fill_and_end`."""
    created = client.create_stream()
    client.append(created.id, text("start "), write_token=created.write_token)
    return created


def fill_and_end(client: agentmux.Client, created: Created) -> None:
    """35 messages of 1 MB, more than a reader's socket holds (so a reader that waits past the retention is
    left behind), then the end."""
    big = "x" * 1_000_000
    for post in range(5):
        batch = [{"type": "text", "props": {"content": big}, "message_id": f"big{post}-{i}"} for i in range(7)]
        client.append(created.id, batch, write_token=created.write_token)
    client.end(created.id, write_token=created.write_token)


def test_a_watcher_left_behind_gets_a_lagged_error_in_every_format(retention: Any) -> None:
    client = agentmux.Client(retention.base_url)
    created = open_stream(client)
    watches = {f: client.watch(created.id, format=f, token=created.read_token) for f in FORMATS}
    for watch in watches.values():
        next(watch)
    fill_and_end(client, created)
    time.sleep(RETENTION_MS / 1000 + 2)
    for format, watch in watches.items():
        read = 1
        with pytest.raises(agentmux.LaggedError) as lagged:
            for _ in watch:
                read += 1
        assert isinstance(lagged.value, agentmux.AgentmuxError) and lagged.value.code == "lagged", format
        assert lagged.value.resume_from > 0, format
        assert read < 37, f"{format}: {read} events before the notice"


async def test_an_async_watcher_left_behind_gets_a_lagged_error_in_every_format(retention: Any) -> None:
    producer = agentmux.Client(retention.base_url)
    created = open_stream(producer)
    client = agentmux.AsyncClient(retention.base_url)
    watches = {f: client.watch(created.id, format=f, token=created.read_token) for f in FORMATS}
    for watch in watches.values():
        await watch.__anext__()
    await asyncio.to_thread(fill_and_end, producer, created)
    await asyncio.sleep(RETENTION_MS / 1000 + 2)
    for format, watch in watches.items():
        with pytest.raises(agentmux.LaggedError) as lagged:
            async for _ in watch:
                pass
        assert lagged.value.resume_from > 0, format


def test_a_streams_own_error_is_no_lagged_error(server: Any) -> None:
    client = agentmux.Client(server.base_url)
    created = client.create_stream()
    client.append(created.id, [text("so far ")], write_token=created.write_token)
    error = {"type": "error", "props": {"message": "the tool broke", "code": "tool_failed"}}
    client.append(created.id, error, write_token=created.write_token)
    client.end(created.id, write_token=created.write_token)
    for format in FORMATS[1:]:
        events = list(client.watch(created.id, format=format))
        assert any("the tool broke" in str(e) for e in events), f"{format}: {events}"


class _Replaced:
    """What both transports do: the first event stream is cut after its first event, and every later one's
    answer names another epoch, as a stream replaced by another history while its reader was away would."""

    def __init__(self) -> None:
        self.cut = False

    def answer(self, request: httpx.Request, response: httpx.Response, stream: Any) -> httpx.Response:
        if not request.url.path.endswith("/events"):
            return response
        headers = dict(response.headers)
        if self.cut:
            headers["x-agentmux-epoch"] = "another-history"
            return httpx.Response(response.status_code, headers=headers, stream=stream)
        self.cut = True
        return httpx.Response(response.status_code, headers=headers, stream=stream)


def _first_event_in(seen: bytes) -> bool:
    at = seen.find(b"data: ")
    return at >= 0 and seen.find(b"\n\n", at) >= 0


class _ReplacedHistory(httpx.BaseTransport, _Replaced):
    def __init__(self) -> None:
        _Replaced.__init__(self)
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        first = request.url.path.endswith("/events") and not self.cut
        return self.answer(request, response, _Cut(response) if first else response.stream)


class _Cut(httpx.SyncByteStream):
    def __init__(self, response: httpx.Response) -> None:
        self.response = response

    def __iter__(self) -> Iterator[bytes]:
        seen = b""
        for chunk in self.response.iter_raw():
            yield chunk
            seen += chunk
            if _first_event_in(seen):
                break
        self.response.close()
        raise httpx.ReadError("network error")


class _AsyncReplacedHistory(httpx.AsyncBaseTransport, _Replaced):
    def __init__(self) -> None:
        _Replaced.__init__(self)
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        first = request.url.path.endswith("/events") and not self.cut
        return self.answer(request, response, _AsyncCut(response) if first else response.stream)


class _AsyncCut(httpx.AsyncByteStream):
    def __init__(self, response: httpx.Response) -> None:
        self.response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = b""
        async for chunk in self.response.aiter_raw():
            yield chunk
            seen += chunk
            if _first_event_in(seen):
                break
        await self.response.aclose()
        raise httpx.ReadError("network error")


@pytest.mark.parametrize("format", ["cui", "openai", "ag-ui"])
def test_a_changed_epoch_at_a_reconnect_is_an_epoch_changed_error(server: Any, format: str) -> None:
    producer = agentmux.Client(server.base_url)
    created = producer.create_stream()
    producer.append(created.id, [text("one "), text("two ")], write_token=created.write_token)
    transport = _ReplacedHistory()
    watcher = agentmux.Client(server.base_url, http_client=httpx.Client(transport=transport))
    # The stream ends soon, so a watcher that does not check the epoch ends too (rather than wait forever).
    ender = threading.Timer(2.0, producer.end, args=(created.id,), kwargs={"write_token": created.write_token})
    ender.start()
    with pytest.raises(agentmux.EpochChangedError) as changed:
        for _ in watcher.watch(created.id, format=format, token=created.read_token):
            pass
    ender.join()
    assert transport.cut
    assert changed.value.was == created.epoch and changed.value.now == "another-history"


@pytest.mark.parametrize("format", ["cui", "anthropic"])
async def test_an_async_changed_epoch_at_a_reconnect_is_an_epoch_changed_error(server: Any, format: str) -> None:
    producer = agentmux.Client(server.base_url)
    created = producer.create_stream()
    producer.append(created.id, [text("one "), text("two ")], write_token=created.write_token)
    transport = _AsyncReplacedHistory()
    watcher = agentmux.AsyncClient(server.base_url, http_client=httpx.AsyncClient(transport=transport))
    ender = threading.Timer(2.0, producer.end, args=(created.id,), kwargs={"write_token": created.write_token})
    ender.start()
    with pytest.raises(agentmux.EpochChangedError) as changed:
        async for _ in watcher.watch(created.id, format=format, token=created.read_token):
            pass
    await asyncio.to_thread(ender.join)
    assert transport.cut
    assert changed.value.was == created.epoch and changed.value.now == "another-history"
