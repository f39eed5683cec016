"""meshctl's one error type, its exit codes, and the one-line rendering of API errors.

Scripts branch on the exit code and humans read one line, so every failure,
whether it comes from the management plane, the identity provider, the
network or the user's own input, ends as a ``MeshctlError`` carrying both.
The table of exit codes is part of the CLI's contract (``docs/meshctl.md``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any


class Exit(enum.IntEnum):
    """Documented process exit codes."""

    OK = 0
    API_ERROR = 1  # the server refused or failed (400, 429, 5xx, unexpected answers)
    USAGE = 2  # bad flags or arguments, unreadable or invalid manifest (click also uses 2)
    AUTH = 3  # not logged in, expired session, bad credentials, login refused, 401/403
    NOT_FOUND = 4  # 404
    CONFLICT = 5  # 409: ABORTED (stale etag) or ALREADY_EXISTS
    UNREACHABLE = 6  # the management plane (or identity provider) cannot be reached


class MeshctlError(Exception):
    """A failure to report as ``error: <message>`` with ``exit_code``."""

    def __init__(self, message: str, exit_code: Exit = Exit.API_ERROR) -> None:
        super().__init__(message)
        self.message = one_line(message)
        self.exit_code = exit_code


def one_line(text: str) -> str:
    """Collapse whitespace so an error is always exactly one line."""
    return " ".join(text.split())


# gRPC code numbers of the API's google.rpc.Status body (docs/api.md, "Errors").
GRPC_NAMES: dict[int, str] = {
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}

_HTTP_FALLBACK_NAMES: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
}


def exit_code_for(code_name: str, http_status: int) -> Exit:
    """The exit code of an API failure, by code name first and HTTP status second."""
    if code_name in {"UNAUTHENTICATED", "PERMISSION_DENIED"} or http_status in {401, 403}:
        return Exit.AUTH
    if code_name == "NOT_FOUND" or http_status == 404:
        return Exit.NOT_FOUND
    if code_name in {"ABORTED", "ALREADY_EXISTS"} or http_status == 409:
        return Exit.CONFLICT
    return Exit.API_ERROR


class ApiFailure(MeshctlError):
    """An error answer of the management plane, parsed from its ``{code, message, details}``.

    ``hint`` is what the user should do next; the caller that knows the
    command (and so the right ``meshctl get ...``) may supply a better one.
    """

    def __init__(
        self,
        *,
        http_status: int,
        code_name: str,
        server_message: str,
        metadata: Mapping[str, str],
        field: str | None = None,
        retry_after: str | None = None,
        hint: str | None = None,
        explained: bool = False,
    ) -> None:
        self.http_status = http_status
        self.code_name = code_name
        self.server_message = one_line(server_message)
        self.metadata = dict(metadata)
        self.field = field
        self.retry_after = retry_after
        # The server sent a status record with a message of its own (not a proxy's page).
        self.explained = explained
        self.hint = hint if hint is not None else default_hint(self)
        text = f"{code_name} ({http_status}): {self.server_message}"
        if self.hint:
            text += f"; {self.hint}"
        super().__init__(text, exit_code_for(code_name, http_status))

    def with_hint(self, hint: str) -> ApiFailure:
        """The same failure with a command-specific hint."""
        return ApiFailure(
            http_status=self.http_status,
            code_name=self.code_name,
            server_message=self.server_message,
            metadata=self.metadata,
            field=self.field,
            retry_after=self.retry_after,
            hint=hint,
            explained=self.explained,
        )

    @classmethod
    def from_response(
        cls, http_status: int, body: Any, *, retry_after: str | None = None
    ) -> ApiFailure:
        """Parse the API's google.rpc.Status body; tolerate anything else (a proxy's page)."""
        code_name = _HTTP_FALLBACK_NAMES.get(http_status, "UNKNOWN")
        message = f"the server answered HTTP {http_status}"
        metadata: dict[str, str] = {}
        field: str | None = None
        explained = False
        if isinstance(body, Mapping):
            raw_code = body.get("code")
            if isinstance(raw_code, int) and raw_code in GRPC_NAMES:
                code_name = GRPC_NAMES[raw_code]
            elif isinstance(raw_code, str) and raw_code:
                code_name = raw_code
            if isinstance(body.get("message"), str) and body["message"]:
                message = body["message"]
                explained = True
            for detail in body.get("details") or []:
                if not isinstance(detail, Mapping):
                    continue
                if isinstance(detail.get("reason"), str) and detail["reason"].isupper():
                    code_name = detail["reason"]
                if isinstance(detail.get("metadata"), Mapping):
                    metadata.update({str(k): str(v) for k, v in detail["metadata"].items()})
                for violation in detail.get("fieldViolations") or []:
                    if isinstance(violation, Mapping) and isinstance(violation.get("field"), str):
                        field = field or violation["field"]
            # OAuth-style bodies (token endpoints): {"error", "error_description"}.
            if isinstance(body.get("error"), str) and "message" not in body:
                message = body["error"]
                if isinstance(body.get("error_description"), str):
                    message += f": {body['error_description']}"
        return cls(
            http_status=http_status,
            code_name=code_name,
            server_message=message,
            metadata=metadata,
            field=field,
            retry_after=retry_after,
            explained=explained,
        )


def default_hint(failure: ApiFailure) -> str:
    """What to do next, from the code alone (commands refine it with ``with_hint``)."""
    code = failure.code_name
    if code == "UNAUTHENTICATED":
        return "run meshctl login (your session may have expired)"
    if code == "PERMISSION_DENIED":
        return "ask an administrator for that permission"
    if code == "NOT_FOUND":
        return "check the name and parents (organization, tenant, ...) with meshctl get"
    if code == "ABORTED":
        return "the object changed since you read it; run meshctl get and retry"
    if code == "ALREADY_EXISTS":
        return "use meshctl apply -f to update an existing object"
    if code == "FAILED_PRECONDITION" and "protectedFqn" in failure.metadata:
        return (
            f"set deletionProtectionEnabled: false on {failure.metadata['protectedFqn']}"
            " first, or pass --force"
        )
    if code == "INVALID_ARGUMENT":
        return "fix the named field and retry"
    if code == "RESOURCE_EXHAUSTED":
        wait = f"{failure.retry_after} s" if failure.retry_after else "a while"
        return f"too many attempts; wait {wait} and retry"
    if code == "UNIMPLEMENTED":
        return "this management plane does not offer that operation (is it older than meshctl?)"
    if code == "UNAVAILABLE" and failure.explained:
        # The server named what is unavailable and how to fix it (say, "no agent of
        # cluster ... is connected; start meshplane-agent there"): a generic "the
        # management plane failed" would contradict it.
        return ""
    if code in {"UNAVAILABLE", "INTERNAL", "UNKNOWN"} or failure.http_status >= 500:
        return "the management plane failed; retry later or check its logs"
    return ""
