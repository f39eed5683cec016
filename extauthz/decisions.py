"""extauthz's decision-log hook: which Checks get a line, and what the line says.

Kept apart from the Check adapter so the hot path gains one call and one
branch: a plain allow that is not sampled costs a random draw and nothing
else. Every deny gets a line and an ``x-decision-id`` response header.

This is extauthz's one redaction point for decision lines: a line is built
here, only from the decision, the method, the path, the W3C trace id and the
``sub`` claim, and the ``sub`` is masked unless configured to show it. The
token itself, its signature and every other header never reach the line.

The ``sub`` is read from the token's payload without verifying it (most
denies happen before or instead of verification). It is labelled as such
(``principal_verified: false``), so a line groups attempts by a claimed
caller without vouching for who it is.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import random
import time
from collections.abc import Callable

from envoy.config.core.v3 import base_pb2
from envoy.service.auth.v3 import external_auth_pb2

from extauthz.reasons import RULES, Decision
from meshplane.decision_log import (
    DECISION_ID_HEADER,
    DecisionLog,
    DecisionLogSettings,
    DenialKind,
    clip,
    new_decision_id,
    parse_traceparent,
    rfc3339,
    sampled,
)

_MAX_TOKEN_CHARS = 16 << 10  # matches the engine's own cap order of magnitude
_HELD_OVERHEAD = 512  # a queued builder's own objects, roughly, for the byte bound
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def claimed_subject(authorization: tuple[str, ...]) -> str | None:
    """The unverified ``sub`` of the single bearer token, or None (pure, never raises)."""
    if len(authorization) != 1:
        return None
    scheme, _, token = authorization[0].partition(" ")
    if scheme.lower() != "bearer" or len(token) > _MAX_TOKEN_CHARS:
        return None
    parts = token.strip().split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    sub = payload.get("sub") if isinstance(payload, dict) else None
    return sub if isinstance(sub, str) else None


def decision_line(
    decision: Decision,
    decision_id: str,
    now: float,
    *,
    method: str,
    path: str,
    traceparent: str | None,
    subject: str | None,
    show_principal: bool,
    salt_mask: Callable[[str, bool], str],
) -> dict[str, object]:
    """The decision line (pure): every field the brief lists, the subject masked."""
    return {
        "decision_id": decision_id,
        "trace_id": parse_traceparent(traceparent),
        "time": rfc3339(now),
        "decision": "allow" if decision.allowed else "deny",
        "kind": DenialKind.EXTAUTHZ.value,
        "policy": decision.policy,
        "rule": RULES[decision.reason],
        "reason": decision.reason.value,
        "method": clip(method),
        "path": clip(path),
        "principal": None if subject is None else salt_mask(subject, show_principal),
        "principal_verified": False,
    }


def _build(
    decision: Decision,
    decision_id: str,
    now: float,
    *,
    method: str,
    path: str,
    traceparent: str | None,
    authorization: tuple[str, ...],
    settings: DecisionLogSettings,
) -> dict[str, object]:
    """The line of a queued Check (run by the writer thread)."""
    return decision_line(
        decision,
        decision_id,
        now,
        method=method,
        path=path,
        traceparent=traceparent,
        subject=claimed_subject(authorization),
        show_principal=settings.show_principal,
        salt_mask=settings.shown,
    )


class DecisionRecorder:
    """Decides whether a Check is logged, submits its line, and returns its id."""

    def __init__(
        self,
        log: DecisionLog,
        *,
        clock: Callable[[], float] = time.time,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._log = log
        self._settings = log.settings
        self._clock = clock
        self._draw = draw

    def record(
        self,
        request: external_auth_pb2.CheckRequest,
        decision: Decision,
        authorization: tuple[str, ...],
        call_traceparent: str | None = None,
    ) -> str | None:
        """The decision id when a line was queued for this Check, else None.

        The trace id is the request's own ``traceparent`` header, else the
        gRPC call's (``call_traceparent``): a gateway or sidecar that starts
        the trace itself sends its context only in the call's metadata."""
        if not self.wants(decision):
            return None
        http = request.attributes.request.http
        path = http.path or http.headers.get(":path", "")
        traceparent = http.headers.get("traceparent") or call_traceparent
        return self.record_request(decision, http.method, path, traceparent, authorization)

    def record_request(
        self,
        decision: Decision,
        method: str,
        path: str,
        traceparent: str | None,
        authorization: tuple[str, ...],
    ) -> str:
        """Queue the line of a Check already chosen for one (either protocol's
        adapter reads ``method``, ``path`` and ``traceparent`` off its own request);
        returns its decision id."""
        decision_id = new_decision_id()
        # Only the reads of the request happen here; the line (the trace id,
        # the subject and its hash) is built in the writer thread.
        self._log.submit(
            functools.partial(
                _build,
                decision,
                decision_id,
                self._clock(),
                method=method,
                path=path,
                traceparent=traceparent,
                authorization=authorization,
                settings=self._settings,
            ),
            _HELD_OVERHEAD
            + len(path)
            + len(method)
            + len(traceparent or "")
            + sum(len(a) for a in authorization),
        )
        return decision_id

    def wants(self, decision: Decision) -> bool:
        """Whether ``decision`` gets a line: every deny, and sampled allows."""
        return not decision.allowed or sampled(self._settings.allow_sample, self._draw())

    def close(self) -> None:
        self._log.close()


_ID_SAMPLE = "0" * 32
_ID_FRAGMENT: bytes = external_auth_pb2.CheckResponse(
    denied_response=external_auth_pb2.DeniedHttpResponse(
        headers=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=DECISION_ID_HEADER, value=_ID_SAMPLE),
                append_action=_OVERWRITE,
            )
        ]
    )
).SerializeToString()
_ID_FRAGMENT = bytes(_ID_FRAGMENT)
_ID_AT = _ID_FRAGMENT.index(_ID_SAMPLE.encode())
_ID_HEAD, _ID_TAIL = _ID_FRAGMENT[:_ID_AT], _ID_FRAGMENT[_ID_AT + len(_ID_SAMPLE) :]


def with_decision_id(deny: bytes, decision_id: str) -> bytes:
    """A serialized deny that also sends ``x-decision-id`` to the caller.

    Protobuf merges a repeated embedded message field: a second
    ``denied_response`` holding one header appends that header to the first
    one's, so the prebuilt deny bytes are reused and only the id is spliced
    into a prebuilt fragment (an id is always 32 hex digits).
    """
    if len(decision_id) != len(_ID_SAMPLE):
        raise ValueError("a decision id is 32 characters")
    return deny + _ID_HEAD + decision_id.encode() + _ID_TAIL
