"""gRPC adapter: ``envoy.service.auth.v3.Authorization/Check``.

Envoy treats an empty ``CheckResponse`` (status unset = OK) as an **allow**,
and a gRPC error as an *error* that ``failure_mode_allow`` may turn into an
allow. So this adapter never raises and never returns a response without an
explicit status: every deny is ``status.code = 7 (PERMISSION_DENIED)`` with
``denied_response.status = 403``; every allow is ``status.code = 0`` with an
``ok_response``. If even building the response fails, a prebuilt deny is
returned.

Header reading follows how Envoy fills ``AttributeContext``: ``headers``
(lower-case keys, duplicate headers merged with ``,``) or, with
``encode_raw_headers: true``, ``header_map`` (raw, duplicates kept). Keys
are lower-cased again here for hand-built requests, and every
``authorization`` value from either is collected so duplicates are denied.

The handler works on wire bytes (``bytes -> bytes``), so every server
backend (``meshplane.server_contract.SERVER_KINDS``) carries it unchanged. Bytes that do not
parse as a CheckRequest are denied like any other failure, and the denies
and the plain allow are serialized once, at import.
"""

from __future__ import annotations

import functools
import logging

from envoy.config.core.v3 import base_pb2
from envoy.service.auth.v3 import external_auth_pb2
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2
from google.rpc import status_pb2
from opentelemetry.trace import Span, SpanKind

from extauthz import claim_metadata, metrics
from extauthz.config import POLICY_CONTEXT_KEY
from extauthz.decisions import DecisionRecorder, with_decision_id
from extauthz.jwt_policy import CheckAttributes
from extauthz.reasons import Decision, Reason
from extauthz.responses import DENY_STATUS, JSON_CONTENT_TYPE, deny_body, deny_headers
from extauthz.service import INTERNAL_ERROR, AuthorizationService
from meshplane.rpc import incoming_trace_context
from meshplane.server_contract import WorkerContext
from meshplane.tracing import Tracing, parent_context

log = logging.getLogger(__name__)

SERVICE_NAME: str = external_auth_pb2.DESCRIPTOR.services_by_name["Authorization"].full_name

_OK = 0
_PERMISSION_DENIED = 7
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_CheckRequest = external_auth_pb2.CheckRequest


_AUTHORIZATION = b"authorization"
# A C-level constructor: CheckAttributes(...) runs the named tuple's Python
# ``__new__``, a frame on every call.
_new_attributes = functools.partial(tuple.__new__, CheckAttributes)


def attributes_from_check(
    request: external_auth_pb2.CheckRequest, raw: bytes | None = None
) -> CheckAttributes:
    """The engine's view of a CheckRequest (``raw``: its wire bytes, when at hand)."""
    attributes = request.attributes
    http = attributes.request.http
    headers = http.headers
    # Envoy always lower-cases keys, so one lookup finds the only copy.
    value = headers.get("authorization")
    if (raw is not None and raw.lower().count(_AUTHORIZATION) == (0 if value is None else 1)) or (
        raw is None and "".join(headers).islower()
    ):
        # With the request's bytes at hand, that no key can be another
        # spelling of "authorization" is told without building a string of
        # every key: the bytes hold no case-insensitive occurrence but the
        # key just found (a key's bytes are on the wire as they are, and no
        # non-ASCII letter lower-cases to one of its letters), so one count
        # of the lowered bytes tells.
        authorization: tuple[str, ...] = () if value is None else (value,)
    else:
        # Hand-built request: collect every spelling, so that two
        # differently-cased copies are denied as duplicates.
        authorization = tuple(headers[key] for key in headers if key.lower() == "authorization")
    path = http.path
    if not path:
        path = headers.get(":path", "")
    if http.HasField("header_map"):
        path, authorization = _with_header_map(http.header_map, path, authorization)
    policy = attributes.context_extensions.get(POLICY_CONTEXT_KEY) or None
    return _new_attributes((path, authorization, policy))


def _with_header_map(
    header_map: base_pb2.HeaderMap, path: str, authorization: tuple[str, ...]
) -> tuple[str, tuple[str, ...]]:
    """The path and authorization values once Envoy's raw ``header_map`` is read too."""
    values = list(authorization)
    for entry in header_map.headers:
        lowered = entry.key.lower()
        value = entry.raw_value.decode("utf-8", "replace") if entry.raw_value else entry.value
        if lowered == "authorization":
            values.append(value)
        elif lowered == ":path" and not path:
            path = value
    return path, tuple(values)


def _build_deny(reason: Reason) -> external_auth_pb2.CheckResponse:
    return external_auth_pb2.CheckResponse(
        status=status_pb2.Status(code=_PERMISSION_DENIED, message=reason.value),
        denied_response=external_auth_pb2.DeniedHttpResponse(
            status=http_status_pb2.HttpStatus(code=DENY_STATUS),
            headers=[
                *(
                    base_pb2.HeaderValueOption(
                        header=base_pb2.HeaderValue(key=name, value=value),
                        append_action=_OVERWRITE,
                    )
                    for name, value in deny_headers(reason)
                ),
                base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key="content-type", value=JSON_CONTENT_TYPE),
                    append_action=_OVERWRITE,
                ),
            ],
            body=deny_body(reason).decode(),
        ),
    )


