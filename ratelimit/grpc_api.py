"""The gRPC adapter: envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit.

Thin on purpose: it maps the service's two failure kinds to gRPC status codes
and nothing else. INVALID_ARGUMENT for malformed requests; UNAVAILABLE when
the store cannot answer and ``failureMode`` is ``unavailable``, which lets
Envoy's ``failure_mode_deny`` decide (fail open by default), as with the
reference service.

The method is registered without (de)serializers, so the handler gets the
request's bytes and returns the response's: the service parses a request
only the first time it sees those bytes, and writes the response in wire
format, so neither is built as a message and serialized again on the hot
path. Clients see the same protocol as with the generated servicer.
"""

from __future__ import annotations

import logging

import grpc

from ratelimit.plan import InvalidRequest
from ratelimit.service import RateLimitService
from ratelimit.store import StoreUnavailable

log = logging.getLogger(__name__)

SERVICE_NAME = "envoy.service.ratelimit.v3.RateLimitService"


class RateLimitServicer:
    """Delegates to RateLimitService."""

    def __init__(self, service: RateLimitService) -> None:
        self._service = service

    async def ShouldRateLimit(
        self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
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
    servicer = RateLimitServicer(service)
    handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
        "ShouldRateLimit": grpc.unary_unary_rpc_method_handler(servicer.ShouldRateLimit)
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
