"""The frameworks are no dependency of `agentmux`: importing the package (and the Agents SDK's bridge, which
reads the SDK's events by their `type`) loads none of them."""

from __future__ import annotations

import subprocess
import sys

FRAMEWORKS = ("agents", "openai", "langchain_core", "langgraph")


def test_importing_agentmux_and_the_agents_bridge_loads_no_framework() -> None:
    check = (
        "import sys, agentmux, agentmux.bridges, agentmux.bridges.openai_agents\n"
        f"loaded = sorted({{m.split('.')[0] for m in sys.modules}} & set({FRAMEWORKS!r}))\n"
        "print(','.join(loaded))"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"imported with agentmux: {done.stdout.strip()}"
