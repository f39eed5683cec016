"""The one error type of the management API and its wire form.

Every failure leaves the service as ``{"code", "message", "details"}``: the
shape of ``google.rpc.Status`` that grpc-gateway clients already parse. ``code``
is the gRPC code *number* (so gRPC clients and REST agree on it);
the code *name* is always repeated in a ``google.rpc.ErrorInfo`` detail
(``reason``) so humans and scripts never need a lookup table.
"""

from __future__ import annotations

from typing import Any

# The gRPC status codes (google.rpc.Code): one enum for the whole project,
# re-exported here for the API's layers.
from meshplane.grpc_wire import Code as Code  # noqa: PLC0414 - an explicit re-export

# grpc-gateway v2's mapping (FAILED_PRECONDITION is 400, not 412).
HTTP_STATUS: dict[Code, int] = {
    Code.INVALID_ARGUMENT: 400,
    Code.FAILED_PRECONDITION: 400,
    Code.UNAUTHENTICATED: 401,
    Code.PERMISSION_DENIED: 403,
    Code.NOT_FOUND: 404,
    Code.ALREADY_EXISTS: 409,
    Code.ABORTED: 409,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.UNIMPLEMENTED: 501,
    Code.INTERNAL: 500,
    Code.UNAVAILABLE: 503,
    Code.DEADLINE_EXCEEDED: 504,
}

ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
BAD_REQUEST_TYPE = "type.googleapis.com/google.rpc.BadRequest"


class ApiError(Exception):
    """A failure that maps to one gRPC code and one HTTP status.

    Raised anywhere below the routers (domain, store, auth); the app turns it
    into the error body, so no layer formats HTTP responses itself.
    """

    def __init__(
        self,
        code: Code,
        message: str,
        *,
        metadata: dict[str, str] | None = None,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.metadata = dict(metadata or {})
        self.field = field
        self.headers = dict(headers or {})

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    def body(self) -> dict[str, Any]:
        """The JSON body: google.rpc.Status with an ErrorInfo (and BadRequest) detail."""
        details: list[dict[str, Any]] = [
            {
                "@type": ERROR_INFO_TYPE,
                "reason": self.code.name,
                "domain": "meshplane.io",
                "metadata": self.metadata,
            }
        ]
        if self.field is not None:
            details.append(
                {
                    "@type": BAD_REQUEST_TYPE,
                    "fieldViolations": [{"field": self.field, "description": self.message}],
                }
            )
        return {"code": int(self.code), "message": self.message, "details": details}


def invalid(field: str, message: str) -> ApiError:
    """INVALID_ARGUMENT naming the offending field in the message and the details."""
    return ApiError(Code.INVALID_ARGUMENT, f"{field}: {message}", field=field)


def not_found(fqn: str) -> ApiError:
    return ApiError(Code.NOT_FOUND, f"{fqn} not found", metadata={"fqn": fqn})


def already_exists(fqn: str) -> ApiError:
    return ApiError(Code.ALREADY_EXISTS, f"{fqn} already exists", metadata={"fqn": fqn})


def permission_denied(permission: str, fqn: str, kind: str) -> ApiError:
    """Names the missing permission and the object, as admins ask for."""
    target = fqn or "/ (root)"
    return ApiError(
        Code.PERMISSION_DENIED,
        f"missing permission {permission} on {target} (kind {kind})",
        metadata={"permission": permission, "fqn": fqn, "kind": kind},
    )


def unauthenticated(message: str = "credentials required") -> ApiError:
    return ApiError(
        Code.UNAUTHENTICATED,
        message,
        headers={"WWW-Authenticate": 'Basic realm="meshplane", Bearer'},
    )
