"""Build a CheckRequest as Envoy's ext_authz filter does, and read its answer.

Shared by ``extauthz check --server`` and ``meshctl diag check``, so both
send exactly what Envoy sends (``envoy.extensions.filters.http.ext_authz``
with a gRPC service, HTTP/1.1 downstream):

- ``attributes.request.http``: ``method``, ``path`` (with its query),
  ``host`` (the ``:authority``), ``scheme``, ``protocol``, a fresh ``id``, and
  ``headers`` with lower-cased names, including the pseudo-headers
  ``:authority``, ``:method``, ``:path`` and ``:scheme``;
- ``attributes.source`` / ``destination``: the peers' socket addresses;
- ``attributes.request.time``;
- ``attributes.context_extensions``: the route's per-filter config (where a
  meshplane route names its policy, ``meshplane.policy``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from envoy.config.core.v3 import address_pb2
from envoy.service.auth.v3 import attribute_context_pb2, external_auth_pb2

AttributeContext = attribute_context_pb2.AttributeContext


class PairError(ValueError):
    """A ``NAME=VALUE`` argument without ``=``."""


def parse_pairs(items: Iterable[str], flag: str, *, lower: bool = False) -> dict[str, str]:
    """``["k=v", ...]`` → ``{k: v}``; names lower-cased if ``lower`` (HTTP headers)."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise PairError(f"{flag} {item!r} is not NAME=VALUE")
        out[name.lower() if lower else name] = value
    return out


def parse_address(text: str, default_port: int) -> tuple[str, int]:
    """``HOST[:PORT]`` (``[v6]:PORT`` too) → (host, port)."""
    host, sep, port = text.rpartition(":")
    if sep and port.isdigit() and (not host.count(":") or host.startswith("[")):
        return host.strip("[]"), int(port)
    return text.strip("[]"), default_port


@dataclass(frozen=True)
class HttpCall:
    """The downstream request Envoy is asked to authorize."""

    method: str = "GET"
    path: str = "/"
    host: str = "localhost"
    scheme: str = "http"
    protocol: str = "HTTP/1.1"
    headers: Mapping[str, str] = field(default_factory=dict)
    context_extensions: Mapping[str, str] = field(default_factory=dict)
    source: tuple[str, int] = ("127.0.0.1", 50000)
    destination: tuple[str, int] = ("127.0.0.1", 8080)


def _peer(address: tuple[str, int]) -> Any:
    socket_address = address_pb2.SocketAddress(address=address[0], port_value=address[1])
    return AttributeContext.Peer(address=address_pb2.Address(socket_address=socket_address))


def build_check_request(
    call: HttpCall, *, now: float | None = None, request_id: str | None = None
) -> external_auth_pb2.CheckRequest:
    """The CheckRequest Envoy sends for ``call``."""
    headers = {
        ":authority": call.host,
        ":method": call.method,
        ":path": call.path,
        ":scheme": call.scheme,
    }
    headers.update({name.lower(): value for name, value in call.headers.items()})
    request_id = request_id or str(uuid.uuid4())
    headers.setdefault("x-request-id", request_id)
    headers.setdefault("x-forwarded-proto", call.scheme)
    http = AttributeContext.HttpRequest(
        id=request_id,
        method=call.method,
        headers=headers,
        path=call.path,
        host=call.host,
        scheme=call.scheme,
        protocol=call.protocol,
        size=int(headers.get("content-length", "-1") or -1),
    )
    request = AttributeContext.Request(http=http)
    request.time.FromNanoseconds(int((time.time() if now is None else now) * 1e9))
    attributes = AttributeContext(
        source=_peer(call.source),
        destination=_peer(call.destination),
        request=request,
    )
    for key, value in call.context_extensions.items():
        attributes.context_extensions[key] = value
    return external_auth_pb2.CheckRequest(attributes=attributes)


def describe_check_response(response: external_auth_pb2.CheckResponse) -> dict[str, Any]:
    """The decision as plain data: allowed, gRPC status, HTTP status, headers, body."""
    allowed = response.status.code == 0
    result: dict[str, Any] = {"allowed": allowed, "grpc_status": response.status.code}
    if allowed:
        ok = response.ok_response
        result["headers"] = {h.header.key: h.header.value for h in ok.headers}
        result["headers_to_remove"] = list(ok.headers_to_remove)
    else:
        denied = response.denied_response
        result["http_status"] = denied.status.code
        result["headers"] = {h.header.key: h.header.value for h in denied.headers}
        result["body"] = denied.body
    return result
