"""xDS resources serialized once, and responses assembled from the same bytes for every stream.

A ``DiscoveryResponse`` on the wire is its fields one after another, and a
repeated field may be split anywhere: the bytes of
``DiscoveryResponse(version_info, type_url, nonce)`` followed by each
resource's ``resources`` field (tag, length, the packed ``Any``) are the
response itself. So a resource is parsed from its protojson and packed
once (:func:`entry`), kept in a byte-bounded cache (:class:`EntryCache`)
under the key of what it was compiled from, and every stream that is sent it
copies the same bytes (:func:`response`). The ADS servicer is registered
with a serializer that passes such bytes through (:func:`add_to_server`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.config.trace.v3 import opentelemetry_pb2  # noqa: F401 - the tracer's typed config
from envoy.extensions.access_loggers.filters.cel.v3 import (  # noqa: F401 - denials' filters
    cel_pb2,
)
from envoy.extensions.access_loggers.stream.v3 import (  # noqa: F401 - decision lines
    stream_pb2,
)

# Imported for their descriptors: typed configs inside the resources name them.
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2  # noqa: F401
from envoy.extensions.filters.http.header_to_metadata.v3 import (  # noqa: F401 - quota routes
    header_to_metadata_pb2,
)
from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2  # noqa: F401 - local JWT rules
from envoy.extensions.filters.http.lua.v3 import lua_pb2  # noqa: F401 - the path-claim check
from envoy.extensions.filters.http.rate_limit_quota.v3 import (  # noqa: F401 - quota rules
    rate_limit_quota_pb2,
)
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2  # noqa: F401
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2  # noqa: F401 - local JWT rules
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import (  # noqa: F401
    http_connection_manager_pb2,
)
from envoy.extensions.matching.common_inputs.network.v3 import (  # noqa: F401 - quota routes
    network_inputs_pb2,
)
from envoy.extensions.matching.input_matchers.metadata.v3 import (  # noqa: F401 - quota routes
    metadata_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import (
    secret_pb2,
    tls_pb2,  # noqa: F401 - JWKS, mTLS
)
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
from envoy.service.discovery.v3 import discovery_pb2
from envoy.type.matcher.v3 import http_inputs_pb2  # noqa: F401 - quota rules' header inputs
from google.protobuf import any_pb2, json_format
from google.protobuf.message import Message

from mgmt_api.compiler import gateway_xds
from mgmt_api.compiler.protojson import JsonDict
from mgmt_api.compiler.sidecar_xds import ENDPOINT_TYPE

_MESSAGES: dict[str, type[Message]] = {
    gateway_xds.CLUSTER_TYPE: cluster_pb2.Cluster,
    gateway_xds.LISTENER_TYPE: listener_pb2.Listener,
    gateway_xds.ROUTE_TYPE: route_pb2.RouteConfiguration,
    gateway_xds.SECRET_TYPE: secret_pb2.Secret,
    ENDPOINT_TYPE: endpoint_pb2.ClusterLoadAssignment,
}
_RESOURCES_TAG = b"\x12"  # field 2 (resources), length-delimited
#: What :class:`EntryCache` keeps by default (serialized bytes).
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024

#: (resource name, its ``resources`` field serialized).
Entry = tuple[str, bytes]


def pack(type_url: str, resource: JsonDict) -> any_pb2.Any:
    """A protojson resource as the ``Any`` a DiscoveryResponse carries (strict parse)."""
    message = _MESSAGES[type_url]()
    json_format.ParseDict(resource, message)
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def entry(type_url: str, resource: JsonDict) -> Entry:
    """``resource`` packed and serialized as one ``resources`` field of a response."""
    data = pack(type_url, resource).SerializeToString()
    name = resource["clusterName"] if type_url == ENDPOINT_TYPE else resource["name"]
    return str(name), _RESOURCES_TAG + _varint(len(data)) + data


def _field(data: bytes) -> bytes:
    return _RESOURCES_TAG + _varint(len(data)) + data


class Templates:
    """Resources that differ only in their socket address (each sidecar's listeners:
    the same filters on its own port), parsed from protojson once per template.

    The caller names what the resource is made from besides the address (the
    key); the first resource of a key is parsed whole and kept, and each later
    one is a copy with its address set: no protojson per sidecar. A resource
    whose address is not the plain socket address it is given is parsed whole
    every time. Thread-safe; least recently used first out.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._parsed: OrderedDict[Hashable, Message | None] = OrderedDict()

    def entry(
        self, type_url: str, key: Hashable, make: Callable[[], JsonDict], host: str, port: int
    ) -> Entry:
        """The resource ``make`` builds, whose address is ``host:port``, as :func:`entry`."""
        with self._lock:
            known = key in self._parsed
            found = self._parsed.get(key)
            if known:
                self._parsed.move_to_end(key)
        if not known:
            resource = make()
            plain = {"socketAddress": {"address": host, "portValue": port}}
            if resource.get("address") != plain:
                found = None  # not a plain address: no template
            else:
                found = _MESSAGES[type_url]()
                json_format.ParseDict(resource, found)
            with self._lock:
                self._parsed[key] = found
                while len(self._parsed) > self.size:
                    self._parsed.popitem(last=False)
        if found is None:
            return entry(type_url, make())
        message = _MESSAGES[type_url]()
        message.CopyFrom(found)
        address = message.address.socket_address  # type: ignore[attr-defined]
        address.address, address.port_value = host, port
        packed = any_pb2.Any()
        packed.Pack(message)
        return str(message.name), _field(packed.SerializeToString())  # type: ignore[attr-defined]


