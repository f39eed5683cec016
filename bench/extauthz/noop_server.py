"""The grpcio floor of the ext_authz bench: a Check that allows everything.

Built on our grpcio runtime (``meshplane.server.serve`` with
``server="grpcio"``: spawned workers, SO_REUSEPORT, health, reflection), so
"ours on grpcio / this" isolates our decision from grpcio's own cost. Run as
a script; spawn pickles ``make_app`` by reference to this ``__main__``.

    python bench/extauthz/noop_server.py --listen 127.0.0.1:9300 --workers 1
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence

from envoy.service.auth.v3 import external_auth_pb2
from google.rpc import status_pb2

from meshplane.server import serve
from meshplane.server_contract import ASGIApp, ServeOptions, WorkerContext

ALLOW = external_auth_pb2.CheckResponse(
    status=status_pb2.Status(code=0), ok_response=external_auth_pb2.OkHttpResponse()
).SerializeToString()


async def check(request: bytes) -> bytes:
    return ALLOW


class NoopApp:
    service_names: Sequence[str] = ("envoy.service.auth.v3.Authorization",)
    http_app: ASGIApp | None = None

    async def start(self, ctx: WorkerContext) -> None:
        ctx.add_unary("envoy.service.auth.v3.Authorization", "Check", check)

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
        ServeOptions(listen=args.listen, workers=args.workers, grace_seconds=1.0, server="grpcio"),
        service="extauthz-noop",
    )


if __name__ == "__main__":
    sys.exit(main())
