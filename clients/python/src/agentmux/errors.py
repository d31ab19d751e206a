"""The errors the package raises, the same classes as the TypeScript client's: `AgentmuxError` for an answer
that was not a success (the service's error envelope: status, code, message, param, and the stream's
`last_sequence` where a refused append names it), and its two subclasses a watcher raises, `LaggedError` and
`EpochChangedError`. `DeltaError` is the reducer's (a delta that cannot apply), which the service never sends.
"""

from __future__ import annotations

from typing import Any, Optional


class AgentmuxError(Exception):
    """An answer that was not a success, or a stream that cannot be followed further."""

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        code: Optional[str] = None,
        param: Optional[str] = None,
        last_sequence: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.param = param
        self.last_sequence = last_sequence

    @classmethod
    def from_body(cls, status: int, body: Any, reason: str = "") -> AgentmuxError:
        """The error an answer's body (the `{"error": {...}}` envelope, or anything else) stands for."""
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            error = {}
        message = error.get("message")
        last = error.get("last_sequence")
        return cls(
            message if isinstance(message, str) else (reason or f"HTTP {status}"),
            status=status,
            code=error.get("code") if isinstance(error.get("code"), str) else None,
            param=error.get("param") if isinstance(error.get("param"), str) else None,
            last_sequence=last if isinstance(last, int) else None,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, message={self.message!r})"


class LaggedError(AgentmuxError):
    """The history this watcher needs is no longer kept; it may start again after `resume_from`."""

    def __init__(self, resume_from: int) -> None:
        super().__init__(
            f"the stream's history after the last message seen is no longer kept; it resumes from {resume_from}",
            code="lagged",
        )
        self.resume_from = resume_from


class EpochChangedError(AgentmuxError):
    """The stream is another history than the one being watched (its epoch changed): start over."""

    def __init__(self, was: str, now: str) -> None:
        super().__init__(
            f"the stream's epoch changed from {was} to {now}: its history is not the one watched",
            code="epoch_changed",
        )
        self.was = was
        self.now = now


class DeltaError(ValueError):
    """A delta that cannot apply to the state (the service refuses these, so a watcher never meets one)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