# Responses are immutable once built and grpc only serializes them, so each
# distinct deny (and the plain allow) is built once and shared.
_DENIES: dict[Reason, external_auth_pb2.CheckResponse] = {r: _build_deny(r) for r in Reason}
_LAST_RESORT = _build_deny(Reason.INTERNAL_ERROR)
_PLAIN_ALLOW = external_auth_pb2.CheckResponse(
    status=status_pb2.Status(code=_OK), ok_response=external_auth_pb2.OkHttpResponse()
)


def _claims_struct(published: tuple[tuple[str, str], ...]) -> struct_pb2.Struct:
    """``{meshplane.claims: {claim: value}}``: what Envoy stores under the filter's namespace."""
    metadata = struct_pb2.Struct()
    claims = metadata.fields[claim_metadata.KEY].struct_value
    for name, value in published:
        claims.fields[name].string_value = value
    return metadata


def response_for(decision: Decision) -> external_auth_pb2.CheckResponse:
    """The CheckResponse that carries ``decision``; always has an explicit status.

    Verified claims go in the top-level ``dynamic_metadata`` (the
    ``OkHttpResponse`` field of that name is deprecated in Envoy), and only
    on an allow: a deny has nothing to publish.
    """
    if not decision.allowed:
        return _DENIES.get(decision.reason, _LAST_RESORT)
    if _plain(decision):
        return _PLAIN_ALLOW
    response = external_auth_pb2.CheckResponse(
        status=status_pb2.Status(code=_OK),
        ok_response=external_auth_pb2.OkHttpResponse(
            headers=[
                base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key=name, value=value), append_action=_OVERWRITE
                )
                for name, value in decision.headers_to_add
            ],
            headers_to_remove=list(decision.headers_to_remove),
        ),
    )
    if decision.claims_metadata:
        response.dynamic_metadata.CopyFrom(_claims_struct(decision.claims_metadata))
    return response


def _plain(decision: Decision) -> bool:
    """An allow with nothing to say beyond OK."""
    return not (decision.headers_to_add or decision.headers_to_remove or decision.claims_metadata)


# Serialized once: a deny or a plain allow costs no serialization per call.
_DENY_BYTES: dict[Reason, bytes] = {r: bytes(m.SerializeToString()) for r, m in _DENIES.items()}
_LAST_RESORT_BYTES = bytes(_LAST_RESORT.SerializeToString())
_PLAIN_ALLOW_BYTES = bytes(_PLAIN_ALLOW.SerializeToString())


#: Allows whose encoding is kept, by the Decision object itself: the engine
#: hands back the very Decision its token cache holds for every request with
#: that token, so one dict lookup and an identity test find its bytes, and
#: building the protobuf (about 5 us with two claims) is paid once per
#: cached token, not per call (a value-keyed cache would hash the whole
#: decision on every call). Holding the decision keeps its id from being
#: reused while the entry lives. An allow's content comes from one verified
#: token (claims capped by ``claim_metadata``, header values by
#: ``jwt_policy.MAX_CLAIM_HEADER_CHARS``), so each entry is a few KiB at most
#: and the cache a few MiB.
ENCODED_ALLOWS = 1024
_BY_IDENTITY: dict[int, tuple[Decision, bytes]] = {}


def encode_response(decision: Decision) -> bytes:
    """``response_for(decision)``, serialized (prebuilt bytes for denies and
    plain allows); never raises: an allow that cannot be encoded is denied."""
    if not decision.allowed:
        return _DENY_BYTES.get(decision.reason, _LAST_RESORT_BYTES)
    known = _BY_IDENTITY.get(id(decision))
    if known is not None and known[0] is decision:
        return known[1]
    try:
        encoded = (
            _PLAIN_ALLOW_BYTES
            if _plain(decision)
            else bytes(response_for(decision).SerializeToString())
        )
    except Exception as exc:
        log.error("building CheckResponse failed; denying", extra={"error": type(exc).__name__})
        return _LAST_RESORT_BYTES
    if len(_BY_IDENTITY) >= ENCODED_ALLOWS:
        del _BY_IDENTITY[next(iter(_BY_IDENTITY))]  # the oldest first
    _BY_IDENTITY[id(decision)] = (decision, encoded)
    return encoded


