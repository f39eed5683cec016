"""Baseline for the ext_authz bench: a Check server that allows everything.

Built on the same runtime (``meshplane.server.serve``: spawned workers,
SO_REUSEPORT, health, reflection) as the real server, so the ratio
"ours / baseline" isolates the cost of our decision logic from the cost of
grpcio itself. Run as a script; spawn pickles ``make_app`` by reference to
this ``__main__`` module.

    python bench/extauthz/noop_server.py --listen 127.0.0.1:9300 --workers 1
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from typing import Any

import grpc
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc
from google.rpc import status_pb2

from meshplane.server import ASGIApp, ServeOptions, WorkerContext, serve

_ALLOW = external_auth_pb2.CheckResponse(
    status=status_pb2.Status(code=0), ok_response=external_auth_pb2.OkHttpResponse()
)


class NoopServicer(external_auth_pb2_grpc.AuthorizationServicer):  # type: ignore[misc]
    async def Check(  # the gRPC method name
        self, request: external_auth_pb2.CheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> external_auth_pb2.CheckResponse:
        return _ALLOW


class NoopApp:
    service_names: Sequence[str] = ("envoy.service.auth.v3.Authorization",)
    http_app: ASGIApp | None = None

    async def start(self, ctx: WorkerContext) -> None:
        external_auth_pb2_grpc.add_AuthorizationServicer_to_server(NoopServicer(), ctx.server)

    async def stop(self) -> None:
        return None


def make_app() -> NoopApp:
    return NoopApp()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", default="127.0.0.1:9300")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    return serve(
        functools.partial(make_app),
        ServeOptions(listen=args.listen, workers=args.workers, grace_seconds=1.0),
        service="extauthz-noop",
    )


if __name__ == "__main__":
    sys.exit(main())
