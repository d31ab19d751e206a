"""The committed `agentmux.types` is what `docs/schemas` generate, and it imports and type-checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


def test_the_types_are_what_the_schemas_generate() -> None:
    result = subprocess.run(
        [sys.executable, str(PACKAGE / "scripts" / "generate_types.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_the_types_import_and_describe_messages() -> None:
    from agentmux import types

    message: types.OutputMessage = {"type": "text", "props": {"content": "hi"}, "message_id": "m"}
    assert types.OutputMessage.__annotations__["message_id"] and message["type"] == "text"
    assert "content" in types.TextProps.__annotations__


def test_the_package_type_checks() -> None:
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=PACKAGE, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
