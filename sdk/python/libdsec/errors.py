"""Typed exceptions of libdsec, one per error kind of the dsec API.

Every failed call raises a :class:`DSecError` subclass that names its kind
(the same kinds as the server and the Go SDK): classify errors with
``except NotFoundError`` and never by message. The message says what to do.

A command that runs and fails is not an error: its :class:`ExecResult`
says how it ended.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

__all__ = [
    "DSecError",
    "InvalidArgumentError",
    "NotFoundError",
    "AlreadyExistsError",
    "FailedPreconditionError",
    "ResourceExhaustedError",
    "DeadlineExceededError",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "UnavailableError",
    "InternalError",
    "CapabilityMissingError",
    "ArchiveError",
    "error_from_code",
]


class DSecError(Exception):
    """Base class of every error a dsec call raises.

    Attributes:
        kind: the error kind's name, e.g. ``"NotFound"``.
        code: the API code, e.g. ``"not_found"``.
        message: the explanation for people (it says what to do).
        retry_after: the server's retry hint in seconds, or None.
        exec_id: for a command whose stream failed after it started, its
            exec ID (attach to it with :meth:`Sandbox.attach`); else None.
    """

    kind = "Internal"
    code = "internal"

    def __init__(self, message: str = "", *, retry_after: Optional[float] = None,
                 exec_id: Optional[str] = None) -> None:
        self.message = message or self.kind
        self.retry_after = retry_after
        self.exec_id = exec_id
        super().__init__(self.message)

    def __str__(self) -> str:
        msg = self.message
        if self.retry_after:
            msg = "%s (retry after %gs)" % (msg, self.retry_after)
        return msg

    def __repr__(self) -> str:
        return "%s(%r)" % (type(self).__name__, str(self))


class InvalidArgumentError(DSecError, ValueError):
    """The request is malformed or names something impossible."""

    kind, code = "InvalidArgument", "invalid_argument"


class NotFoundError(DSecError):
    """The sandbox, exec, file or image does not exist."""

    kind, code = "NotFound", "not_found"


class AlreadyExistsError(DSecError):
    """What the request would create already exists."""

    kind, code = "AlreadyExists", "already_exists"


class FailedPreconditionError(DSecError):
    """The request is valid but the target is not in a state that allows it."""

    kind, code = "FailedPrecondition", "failed_precondition"


class ResourceExhaustedError(DSecError):
    """The platform is full or a quota is reached; ``retry_after`` (seconds)
    says when to try again."""

    kind, code = "ResourceExhausted", "resource_exhausted"


class DeadlineExceededError(DSecError, TimeoutError):
    """The call's deadline passed (the client's timeout or the server's)."""

    kind, code = "DeadlineExceeded", "deadline_exceeded"


class UnauthenticatedError(DSecError):
    """No API key, or a key the server does not know."""

    kind, code = "Unauthenticated", "unauthenticated"


class PermissionDeniedError(DSecError):
    """The key may not do this."""

    kind, code = "PermissionDenied", "permission_denied"


class UnavailableError(DSecError, ConnectionError):
    """The server could not be reached or dropped the call; safe calls are
    retried automatically."""

    kind, code = "Unavailable", "unavailable"


class InternalError(DSecError):
    """The platform failed; the message says what the server logged."""

    kind, code = "Internal", "internal"


class CapabilityMissingError(FailedPreconditionError, NotImplementedError):
    """The request needs a capability this dsec does not have yet.

    Attributes:
        capability: the missing capability's name, e.g. ``"network policy"``.
    """

    def __init__(self, message: str, capability: str) -> None:
        super().__init__(message)
        self.capability = capability


class ArchiveError(ValueError):
    """A tar archive from a sandbox cannot be extracted safely (names that
    leave the target directory, devices, paths through symlinks)."""


# The one table from API codes to kinds: the inverse of the server's
# (internal/apierr). Codes not listed map to InternalError.
_CODES: Dict[str, Type[DSecError]] = {
    "invalid_argument": InvalidArgumentError,
    "not_found": NotFoundError,
    "already_exists": AlreadyExistsError,
    "failed_precondition": FailedPreconditionError,
    "aborted": FailedPreconditionError,
    "resource_exhausted": ResourceExhaustedError,
    "deadline_exceeded": DeadlineExceededError,
    "unauthenticated": UnauthenticatedError,
    "permission_denied": PermissionDeniedError,
    "unavailable": UnavailableError,
    "canceled": UnavailableError,
    "internal": InternalError,
    "unknown": InternalError,
    "data_loss": InternalError,
    "unimplemented": InternalError,
    "out_of_range": InvalidArgumentError,
}

# Codes whose name is kept in the message: a proxy or an older server
# answered with something dsec never sends for a kind.
_KEEP_CODE = ("unknown", "data_loss", "unimplemented", "canceled")


def error_from_code(code: str, message: str, retry_after: Optional[float] = None) -> DSecError:
    """Return the exception for an API error code such as ``"not_found"``."""
    cls = _CODES.get(code, InternalError)
    if not message:
        message = cls.kind
    if code in _KEEP_CODE or code not in _CODES:
        message = "%s (%s)" % (message, code or "no code")
    return cls(message, retry_after=retry_after)
