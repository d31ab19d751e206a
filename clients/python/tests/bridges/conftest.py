"""The service the bridge tests publish to: the real binary (`AGENTMUX_BIN`), started once for the session on
a free loopback port, or one already running at `AGENTMUX_URL`."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def agentmux_url() -> Iterator[str]:
    if os.environ.get("AGENTMUX_URL"):
        yield os.environ["AGENTMUX_URL"].rstrip("/")
        return
    binary = os.environ.get("AGENTMUX_BIN")
    if not binary:
        pytest.fail("set AGENTMUX_BIN (the agentmux binary) or AGENTMUX_URL (a running service)")
    server = subprocess.Popen(
        [binary, "serve", "--addr", "127.0.0.1:0", "--ephemeral"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "RUST_LOG": "info"},
    )
    assert server.stderr is not None
    address = None
    for line in server.stderr:
        if "agentmux listening" in line:
            address = line.split("address=")[1].split()[0]
            break
    if address is None:
        server.kill()
        pytest.fail("agentmux did not say where it listens")
    # Keep reading its log, or it blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()  # type: ignore[union-attr]
    try:
        yield f"http://{address}"
    finally:
        server.terminate()
        server.wait(timeout=10)
