"""mgmt-api's REST spans: one SERVER span per HTTP request, named by the
route *template* (``GET /v2/organizations/{org}``, never the raw path, so no
name or id from the URL becomes span data), continuing the caller's W3C
``traceparent``. Settings are the standard ``OTEL_*`` variables
(:mod:`meshplane.tracing`); without an endpoint the middleware is not even
installed, so an untraced mgmt-api pays nothing.
"""

from __future__ import annotations

import os

from opentelemetry.trace import SpanKind, Tracer
from starlette.types import ASGIApp, Receive, Scope, Send

from meshplane.tracing import Tracing, parent_context, settings_from, start_tracing
from mgmt_api.middleware import StatusCapture, route_template

SERVICE = "mgmt-api"


def start_from_env() -> Tracing | None:
    """The process's tracer per the ``OTEL_*`` variables, or None (off).
    The SDK's provider flushes its queue at interpreter exit (SIGTERM drain)."""
    return start_tracing(settings_from(os.environ, service=SERVICE))


class Traces:
    """The ASGI middleware; outermost, so the span covers authentication too."""

    def __init__(self, app: ASGIApp, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        traceparent = headers.get(b"traceparent")
        tracestate = headers.get(b"tracestate")
        parent = parent_context(
            None if traceparent is None else traceparent.decode("latin-1"),
            None if tracestate is None else tracestate.decode("latin-1"),
        )
        method = scope["method"]
        with self.tracer.start_as_current_span(
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
