"""The gRPC adapter: envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit.

Thin on purpose: it maps the service's two failure kinds to gRPC status codes
and nothing else. INVALID_ARGUMENT for malformed requests; UNAVAILABLE when
the store cannot answer and ``failureMode`` is ``unavailable``, which lets
Envoy's ``failure_mode_deny`` decide (fail open by default), as with the
reference service.

The handler gets the request's bytes and returns the response's, which is
what every server backend (``meshplane.server_contract.SERVER_KINDS``) carries: the service parses
a request only the first time it sees those bytes, and writes the response
in wire format, so neither is built as a message and serialized again on
the hot path. Clients see the same protocol as with the generated servicer.
"""

from __future__ import annotations

from meshplane.grpc_wire import Code, RpcError
from meshplane.server_contract import WorkerContext
from ratelimit.plan import InvalidRequest
from ratelimit.service import RateLimitService
from ratelimit.store import StoreUnavailable

SERVICE_NAME = "envoy.service.ratelimit.v3.RateLimitService"


class ShouldRateLimitHandler:
    """Delegates to RateLimitService; its two exceptions become statuses."""

    def __init__(self, service: RateLimitService) -> None:
        self._decide = service.decide
        # Tracing on: the server hands over the call's traceparent metadata.
        self.wants_trace_context = service.traced

    async def __call__(self, request: bytes) -> bytes:
        try:
            return await self._decide(request)
        except InvalidRequest as exc:
            raise RpcError(Code.INVALID_ARGUMENT, str(exc)) from None
        except StoreUnavailable as exc:
            raise RpcError(
                Code.UNAVAILABLE, f"rate-limit counter store unavailable ({exc})"
            ) from None


def register(service: RateLimitService, ctx: WorkerContext) -> None:
    """Serve ShouldRateLimit in a worker (either server)."""
    ctx.add_unary(SERVICE_NAME, "ShouldRateLimit", ShouldRateLimitHandler(service))
