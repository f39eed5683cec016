"""Envoy's Aggregated Discovery Service for a cluster's gateway Envoys (state of the world).

A gateway boots with :func:`meshplane.gateway_contract.bootstrap` and opens
one ``StreamAggregatedResources`` stream to mgmt-api's gRPC port (the policy
stream's). The servicer:

1. reads the gateway from the first request's ``node``
   (:func:`~meshplane.gateway_contract.parse_node`) and admits its bearer token
   for that node's cluster only, with the gateway audience, exactly as the
   policy stream admits subscribers (:mod:`mgmt_api.service.stream_auth`);
2. answers each type Envoy subscribes to (clusters and listeners, then the
   listener's route configuration) with the resources
   :func:`mgmt_api.compiler.gateway_xds.compile_gateway` renders for it, all
   at one version: the digest of the cluster's gateway input;
3. whenever the change feed moves and that version changes, sends every
   subscribed type again, clusters first, so a route never points at a
   cluster Envoy does not have yet;
4. records what Envoy does with them in the registry the status views read
   (kind ``gateway``): ``sent`` when a version goes out, ``ACK`` once the
   clusters, listener and routes of that version are all accepted, ``NACK``
   with Envoy's error detail as soon as one is rejected. Envoy keeps running
   its last accepted configuration after a NACK; the servicer does not send
   the rejected version again, only the next one.

Protocol details kept from Envoy's xDS spec: a request whose
``response_nonce`` is not the last one sent for its type is stale and
ignored; a request without a nonce (a new subscription, or Envoy's restart of
one) gets the current resources; for the route type, only the names Envoy
asks for are sent. Types other than clusters, listeners, routes and (sidecars only) SDS
secrets get no answer (nothing else is dynamic in a gateway).

Sidecars are admitted by their pod's workload token, not by the cluster's
agent key (:meth:`~mgmt_api.distribution.sidecar_ads.SidecarStreams.admit`),
and also subscribe to one SDS secret on ADS, the trust bundle
(:mod:`mgmt_api.distribution.sidecar_ads`). Each of a sidecar's types has
its own ``version_info``, the digest of what its resources are made from
(the secret: the bundle's; listeners: the policy's; routes: the policy's
and the service names'; clusters: the policy's and the services';
endpoints (EDS): the services' addresses), and a new version sends only the
types whose resources changed: a join or leave sends the changed
service's assignment, a CA rotation the secret. The status keeps reporting
configuration versions: a version is applied once every type is ACKed at
that version's type versions.

While a stream is open, the gateway counts as heard from (gRPC keepalive
pings close it when the peer is gone), and every wake-up re-checks the
token's key and the cluster, as the policy stream does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import json_format

from meshplane import sidecar_contract
from meshplane.distribution_contract import NodeIdentity
from meshplane.gateway_contract import GATEWAY_KIND, GatewayNode, NodeError, parse_node
from meshplane.sidecar_contract import SIDECAR_KIND, SidecarNode
from mgmt_api.compiler import gateway_xds, sidecar_xds
from mgmt_api.distribution.feed import ChangeFeed, SharedBuilds
from mgmt_api.distribution.sidecar_ads import SidecarStreams
from mgmt_api.distribution.streams import (
    Admitted,
    StillAdmitted,
    StreamPlane,
    admit_bearer,
    cancel,
    connected,
    ended,
    follow,
    fresh,
    read_requests,
    refuse,
)
from mgmt_api.distribution.wire import Bodies, Compiled, Entry, entry, framed
from mgmt_api.service.enforcement import UnknownCluster
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.sidecars import DirectoryFull
from mgmt_api.service.stream_auth import Revocation

log = logging.getLogger(__name__)

# Clusters before listeners before routes: what a later type references exists first.
TYPES: tuple[str, ...] = (
    gateway_xds.CLUSTER_TYPE,
    gateway_xds.LISTENER_TYPE,
    gateway_xds.ROUTE_TYPE,
)
# A sidecar's secrets come first: its clusters and listener name them.
SIDECAR_TYPES: tuple[str, ...] = (
    gateway_xds.SECRET_TYPE,
    gateway_xds.CLUSTER_TYPE,
    sidecar_xds.ENDPOINT_TYPE,  # after the clusters that name them, as Envoy asks
    gateway_xds.LISTENER_TYPE,
    gateway_xds.ROUTE_TYPE,
)
# Types whose responses carry only the names Envoy asked for.
_BY_NAME = (gateway_xds.ROUTE_TYPE, gateway_xds.SECRET_TYPE, sidecar_xds.ENDPOINT_TYPE)

# (bearer token, node) → a grant (the key id), or raise AuthError.
Authenticate = Callable[[str, NodeIdentity], Awaitable[str]]
# (organization, cluster) → the cluster's gateway input.
Build = Callable[[tuple[str, str]], Awaitable[gateway_xds.GatewayInput]]


def compile_for(inp: gateway_xds.GatewayInput, node: GatewayNode) -> Compiled:
    return packed(inp.version(), gateway_xds.compile_gateway(inp, node))


def packed(version: str, compiled: gateway_xds.GatewayResources) -> Compiled:
    """A gateway's resources, serialized (each gateway's own: they differ by node)."""
    resources: dict[str, Sequence[Entry]] = {
        type_url: [entry(type_url, r) for r in items]
        for type_url, items in compiled.by_type().items()
    }
    return Compiled(version, resources, compiled.warnings)


@dataclass
class _Stream:
    """What one gateway or sidecar has been sent and has accepted, per type."""

    identity: NodeIdentity
    node: GatewayNode | SidecarNode
    subscribed: dict[str, tuple[str, ...]] = field(default_factory=dict)  # type → names
    wanted: dict[str, frozenset[str]] = field(default_factory=dict)  # the same, as sets
    asked: dict[str, list[str]] = field(default_factory=dict)  # type → names as last sent
    sent: dict[str, tuple[str, str]] = field(default_factory=dict)  # type → (nonce, version)
    acked: dict[str, str] = field(default_factory=dict)  # type → version
    applied: str = ""
    compiled: Compiled | None = None  # the version last sent

    @property
    def role(self) -> str:
        """What the Envoy is, for what the logs say about it."""
        return "sidecar" if isinstance(self.node, SidecarNode) else "gateway"

    @property
    def types(self) -> tuple[str, ...]:
        """The types this Envoy is served, in the order a new version sends them."""
        return SIDECAR_TYPES if isinstance(self.node, SidecarNode) else TYPES

    def subscribe(self, type_url: str, names: tuple[str, ...]) -> None:
        """Envoy now wants ``names`` of ``type_url`` (all of them when empty)."""
        self.subscribed[type_url] = names
        self.wanted[type_url] = frozenset(names)
        self.asked[type_url] = list(names)

    def names(self, type_url: str, request: discovery_pb2.DiscoveryRequest) -> tuple[str, ...]:
        """The names ``request`` asks for, sorted; no sort when they are the subscribed
        ones in their order (an ACK repeats them; a sidecar's EDS ACK names every
        service)."""
        asked = list(request.resource_names)
        if type_url in self.subscribed and asked == self.asked.get(type_url):
            return self.subscribed[type_url]
        return tuple(sorted(asked))

    def all_acked(self, compiled: Compiled) -> bool:
        """Every type of ``compiled`` accepted (a type with no resources, once subscribed)."""
        return all(
            self.acked.get(t) == compiled.type_version(t)
            for t in self.types
            if compiled.resources.get(t) or t in self.subscribed
        )


class _Diffs:
    """What differs between two entry sequences, once per pair of sequence objects:
    the streams of one push share both (:class:`~mgmt_api.distribution.wire.Bodies`)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._seen: OrderedDict[Hashable, tuple[object, ...]] = OrderedDict()

    def changed(
        self, before: Sequence[Entry], after: Sequence[Entry], also: frozenset[str] = frozenset()
    ) -> list[Entry]:
        """The entries of ``after`` that are new or differ from ``before``'s, and those
        named in ``also``."""
        key = (id(before), id(after), also)
        found = self._seen.get(key)
        if found is not None and found[0] is before and found[1] is after:
            self._seen.move_to_end(key)
            return found[2]  # type: ignore[return-value]
        old = dict(before)
        items = [(n, r) for n, r in after if n in also or old.get(n) != r]
        self._seen[key] = (before, after, items)
        if len(self._seen) > self.size:
            self._seen.popitem(last=False)
        return items

    def names(self, before: Compiled, after: Compiled, type_url: str) -> frozenset[str]:
        """Names of ``type_url``'s resources that are new or differ in ``after``."""
        if before.type_version(type_url) == after.type_version(type_url):
            return frozenset()
        changed = self.changed(
            before.resources.get(type_url, ()), after.resources.get(type_url, ())
        )
        return frozenset(n for n, _ in changed)


class AggregatedDiscoveryServicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):  # type: ignore[misc]
    """ADS for gateway Envoys; see the module docstring."""

    def __init__(
        self,
        build: Build,
        authenticate: Authenticate,
        feed: ChangeFeed,
        registry: SubscriberRegistry,
        *,
        still_admitted: StillAdmitted | None = None,
        clock: Callable[[], float] = time.time,
        heartbeat: float = 30.0,
        sidecars: SidecarStreams | None = None,
    ) -> None:
        """``sidecars``: serve sidecar nodes too (docs/mesh.md); without, they are refused."""
        self._authenticate = authenticate
        self._sidecars = sidecars
        self._plane = StreamPlane(feed, registry, still_admitted, clock, heartbeat)
        self._nonces = itertools.count(1)
        self._bodies = Bodies()
        self._diffs = _Diffs()
        self._builds: SharedBuilds[tuple[str, str], gateway_xds.GatewayInput] = SharedBuilds(
            feed, build
        )

    async def _admit(
        self,
        first: discovery_pb2.DiscoveryRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> tuple[GatewayNode | SidecarNode, NodeIdentity, str]:
        metadata = json_format.MessageToDict(first.node.metadata)
        node: GatewayNode | SidecarNode
        try:
            if sidecar_contract.is_sidecar(metadata):
                if self._sidecars is None:
                    raise NodeError("this ADS server does not serve sidecars")
                node = sidecar_contract.parse_node(first.node.id, first.node.cluster, metadata)
            else:
                node = parse_node(first.node.id, first.node.cluster, metadata)
        except NodeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if isinstance(node, SidecarNode):
            # The pod's workload token, never the agent key or a gateway token.
            assert self._sidecars is not None
            sidecars, sidecar = self._sidecars, node
            identity = NodeIdentity(SIDECAR_KIND, node.organization, node.cluster, node.instance)
            grant = await admit_bearer(context, lambda token: sidecars.admit(token, sidecar))
            return node, identity, grant
        identity = NodeIdentity(GATEWAY_KIND, node.organization, node.cluster, node.instance)
        grant = await admit_bearer(context, lambda token: self._authenticate(token, identity))
        return node, identity, grant

    def _response(
        self,
        stream: _Stream,
        compiled: Compiled,
        type_url: str,
        since: Compiled | None = None,
        also: frozenset[str] = frozenset(),
    ) -> bytes:
        """``type_url``'s resources (those subscribed by name; with ``since``, only those
        that differ from its, and those named in ``also``: EDS is incremental, an
        assignment not sent is kept)."""
        whole = items = compiled.resources.get(type_url, ())
        if type_url in _BY_NAME and stream.subscribed.get(type_url):
            wanted = stream.wanted[type_url]
            if any(n not in wanted for n, _ in items):
                items = [(n, r) for n, r in items if n in wanted]
        if since is not None:
            items = self._diffs.changed(since.resources.get(type_url, ()), items, also)
        # A sequence every stream shares is joined once; what only this one is sent, here.
        body = self._bodies.get(items) if items is whole else b"".join(r for _, r in items)
        nonce = str(next(self._nonces))
        version = compiled.type_version(type_url)
        stream.sent[type_url] = (nonce, version)
        return framed(version, type_url, nonce, body)

    def _answer(
        self,
        stream: _Stream,
        compiled: Compiled,
        request: discovery_pb2.DiscoveryRequest,
    ) -> bytes | None:
        """What a request calls for: a response, or None (an ACK, a NACK, stale, unknown)."""
        type_url = request.type_url
        if type_url not in stream.types:  # gateways have no secrets
            return None
        names = stream.names(type_url, request)
        if not request.response_nonce:  # a (re)subscription
            stream.subscribe(type_url, names)
            return self._response(stream, compiled, type_url)
        nonce, version = stream.sent.get(type_url, ("", ""))
        if request.response_nonce != nonce:
            return None  # stale: an answer to a response Envoy has since been sent again
        now = self._plane.clock()
        if request.HasField("error_detail"):
            # The configuration version the rejected type was last sent with (a
            # sidecar's type has a version of its own; the status shows the whole's).
            version = compiled.version
            self._plane.registry.nacked(
                stream.identity, stream.applied, version, request.error_detail.message, now
            )
            log.warning(
                "%s NACKed its configuration",
                stream.role,
                extra={
                    "cluster": stream.identity.cluster,
                    "instance": stream.identity.instance,
                    "type": type_url.rpartition(".")[2],
                    "version": version,
                    "error": request.error_detail.message[:500],
                },
            )
        else:
            stream.acked[type_url] = request.version_info
            # Every type of the current version accepted (also after a NACK of
            # a version since replaced by this one): applied.
            if stream.all_acked(compiled):
                stream.applied = compiled.version
                self._plane.registry.acked(stream.identity, compiled.version, now)
        if names != stream.subscribed.get(type_url, ()):  # Envoy now wants other routes
            stream.subscribe(type_url, names)
            return self._response(stream, compiled, type_url)
        return None

    async def StreamAggregatedResources(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest],
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> AsyncIterator[bytes]:
        """Responses go out serialized already (:mod:`mgmt_api.distribution.wire`)."""
        requests = aiter(request_iterator)
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            return
        node, identity, grant = await self._admit(first, context)
        stream = _Stream(identity, node)
        admitted = Admitted(identity, grant, context)
        if isinstance(node, SidecarNode):
            assert self._sidecars is not None  # _admit refuses sidecars otherwise
            try:
                handle = await self._sidecars.join(node, grant)
            except DirectoryFull as exc:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            try:
                async with contextlib.aclosing(
                    self._sidecar_responses(stream, node, admitted, requests, first)
                ) as responses:
                    async for response in responses:
                        yield response
            finally:
                self._sidecars.leave(handle)
            return
        responses = follow(
            self._plane,
            admitted,
            requests,
            version="",
            build=functools.partial(self._compile, stream, node),
            on_build=functools.partial(self._built, stream),
            on_request=functools.partial(self._requested, stream),
            queued=(first,),
        )
        async with contextlib.aclosing(responses):
            async for response in responses:
                yield response

    async def _sidecar_responses(
        self,
        stream: _Stream,
        node: SidecarNode,
        admitted: Admitted,
        requests: AsyncIterator[discovery_pb2.DiscoveryRequest],
        first: discovery_pb2.DiscoveryRequest,
    ) -> AsyncGenerator[bytes, None]:
        """A sidecar's stream: its first build, then what its inbox brings, in order.

        Unlike a gateway's (:func:`~mgmt_api.distribution.streams.follow`), it
        never wakes on its own: the pusher hands it each new configuration and
        re-checks its credentials for it (:meth:`SidecarStreams.push_forever`),
        so an idle sidecar costs no wake-up, and a change wakes each stream
        once, with what to send. Requests that arrive before the first build
        wait for it; every later one is answered in turn.
        """
        assert self._sidecars is not None
        sidecars, plane = self._sidecars, self._sidecars.plane
        attached = sidecars.attach(admitted, node)
        inbox = attached.inbox
        inbox.put_nowait(first)
        number = connected(plane.registry, admitted.node, "", plane.clock())
        reader = asyncio.create_task(read_requests(requests, inbox))
        revoked: Revocation | None = None
        waiting: list[discovery_pb2.DiscoveryRequest] = []
        try:
            item: object = await fresh(
                sidecars.compile(node, sidecars.feed.revision, None),
                plane.still_admitted,
                admitted.grant,
                admitted.node,
            )
            while True:
                if isinstance(item, Revocation):
                    revoked = item
                    break
                if isinstance(item, Compiled):
                    if stream.compiled is None or item.seq >= stream.compiled.seq:
                        for message in self._built(stream, item) or ():
                            yield message
                elif item is not None:  # a request
                    waiting.append(item)
                if stream.compiled is not None:
                    for request in waiting:
                        for message in self._requested(stream, request):
                            yield message
                    waiting.clear()
                item = await inbox.get()
                if item is None:
                    break  # the client ended the stream
        finally:
            sidecars.detach(attached)
            await cancel(reader)
            ended(plane.registry, admitted.node, plane.clock(), number, revoked)
        if revoked is not None:
            await refuse(admitted.context, admitted.node, revoked)

    def _built(self, stream: _Stream, latest: Compiled | None) -> Sequence[bytes] | None:
        """Every subscribed type again when the version changed, clusters first.

        None while nothing has compiled yet (the first build failed): requests
        wait until a build succeeds. A later failed build keeps what was sent.
        """
        self._plane.registry.heartbeat(stream.identity, self._plane.clock())
        before = stream.compiled
        if latest is None or (
            before is not None
            and latest.version == before.version
            and latest.serial == before.serial
        ):
            return None if before is None else ()
        stream.compiled = latest
        if before is None or latest.version != before.version:
            self._plane.registry.sent(stream.identity, latest.version, self._plane.clock())
        # Only the types whose resources changed, in the order of stream.types: a
        # join or leave sends the changed service's endpoints alone, a CA rotation
        # the secret. With new clusters, the endpoints of every cluster that is new
        # or changed too (Envoy warms such a cluster until its assignment comes),
        # changed or not; an unchanged cluster keeps the assignment it has.
        sends = []
        for type_url in stream.types:
            if type_url not in stream.subscribed:
                continue
            changed = before is None or latest.type_version(type_url) != before.type_version(
                type_url
            )
            if type_url == sidecar_xds.ENDPOINT_TYPE and before is not None:
                warming = self._diffs.names(before, latest, gateway_xds.CLUSTER_TYPE)
                if changed or warming:
                    sends.append(
                        self._response(stream, latest, type_url, since=before, also=warming)
                    )
            elif (
                changed
                and type_url == gateway_xds.ROUTE_TYPE
                and before is not None
                and stream.role == "sidecar"
            ):
                # Routes are asked for by name: the ones that did not change are kept,
                # and when none did, nothing is sent (the routes keep their version).
                if not self._diffs.changed(
                    before.resources.get(type_url, ()), latest.resources.get(type_url, ())
                ):
                    latest.versions[type_url] = before.type_version(type_url)  # its own
                else:
                    sends.append(self._response(stream, latest, type_url, since=before))
            elif changed:
                sends.append(self._response(stream, latest, type_url))
        if not sends and stream.all_acked(latest):
            # Nothing this Envoy holds changed: it already runs the new version.
            stream.applied = latest.version
            self._plane.registry.acked(stream.identity, latest.version, self._plane.clock())
        return sends

    def _requested(
        self, stream: _Stream, request: discovery_pb2.DiscoveryRequest
    ) -> Sequence[bytes]:
        assert stream.compiled is not None  # requests wait for the first build
        response = self._answer(stream, stream.compiled, request)
        return () if response is None else (response,)

    async def _compile(self, stream: _Stream, node: GatewayNode, revision: int) -> Compiled | None:
        """This gateway's resources at ``revision``; None when they cannot be compiled.

        A stored object the compiler or Envoy's protos refuse (written around
        the API's validation) must not reach the gateway: it keeps what it has,
        and the status shows the compile error.
        """
        try:
            inp = await self._builds.get((node.organization, node.cluster), revision)
            version, previous = inp.version(), stream.compiled
            if previous is not None and previous.version == version:
                return previous  # nothing changed: nothing rebuilt
            return await asyncio.to_thread(compile_for, inp, node)
        except UnknownCluster:
            raise
        except Exception:
            log.exception(
                "cannot compile the gateway's configuration",
                extra={"cluster": node.cluster, "instance": node.instance},
            )
            return None
