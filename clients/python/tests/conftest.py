"""The processes the tests run against: an agentmux in memory, one with an API key, one whose ended streams
go after a short retention (for a watcher left behind); and the `client`/`aclient` fixtures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server import Server  # noqa: E402

KEY = "sk-python-test"
RETENTION_MS = 3000


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    process = Server()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def keyed() -> Iterator[Server]:
    process = Server("--api-key", KEY)
    yield process
    process.stop()


@pytest.fixture(scope="session")
def retention() -> Iterator[Server]:
    process = Server("--retention", f"{RETENTION_MS}ms")
    yield process
    process.stop()