def response(version: str, type_url: str, nonce: str, entries: Sequence[Entry]) -> bytes:
    """A serialized DiscoveryResponse carrying ``entries``."""
    return framed(version, type_url, nonce, b"".join(data for _, data in entries))


def framed(version: str, type_url: str, nonce: str, body: bytes) -> bytes:
    """A serialized DiscoveryResponse: its header, then ``body`` (entries already joined)."""
    head = discovery_pb2.DiscoveryResponse(version_info=version, type_url=type_url, nonce=nonce)
    first: bytes = head.SerializeToString()
    return first + body


class Bodies:
    """Entry sequences joined once: every stream sent the same sequence object (a
    cluster's shared clusters, its endpoints) copies one joined body.

    Keyed by the sequence's identity, which it holds, so the key stays its own;
    least recently used first out, bounded in bytes and entries. Used on the
    event loop only.
    """

    def __init__(self, max_bytes: int = 64 * 1024 * 1024, max_entries: int = 4096) -> None:
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._bodies: OrderedDict[int, tuple[Sequence[Entry], bytes]] = OrderedDict()
        self._bytes = 0

    def get(self, entries: Sequence[Entry]) -> bytes:
        """``entries`` joined (once while this sequence object is kept)."""
        key = id(entries)
        found = self._bodies.get(key)
        if found is not None and found[0] is entries:
            self._bodies.move_to_end(key)
            return found[1]
        body = b"".join(data for _, data in entries)
        if found is not None:
            self._bytes -= len(found[1])
        self._bodies[key] = (entries, body)
        self._bytes += len(body)
        while len(self._bodies) > 1 and (
            self._bytes > self.max_bytes or len(self._bodies) > self.max_entries
        ):
            _, (_, dropped) = self._bodies.popitem(last=False)
            self._bytes -= len(dropped)
        return body


@dataclass
class Compiled:
    """One version's resources for one Envoy, serialized (shared with other Envoys)."""

    version: str
    resources: dict[str, Sequence[Entry]]  # type → entries, in order (shared sequences)
    warnings: tuple[str, ...]
    serial: str = ""  # a sidecar's trust bundle digest (its secret's version)
    #: type → the ``version_info`` of its responses, when not ``version`` (a sidecar's:
    #: a type whose resources did not change keeps its version, and is not sent again)
    versions: dict[str, str] = field(default_factory=dict)
    #: Which build of its cluster this is (a sidecar's: a later build never yields to
    #: an earlier one that arrives late)
    seq: int = 0

    def type_version(self, type_url: str) -> str:
        """The ``version_info`` of ``type_url``'s responses."""
        return self.versions.get(type_url, self.version)


class Miss(LookupError):
    """Not cached, and not to be built here (see :meth:`EntryCache.get`)."""


class EntryCache:
    """Key → serialized entries, least recently used first out, bounded in bytes.

    The key must name everything the entries were compiled from. Thread-safe:
    builds run off the event loop.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, tuple[Entry, ...]] = OrderedDict()
        self._bytes = 0
        self.built = 0  # how many times ``make`` ran (tests and the bench read it)

    def get(
        self, key: Hashable, make: Callable[[], Sequence[Entry]], *, build: bool = True
    ) -> tuple[Entry, ...]:
        """The entries of ``key``, made (once) on a miss; :class:`Miss` then unless ``build``."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found
        if not build:
            raise Miss(key)
        made = tuple(make())
        size = sum(len(name) + len(data) for name, data in made)
        with self._lock:
            self.built += 1
            if key not in self._entries:
                self._entries[key] = made
                self._bytes += size
            while self._bytes > self.max_bytes and len(self._entries) > 1:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= sum(len(name) + len(data) for name, data in dropped)
        return made

    @property
    def size(self) -> int:
        """Bytes held."""
        with self._lock:
            return self._bytes


def _serialize(message: Any) -> bytes:
    """A response, or the bytes :func:`response` already made."""
    if isinstance(message, bytes):
        return message
    data: bytes = message.SerializeToString()
    return data


def add_to_server(servicer: Any, server: grpc.aio.Server) -> None:
    """Register ``StreamAggregatedResources`` with a serializer that passes bytes through."""
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.StreamAggregatedResources,
        request_deserializer=discovery_pb2.DiscoveryRequest.FromString,
        response_serializer=_serialize,
    )
    generic = grpc.method_handlers_generic_handler(
        "envoy.service.discovery.v3.AggregatedDiscoveryService",
        {"StreamAggregatedResources": handler},
    )
    server.add_generic_rpc_handlers((generic,))
