"""What a framework hands over as a tool's input or output (strings, dicts, pydantic models, dataclasses,
anything) made into JSON values, since a ``tool_result``'s ``result`` and a ``tool_call``'s arguments travel
as JSON: a value JSON cannot hold becomes its ``str``, never an error that would stop the run."""

from __future__ import annotations

import dataclasses
from typing import Any


def json_safe(value: Any) -> Any:
    """``value`` as JSON values: containers walked, models dumped, the rest as text."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return json_safe(dump(mode="json"))
        except Exception:  # a model that cannot dump itself is shown as text
            return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe(dataclasses.asdict(value))
    return str(value)
