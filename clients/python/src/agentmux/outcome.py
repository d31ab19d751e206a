"""The outcome a producer ends its stream with (`POST /v1/streams/{id}/end`), built the same way by
`Producer.end`, `AsyncProducer.end` and their context managers (an exception becomes an `error` outcome).
"""

from __future__ import annotations

from typing import Any, Optional, Union

#: The longest error message an outcome carries for an exception (longer ones are cut, so an end always fits).
_MAX_MESSAGE = 1000


def outcome(
    status: str = "completed",
    finish_reason: Optional[str] = None,
    usage: Optional[dict[str, Any]] = None,
    error: Union[str, dict[str, Any], BaseException, None] = None,
) -> dict[str, Any]:
    """The outcome's JSON: `status`, and `finish_reason`, `usage` and `error` where given."""
    body: dict[str, Any] = {"status": status}
    if finish_reason is not None:
        body["finish_reason"] = finish_reason
    if usage is not None:
        body["usage"] = usage
    if isinstance(error, BaseException):
        body["error"] = of_exception(error)
    elif isinstance(error, str):
        body["error"] = {"message": error}
    elif error is not None:
        body["error"] = error
    return body


def of_exception(error: BaseException) -> dict[str, Any]:
    """An exception as an outcome's error: its message (its type's name when it has none) and its type."""
    message = str(error) or type(error).__name__
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 1] + "…"
    return {"message": message, "code": type(error).__name__}
