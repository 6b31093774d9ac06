"""Exceptions raised by the Quiver client.

The gateway answers every error as JSON ``{"error": {"code": ..., "message": ...}}``
with the matching HTTP status. Each code has its own subclass of
:class:`QuiverError`, named after it (``NOT_FOUND`` -> :class:`NotFound`), so callers
can ``except quiver.NotFound``. A code this version does not know raises the base
class, with ``.code`` set to the code the server sent.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "QuiverError",
    "InvalidArgument",
    "NotFound",
    "AlreadyExists",
    "FailedPrecondition",
    "ResourceExhausted",
    "Unauthenticated",
    "PermissionDenied",
    "Unavailable",
    "DeadlineExceeded",
    "Internal",
    "DataLoss",
    "DataLossError",
    "error_from_code",
]


class QuiverError(Exception):
    """Base class of every error the client raises.

    Attributes:
        code: the error code (``"NOT_FOUND"``, ``"UNAVAILABLE"``, ...).
        message: the server's (or the client's) explanation.
        status: the HTTP status of the response, or ``None`` when no response came
            (connection failure, or input rejected before sending).
        request_id: the ``x-request-id`` of the call, to find it in server logs.
        details: the whole ``error`` object of the response (may hold more fields).
    """

    code: str = "UNKNOWN"

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        status: Optional[int] = None,
        request_id: Optional[str] = None,
        details: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.status = status
        self.request_id = request_id
        self.details: Dict[str, Any] = dict(details) if details else {}

    def __reduce__(self) -> Any:
        # Keeps code, status and request id through pickling (multiprocessing).
        return (
            _rebuild,
            (type(self), self.message, self.code, self.status, self.request_id, self.details),
        )

    def __str__(self) -> str:
        parts = [f"{self.code}: {self.message}"]
        if self.status is not None:
            parts.append(f"http status {self.status}")
        if self.request_id:
            parts.append(f"request id {self.request_id}")
        return parts[0] if len(parts) == 1 else f"{parts[0]} ({', '.join(parts[1:])})"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
            f"status={self.status!r}, request_id={self.request_id!r})"
        )


def _rebuild(
    error_class: Type[QuiverError],
    message: str,
    code: str,
    status: Optional[int],
    request_id: Optional[str],
    details: Dict[str, Any],
) -> QuiverError:
    return error_class(message, code=code, status=status, request_id=request_id, details=details)


class InvalidArgument(QuiverError):
    """The request is malformed: wrong dimension, non-finite value, bad id or filter."""

    code = "INVALID_ARGUMENT"


class NotFound(QuiverError):
    """The collection (or node) does not exist."""

    code = "NOT_FOUND"


class AlreadyExists(QuiverError):
    """A collection with that name exists already."""

    code = "ALREADY_EXISTS"


class FailedPrecondition(QuiverError):
    """The cluster is not in a state that allows the operation."""

    code = "FAILED_PRECONDITION"


class ResourceExhausted(QuiverError):
    """The server is shedding load (write backlog, rate limit); retried by default."""

    code = "RESOURCE_EXHAUSTED"


class Unauthenticated(QuiverError):
    """No API key, or an API key the server does not know."""

    code = "UNAUTHENTICATED"


class PermissionDenied(QuiverError):
    """The API key may not do this."""

    code = "PERMISSION_DENIED"


class Unavailable(QuiverError):
    """The server could not be reached or cannot serve now; retried by default.

    Also raised when the answer is not a Quiver API answer at all (a proxy's HTML
    page, a wrong port): the message then quotes the start of the body.
    """

    code = "UNAVAILABLE"


class DeadlineExceeded(QuiverError):
    """The call did not finish within its timeout."""

    code = "DEADLINE_EXCEEDED"


class Internal(QuiverError):
    """The server hit a bug or an unexpected state."""

    code = "INTERNAL"


class DataLoss(QuiverError):
    """Stored data is damaged or missing (a checksum failed, an object vanished).

    Not retried: the same bytes fail again; the message names the object.
    """

    code = "DATA_LOSS"


#: The name the DATA_LOSS error is documented under; the same class as :class:`DataLoss`.
DataLossError = DataLoss


_ERRORS_BY_CODE: Dict[str, Type[QuiverError]] = {
    error_class.code: error_class
    for error_class in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        ResourceExhausted,
        Unauthenticated,
        PermissionDenied,
        Unavailable,
        DeadlineExceeded,
        Internal,
        DataLoss,
    )
}


def error_from_code(
    code: str,
    message: str,
    *,
    status: Optional[int] = None,
    request_id: Optional[str] = None,
    details: Optional[Mapping[str, Any]] = None,
) -> QuiverError:
    """Returns the exception for an error code: its subclass, or :class:`QuiverError`."""
    error_class = _ERRORS_BY_CODE.get(code, QuiverError)
    return error_class(
        message, code=code, status=status, request_id=request_id, details=details
    )
