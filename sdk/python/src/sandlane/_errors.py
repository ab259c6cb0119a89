"""Typed errors: one base class, one subclass per error code of the API."""

from __future__ import annotations

import json
from typing import Any, ClassVar, Mapping

__all__ = [
    "SandlaneError",
    "InvalidArgumentError",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "TooLargeError",
    "ResourceExhaustedError",
    "UnavailableError",
    "InternalError",
    "ProvisioningFailedError",
    "LaneDisabledError",
    "StreamInterruptedError",
    "SandlaneConnectionError",
    "SandlaneTimeoutError",
    "error_class_for",
]


class SandlaneError(Exception):
    """Base class of every error this package raises.

    ``code`` is the API's ``error`` code (``"permission_denied"``, ...) or ``None`` when
    the failure did not come from the API (a connection that broke, a timeout);
    ``status`` is the HTTP status of the answer (``None`` without one; ``200`` for an
    error line that ended a streamed output); ``message`` is the API's message, for
    people. Programs branch on the class or on ``code``.
    """

    code_name: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message: str = message
        self.code: str | None = code if code is not None else self.code_name
        self.status: int | None = status
        self.body: Mapping[str, Any] | None = body

    def __str__(self) -> str:
        parts = []
        if self.status is not None:
            parts.append(str(self.status))
        if self.code is not None:
            parts.append(self.code)
        prefix = " ".join(parts)
        return f"{prefix}: {self.message}" if prefix else self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, message={self.message!r})"


class InvalidArgumentError(SandlaneError):
    """400 ``invalid_argument``: a malformed body, query or id, or a refused command."""

    code_name = "invalid_argument"


class UnauthenticatedError(SandlaneError):
    """401 ``unauthenticated``: no credential, or one that is unknown, revoked or expired."""

    code_name = "unauthenticated"


class PermissionDeniedError(SandlaneError):
    """403 ``permission_denied``: authenticated, but not allowed here."""

    code_name = "permission_denied"


class NotFoundError(SandlaneError):
    """404 ``not_found``: no such route, sandbox, snapshot, process or file."""

    code_name = "not_found"


class ConflictError(SandlaneError):
    """409 ``conflict``: the sandbox or the thing named is not in a state that allows this."""

    code_name = "conflict"


class TooLargeError(SandlaneError):
    """413 ``too_large``: a body, file or archive over its limit."""

    code_name = "too_large"


class ResourceExhaustedError(SandlaneError):
    """429 ``resource_exhausted``: a quota of the org's policy or a per-sandbox cap is used up."""

    code_name = "resource_exhausted"


class UnavailableError(SandlaneError):
    """503 ``unavailable``: provisioning failed for a workflow ensure, or the server cannot answer now."""

    code_name = "unavailable"


class InternalError(SandlaneError):
    """500 ``internal``: a failure the server did not expect (the detail is in its log)."""

    code_name = "internal"


class ProvisioningFailedError(UnavailableError):
    """A session ensure answered ``{"outcome": "failed"}`` and the caller asked for a sandbox.

    Raised by :meth:`EnsureResult.require_sandbox`; the message starts with
    ``Sandbox provisioning failed: ``.
    """


class LaneDisabledError(SandlaneError):
    """An ensure answered ``{"outcome": "disabled"}`` (the lane is off) and the caller asked for a sandbox."""


class StreamInterruptedError(SandlaneError):
    """A streamed answer (output, file, listing, archive) ended before its last line or byte."""


class SandlaneConnectionError(SandlaneError):
    """The server could not be reached, or the connection broke."""


class SandlaneTimeoutError(SandlaneError):
    """The client's own timeout passed before the server answered."""


_BY_CODE: dict[str, type[SandlaneError]] = {
    cls.code_name: cls
    for cls in (
        InvalidArgumentError,
        UnauthenticatedError,
        PermissionDeniedError,
        NotFoundError,
        ConflictError,
        TooLargeError,
        ResourceExhaustedError,
        UnavailableError,
        InternalError,
    )
    if cls.code_name is not None
}

_BY_STATUS: dict[int, type[SandlaneError]] = {
    400: InvalidArgumentError,
    401: UnauthenticatedError,
    403: PermissionDeniedError,
    404: NotFoundError,
    405: InvalidArgumentError,
    409: ConflictError,
    413: TooLargeError,
    429: ResourceExhaustedError,
    500: InternalError,
    503: UnavailableError,
}


def error_class_for(code: str | None, status: int | None = None) -> type[SandlaneError]:
    """The exception class of an API error code (by status when the code is unknown)."""
    if code is not None and code in _BY_CODE:
        return _BY_CODE[code]
    if status is not None and status in _BY_STATUS:
        return _BY_STATUS[status]
    return SandlaneError


def error_from_body(status: int, content: bytes) -> SandlaneError:
    """The typed error of an error answer: its JSON body ``{"error", "message"}``, or its status."""
    body: Any = None
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        code = body["error"]
        message = str(body.get("message", ""))
        return error_class_for(code, status)(message, code=code, status=status, body=body)
    text = content.decode("utf-8", "replace").strip()[:500]
    cls = error_class_for(None, status)
    return cls(text or f"HTTP {status}", status=status)
