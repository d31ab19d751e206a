"""Starts the agentmux binary (`AGENTMUX_BIN`, or the repository's target/debug/agentmux) on a loopback port
the system picks, in memory only, and reads back where it listens from its log line, as the TypeScript
client's test/server.mjs does.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[3]
_LISTENING = re.compile(r"agentmux listening.*address=(\S+)")


def _die_with_parent() -> None:
    """In the child: a SIGTERM when the test process goes, however it goes (no agentmux left behind)."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Server:
    """One agentmux process; `base_url` is where it answers."""

    def __init__(self, *args: str) -> None:
        binary = os.environ.get("AGENTMUX_BIN") or str(REPOSITORY / "target" / "debug" / "agentmux")
        if not Path(binary).exists():
            raise RuntimeError(f"no agentmux at {binary}: run cargo build (or set AGENTMUX_BIN)")
        env = {**os.environ, "RUST_LOG": "info", "NO_COLOR": "1"}
        self.process = subprocess.Popen(
            [binary, "serve", "--addr", "127.0.0.1:0", "--ephemeral", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        found = threading.Event()
        self.log: list[str] = []
        self.base_url = ""

        def read() -> None:
            assert self.process.stderr is not None
            for line in self.process.stderr:
                self.log.append(line)
                match = _LISTENING.search(line)
                if match and not found.is_set():
                    self.base_url = f"http://{match.group(1)}"
                    found.set()
            found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(30) or not self.base_url:
            self.stop()
            raise RuntimeError("agentmux did not say where it listens:\n" + "".join(self.log))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
