"""TCP proxies in front of agentmux that fail as a network does, each once:

- `CuttingProxy`: passes everything until the bytes coming back hold `marker` (an SSE `id:` line) for the
  first time, then closes that connection right after the marker, in the middle of its event (as the
  TypeScript client's test/proxy.mjs does).
- `AnswerDroppingProxy`: lets the first append (`POST .../messages`) reach the service and closes its
  connection as the answer comes back, so the producer cannot know it landed.
"""

from __future__ import annotations

import socket
import threading
from typing import Optional


class _Proxy:
    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.armed = True
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            state: dict[str, bool] = {"victim": False}
            threading.Thread(target=self._up, args=(client, upstream, state), daemon=True).start()
            threading.Thread(target=self._down, args=(client, upstream, state), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket, state: dict[str, bool]) -> None:
        try:
            while chunk := client.recv(65536):
                self.on_request(chunk, state)
                upstream.sendall(chunk)
        except OSError:
            pass
        _close(upstream)

    def _down(self, client: socket.socket, upstream: socket.socket, state: dict[str, bool]) -> None:
        tail = b""
        try:
            while chunk := upstream.recv(65536):
                keep = self.on_response(tail + chunk, len(tail), state)
                if keep is not None:
                    client.sendall(chunk[:keep])
                    break
                tail = (tail + chunk)[-64:]
                client.sendall(chunk)
        except OSError:
            pass
        _close(client)
        _close(upstream)

    def on_request(self, chunk: bytes, state: dict[str, bool]) -> None:
        """Sees each chunk a client sends."""

    def on_response(self, seen: bytes, tail: int, state: dict[str, bool]) -> Optional[int]:
        """How many bytes of the chunk to pass before closing the connection, or None to pass it all."""
        return None

    def stop(self) -> None:
        _close(self.listener)
        for s in self.sockets:
            _close(s)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


class CuttingProxy(_Proxy):
    def __init__(self, target: str, marker: bytes) -> None:
        super().__init__(target)
        self.marker = marker

    @property
    def cut(self) -> bool:
        return not self.armed

    def on_response(self, seen: bytes, tail: int, state: dict[str, bool]) -> Optional[int]:
        with self.lock:
            at = seen.find(self.marker) if self.armed else -1
            if at < 0:
                return None
            self.armed = False
        return max(0, at + len(self.marker) - tail)


class AnswerDroppingProxy(_Proxy):
    @property
    def dropped(self) -> bool:
        return not self.armed

    def on_request(self, chunk: bytes, state: dict[str, bool]) -> None:
        head = chunk.split(b"\r\n", 1)[0]
        with self.lock:
            if self.armed and head.startswith(b"POST ") and b"/messages" in head:
                self.armed = False
                state["victim"] = True

    def on_response(self, seen: bytes, tail: int, state: dict[str, bool]) -> Optional[int]:
        return 0 if state["victim"] else None
