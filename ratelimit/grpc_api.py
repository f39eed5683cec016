"""The gRPC adapter: envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit.

Thin on purpose: it maps the service's two failure kinds to gRPC status codes
and nothing else. INVALID_ARGUMENT for malformed requests; UNAVAILABLE when
the store cannot answer and ``failureMode`` is ``unavailable``, which lets
Envoy's ``failure_mode_deny`` decide (fail open by default), as with the
reference service.
"""

from __future__ import annotations

import logging

import grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from ratelimit.plan import InvalidRequest
from ratelimit.service import RateLimitService
from ratelimit.store import StoreUnavailable

log = logging.getLogger(__name__)

SERVICE_NAME = "envoy.service.ratelimit.v3.RateLimitService"


class RateLimitServicer(rls_pb2_grpc.RateLimitServiceServicer):  # type: ignore[misc]
    """Delegates to RateLimitService."""

    def __init__(self, service: RateLimitService) -> None:
        self._service = service

    async def ShouldRateLimit(
        self, request: rls_pb2.RateLimitRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> rls_pb2.RateLimitResponse:
        try:
            return await self._service.decide(request)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # unreachable: abort raises
        except StoreUnavailable as exc:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"rate-limit counter store unavailable ({exc})"
            )
            raise


def add_to_server(service: RateLimitService, server: grpc.aio.Server) -> None:
    rls_pb2_grpc.add_RateLimitServiceServicer_to_server(RateLimitServicer(service), server)