class CheckHandler:
    """The Check RPC on wire bytes; see the module docstring for the fail-closed contract.

    With tracing on, each *sampled* call is one span continuing the W3C
    context Envoy put in the call (``tracing.gate`` decides first, so an
    unsampled call makes no span object); with tracing off (the default),
    the untraced path runs.
    """

    def __init__(
        self,
        service: AuthorizationService,
        tracing: Tracing | None = None,
        recorder: DecisionRecorder | None = None,
    ) -> None:
        self._service = service
        self._tracing = tracing
        self._recorder = recorder
        # Tracing on: the server hands over the call's traceparent metadata.
        self.wants_trace_context = tracing is not None

    async def __call__(self, raw: bytes) -> bytes:
        tracing = self._tracing
        if tracing is None:
            # The usual call (tracing off): one frame from bytes to bytes.
            try:
                request = _CheckRequest.FromString(raw)
                attrs = attributes_from_check(request, raw)
            except Exception as exc:
                return _unreadable(exc)
            decision = self._service.check_now(attrs, "grpc")
            if decision is None:  # a key-id miss that a JWKS refetch may cure: wait for it
                decision = await self._service.check(attrs, "grpc")
            if self._recorder is None:
                return encode_response(decision)
            return self._respond(request, attrs, decision, incoming_trace_context()[0])
        # Envoy's tracer puts its ext_authz client span in the call's
        # metadata; without one, the request's own headers (below).
        traceparent, tracestate = incoming_trace_context()
        call_traceparent = traceparent
        try:
            request = _CheckRequest.FromString(raw)
            attrs = attributes_from_check(request, raw)
        except Exception as exc:
            if tracing.gate(traceparent):
                return _traced_unreadable(tracing, exc)
            return _unreadable(exc)
        if traceparent is None:
            headers = request.attributes.request.http.headers
            traceparent = headers.get("traceparent")
            if traceparent is not None:
                tracestate = headers.get("tracestate")
        # The gate first: a sampled-out call takes the untraced path.
        if tracing.gate(traceparent):
            return await self._traced(
                tracing, request, attrs, (traceparent, tracestate), call_traceparent
            )
        return await self._answer(request, attrs, call_traceparent)

    async def _answer(
        self,
        request: external_auth_pb2.CheckRequest,
        attrs: CheckAttributes,
        call_traceparent: str | None,
        span: Span | None = None,
    ) -> bytes:
        decision = self._service.check_now(attrs, "grpc")
        if decision is None:  # a key-id miss that a JWKS refetch may cure: wait for it
            decision = await self._service.check(attrs, "grpc")
        if span is not None:
            _annotate(span, decision)
        return self._respond(request, attrs, decision, call_traceparent)

    def _respond(
        self,
        request: external_auth_pb2.CheckRequest,
        attrs: CheckAttributes,
        decision: Decision,
        call_traceparent: str | None = None,
    ) -> bytes:
        """The serialized response (after the decision line, when they are on);
        ``call_traceparent`` is the gRPC call's own ``traceparent`` metadata."""
        try:
            if self._recorder is not None:
                return self._logged(request, attrs, decision, call_traceparent)
            return encode_response(decision)
        except Exception as exc:
            log.error("building CheckResponse failed; denying", extra={"error": type(exc).__name__})
            return _LAST_RESORT_BYTES

    def _logged(
        self,
        request: external_auth_pb2.CheckRequest,
        attrs: CheckAttributes,
        decision: Decision,
        call_traceparent: str | None,
    ) -> bytes:
        """The response, after the decision line (denies carry ``x-decision-id``)."""
        assert self._recorder is not None
        decision_id = self._recorder.record(
            request, decision, attrs.authorization, call_traceparent
        )
        if decision_id is None or decision.allowed:
            return encode_response(decision)
        return with_decision_id(_DENY_BYTES.get(decision.reason, _LAST_RESORT_BYTES), decision_id)

    async def _traced(
        self,
        tracing: Tracing,
        request: external_auth_pb2.CheckRequest,
        attrs: CheckAttributes,
        context: tuple[str | None, str | None],
        call_traceparent: str | None,
    ) -> bytes:
        """A sampled call: one SERVER span continuing the caller's context
        (``traceparent``, ``tracestate``)."""
        parent = parent_context(*context)
        with tracing.tracer.start_as_current_span(
            SPAN_NAME, context=parent, kind=SpanKind.SERVER
        ) as span:
            return await self._answer(request, attrs, call_traceparent, span)


def _traced_unreadable(tracing: Tracing, exc: Exception) -> bytes:
    with tracing.tracer.start_as_current_span(SPAN_NAME, kind=SpanKind.SERVER) as span:
        span.set_attributes({"meshplane.decision": "deny", "meshplane.reason": "internal"})
        return _unreadable(exc)


SPAN_NAME = "extauthz Check"


def _annotate(span: Span, decision: Decision) -> None:
    """Decision, reason and policy: never a header, a token or a claim value."""
    span.set_attributes(
        {
            "meshplane.decision": "allow" if decision.allowed else "deny",
            "meshplane.reason": decision.reason.value,
            "meshplane.policy": decision.policy,
        }
    )


def _unreadable(exc: Exception) -> bytes:
    log.error("unreadable CheckRequest; denying", extra={"error": type(exc).__name__})
    metrics.record_check("grpc", INTERNAL_ERROR, 0.0)
    return _LAST_RESORT_BYTES


def register(
    service: AuthorizationService,
    ctx: WorkerContext,
    tracing: Tracing | None = None,
    recorder: DecisionRecorder | None = None,
) -> None:
    """Serve Check in a worker (either server); ``recorder`` writes decision lines."""
    ctx.add_unary(SERVICE_NAME, "Check", CheckHandler(service, tracing, recorder))
