"""mgmt-api's REST spans: one SERVER span per HTTP request, named by the
route *template* (``GET /v2/organizations/{org}``, never the raw path, so no
name or id from the URL becomes span data), continuing the caller's W3C
``traceparent``. Settings are the standard ``OTEL_*`` variables
(:mod:`meshplane.tracing`); without an endpoint the middleware is not even
installed, so an untraced mgmt-api pays nothing.
"""

from __future__ import annotations

import os

from opentelemetry.trace import SpanKind
from starlette.types import ASGIApp, Receive, Scope, Send

from meshplane.tracing import Tracing, parent_context, settings_from, start_tracing
from mgmt_api.middleware import StatusCapture, route_template

SERVICE = "mgmt-api"


def start_from_env() -> Tracing | None:
    """The process's tracer per the ``OTEL_*`` variables, or None (off).
    The SDK's provider flushes its queue at interpreter exit (SIGTERM drain)."""
    return start_tracing(settings_from(os.environ, service=SERVICE))


class Traces:
    """The ASGI middleware; outermost, so the span covers authentication too.

    The tracing gate decides first (the caller's sampled flag, else the
    ratio): a request it samples out makes no span, so neither do its
    database and publish children (:func:`meshplane.tracing.child_span`)."""

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        traceparent = headers.get(b"traceparent")
        tracestate = headers.get(b"tracestate")
        incoming = None if traceparent is None else traceparent.decode("latin-1")
        if not self.tracing.gate(incoming):
            await self.app(scope, receive, send)
            return
        parent = parent_context(
            incoming, None if tracestate is None else tracestate.decode("latin-1")
        )
        method = scope["method"]
        with self.tracing.tracer.start_as_current_span(
            f"{method} mgmt-api", context=parent, kind=SpanKind.SERVER
        ) as span:
            status = StatusCapture(send)
            try:
                await self.app(scope, receive, status)
            finally:
                template = route_template(scope)
                span.update_name(f"{method} {template}")
                span.set_attributes(
                    {
                        "http.request.method": method,
                        "http.route": template,
                        "http.response.status_code": status.code,
                    }
                )
