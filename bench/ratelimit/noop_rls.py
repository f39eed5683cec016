"""The baseline of the rate-limit bench: an RLS that answers OK at once.

Built on the same runtime as the real service (meshplane.server: the same
gRPC server, worker model, health and reflection), so the ratio of our
service to this one measures what deciding costs, not the framework.

    uv run python bench/ratelimit/noop_rls.py --listen 127.0.0.1:18081
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from meshplane.server import ASGIApp, ServeOptions, WorkerContext, serve

_OK = rls_pb2.RateLimitResponse(overall_code=rls_pb2.RateLimitResponse.OK)


class _Noop(rls_pb2_grpc.RateLimitServiceServicer):  # type: ignore[misc]
    async def ShouldRateLimit(
        self, request: rls_pb2.RateLimitRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> rls_pb2.RateLimitResponse:
        response = rls_pb2.RateLimitResponse(overall_code=rls_pb2.RateLimitResponse.OK)
        for _ in request.descriptors:
            response.statuses.add(code=rls_pb2.RateLimitResponse.OK)
        return response


class NoopApp:
    service_names: Sequence[str] = ("envoy.service.ratelimit.v3.RateLimitService",)
    http_app: ASGIApp | None = None

    async def start(self, ctx: WorkerContext) -> None:
        rls_pb2_grpc.add_RateLimitServiceServicer_to_server(_Noop(), ctx.server)

    async def stop(self) -> None:
        return None


def build() -> NoopApp:
    return NoopApp()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", default="127.0.0.1:18081")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    return serve(build, ServeOptions(listen=args.listen, workers=args.workers), service="noop-rls")


if __name__ == "__main__":
    sys.exit(main())
