"""HTTP adapter for Envoy's ``http_service`` ext_authz mode (raw ASGI).

Raw ASGI instead of a framework because this mode exists for throughput: a
bare ASGI callable on uvicorn+httptools answers about 20k req/s per process,
several times what gRPC Check manages in Python.

Envoy sends the original method, headers and ``path_prefix + original path``.
The policy is chosen by the prefix, so each route's ``http_service`` uses
``path_prefix: /check/<policy>`` (``/check/-`` for ``defaultPolicy``); the rest
of the path is the original request target, decided exactly like the gRPC
``attributes.request.http.path``. A request outside ``/check/`` is denied, so
a misconfigured Envoy without a prefix fails closed.

* allow: ``200``, claim headers as response headers (list them in Envoy's
  ``allowed_upstream_headers``) and, when configured,
  ``x-envoy-auth-headers-to-remove: authorization,...``;
* deny: ``403`` with ``x-ext-authz-reason``, ``x-meshplane-denied``, the JSON
  reason body and, when decision lines are on, ``x-decision-id``: the line is
  queued by the gRPC mode's own recorder (:mod:`extauthz.decisions`), so both
  modes write the same line for the same decision.

The request body is never read.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from extauthz import metrics
from extauthz.decisions import DecisionRecorder
from extauthz.jwt_policy import CheckAttributes
from extauthz.reasons import Decision, Reason
from extauthz.responses import DENY_STATUS, JSON_CONTENT_TYPE, deny_body, deny_headers
from extauthz.service import INTERNAL_ERROR, AuthorizationService
from meshplane.decision_log import DECISION_ID_HEADER

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

CHECK_PREFIX = "/check/"
DEFAULT_POLICY_SEGMENT = "-"
HEADERS_TO_REMOVE = b"x-envoy-auth-headers-to-remove"


def attributes_from_scope(scope: Scope) -> CheckAttributes:
    """The engine's view of an ASGI request forwarded by Envoy."""
    raw: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
    target = raw.decode("utf-8", "replace")
    query: bytes = scope.get("query_string", b"")
    if query:
        target += "?" + query.decode("latin-1")
    authorization = tuple(
        value.decode("latin-1") for name, value in scope["headers"] if name == b"authorization"
    )
    if not target.startswith(CHECK_PREFIX):
        # No policy segment: "" is no policy's name, so this is unknown_policy.
        return CheckAttributes("", authorization, policy="")
    rest = target[len(CHECK_PREFIX) :]
    cut = len(rest)
    for sep in ("/", "?"):
        pos = rest.find(sep)
        if pos != -1 and pos < cut:
            cut = pos
    policy = rest[:cut]
    original = rest[cut:] if cut < len(rest) and rest[cut] == "/" else ""
    return CheckAttributes(
        original, authorization, None if policy == DEFAULT_POLICY_SEGMENT else policy
    )


def _deny_messages(reason: Reason) -> tuple[dict[str, Any], dict[str, Any]]:
    body = deny_body(reason)
    start = {
        "type": "http.response.start",
        "status": DENY_STATUS,
        "headers": [
            *((name.encode(), value.encode()) for name, value in deny_headers(reason)),
            (b"content-type", JSON_CONTENT_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    return start, {"type": "http.response.body", "body": body}


_DENIES = {reason: _deny_messages(reason) for reason in Reason}
_ALLOW_BODY = {"type": "http.response.body", "body": b""}


_PLAIN_ALLOW_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-length", b"0")],
}


def _allow_start(decision: Decision) -> dict[str, Any]:
    if not decision.headers_to_add and not decision.headers_to_remove:
        return _PLAIN_ALLOW_START
    headers = [(b"content-length", b"0")]
    headers.extend(
        (name.encode(), value.encode("utf-8")) for name, value in decision.headers_to_add
    )
    if decision.headers_to_remove:
        headers.append((HEADERS_TO_REMOVE, ",".join(decision.headers_to_remove).encode()))
    return {"type": "http.response.start", "status": 200, "headers": headers}


def _with_decision_id(start: dict[str, Any], decision_id: str) -> dict[str, Any]:
    """A copy of a prebuilt deny start message that also sends ``x-decision-id``."""
    headers = [*start["headers"], (DECISION_ID_HEADER.encode(), decision_id.encode())]
    return {**start, "headers": headers}


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


class HttpCheckApp:
    """ASGI callable; see the module docstring. ``recorder`` (set once the
    service starts, as the gRPC mode's) writes decision lines."""

    def __init__(
        self, service: AuthorizationService, recorder: DecisionRecorder | None = None
    ) -> None:
        self._service = service
        self.recorder = recorder

    def _logged(
        self, scope: Scope, attrs: CheckAttributes | None, decision: Decision, start: dict[str, Any]
    ) -> dict[str, Any]:
        """``start``, after queueing the decision line (a deny then names it)."""
        recorder = self.recorder
        if recorder is None or not recorder.wants(decision):
            return start
        decision_id = recorder.record_request(
            decision,
            str(scope.get("method", "")),
            attrs.path if attrs is not None else "",
            _header(scope, b"traceparent"),
            attrs.authorization if attrs is not None else (),
        )
        return start if decision.allowed else _with_decision_id(start, decision_id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off in the runtime; websockets are not served
        try:
            attrs = attributes_from_scope(scope)
        except Exception as exc:
            log.error("unreadable HTTP check; denying", extra={"error": type(exc).__name__})
            metrics.record_check("http", INTERNAL_ERROR, 0.0)
            attrs = None
        decision = INTERNAL_ERROR if attrs is None else await self._service.check(attrs, "http")
        try:
            if decision.allowed:
                start, body = _allow_start(decision), _ALLOW_BODY
            else:
                start, body = _DENIES.get(decision.reason, _DENIES[Reason.INTERNAL_ERROR])
            start = self._logged(scope, attrs, decision, start)
        except Exception:
            start, body = _DENIES[Reason.INTERNAL_ERROR]
        await send(start)
        await send(body)
