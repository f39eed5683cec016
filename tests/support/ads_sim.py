"""Simulated sidecar Envoys: ADS clients over real gRPC that subscribe and ACK as Envoy does.

No Envoy runs here: each :class:`SimSidecar` is what a sidecar's Envoy (behind
its pod-local agent, which adds the pod's workload token) says on its ADS
stream: clusters and listeners first, then the trust bundle and the
endpoints (EDS) its clusters name and the routes its listeners name; every
response is ACKed with its version and nonce. They run on one asyncio loop
(thousands per process for the bench, ``bench/mesh/``); :class:`SimLoop`
runs that loop on a thread for tests that drive it from plain code.

:class:`MeshCluster` is a cluster created over REST whose agent reports the
pods (with their IPs and services) and the issuer their tokens are minted
with (:class:`tests.support.workload_tokens.TestIssuer`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import httpx
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import json_format, struct_pb2

from meshplane.aio import wait_event
from meshplane.sidecar_contract import SidecarNode
from mgmt_api.compiler import gateway_xds, sidecar_xds
from tests.mgmt_api.agents import agent, create_cluster
from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.workload_tokens import PodRef, TestIssuer

T = TypeVar("T")
CLUSTER, LISTENER = gateway_xds.CLUSTER_TYPE, gateway_xds.LISTENER_TYPE
ROUTE, SECRET = gateway_xds.ROUTE_TYPE, gateway_xds.SECRET_TYPE
ENDPOINT = sidecar_xds.ENDPOINT_TYPE
ROUTES = ("inbound", "outbound")
CA = "mesh-ca"


class MeshCluster:
    """A cluster created over REST, its agent, and the pods it reports."""

    def __init__(self, server: MgmtServer, admin: httpx.Client, org: str, name: str) -> None:
        self.server, self.org, self.name = server, org, name
        self.created = create_cluster(admin, org, name)
        self.fqn = self.created["fqn"]

    def report(self, issuer: TestIssuer, pods: list[PodRef]) -> None:
        namespaces: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            namespaces.setdefault(pod.namespace, []).append(pod.report())
        body = {
            "namespaces": [{"name": ns, "pods": items} for ns, items in sorted(namespaces.items())],
            "state": {"provider": "kubernetes", "serviceAccountIssuer": issuer.registration()},
        }
        with agent(self.server, self.created) as client:
            ok(client.put(f"/v2/{self.fqn}/inventory", json=body))


@dataclass
class SimSidecar:
    """One simulated sidecar Envoy's ADS stream (see the module docstring)."""

    node: SidecarNode
    token: str
    #: type → version last ACKed
    acked: dict[str, str] = field(default_factory=dict)
    #: type → when its last response was ACKed (time.monotonic)
    acked_at: dict[str, float] = field(default_factory=dict)
    #: EDS cluster name → [port] of its endpoints (what EDS sent, incrementally)
    endpoints: dict[str, list[int]] = field(default_factory=dict)
    eds: tuple[str, ...] = ()  # the EDS clusters subscribed to
    #: configuration version → when it was last reached, ACKed on every type
    #: (time.monotonic; a version reached again, as a leave undoes a join, anew)
    converged_at: dict[str, float] = field(default_factory=dict)
    _running: str = ""
    error: str = ""
    parse_clusters: bool = True
    _call: Any = None
    _outbox: asyncio.Queue[discovery_pb2.DiscoveryRequest | None] = field(
        default_factory=asyncio.Queue
    )
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def _request(self, type_url: str, names: tuple[str, ...] = ()) -> None:
        self._outbox.put_nowait(
            discovery_pb2.DiscoveryRequest(type_url=type_url, resource_names=list(names))
        )

    async def _requests(self) -> Any:
        metadata = struct_pb2.Struct()
        json_format.ParseDict(self.node.metadata(), metadata)
        first = True
        while (request := await self._outbox.get()) is not None:
            if first:
                request.node.CopyFrom(
                    base_pb2.Node(
                        id=self.node.instance, cluster=self.node.node_cluster, metadata=metadata
                    )
                )
                first = False
            yield request

    @property
    def version(self) -> str:
        """What the sidecar runs, once every type is ACKed: every type's version (a
        type keeps its version while its resources do not change: a policy change
        moves the listeners' and routes', a join or leave the endpoints')."""
        if len(self.acked) != 5:
            return ""
        return "|".join(self.acked[t] for t in (SECRET, CLUSTER, ENDPOINT, LISTENER, ROUTE))

    async def run(self, channel: grpc.aio.Channel) -> None:
        """Stream until closed (:meth:`close`) or refused (``error``)."""
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        self._request(CLUSTER)
        self._request(LISTENER)
        self._call = stub.StreamAggregatedResources(
            self._requests(), metadata=(("authorization", f"Bearer {self.token}"),)
        )
        try:
            async for response in self._call:
                self._received(response)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.error = f"{exc.code().name}: {exc.details()}"
        finally:
            self._outbox.put_nowait(None)  # ends the request generator
            self._changed.set()

    def _received(self, response: discovery_pb2.DiscoveryResponse) -> None:
        type_url = response.type_url
        names: tuple[str, ...] = ()
        if type_url == CLUSTER:
            if SECRET not in self.acked:
                self._request(SECRET, (CA,))
            eds = _eds_names(response) if self.parse_clusters else _eds_names_seen(response)
            if eds != self.eds:  # Envoy asks for the endpoints of its EDS clusters
                self.eds = eds
                self._request(ENDPOINT, eds)
                self.endpoints = {n: v for n, v in self.endpoints.items() if n in eds}
        elif type_url == ENDPOINT and self.parse_clusters:
            self.endpoints.update(_endpoints(response))  # EDS is incremental
        elif type_url == LISTENER and ROUTE not in self.acked:
            self._request(ROUTE, ROUTES)
        if type_url == ROUTE:
            names = ROUTES
        elif type_url == SECRET:
            names = (CA,)
        elif type_url == ENDPOINT:
            names = self.eds
        ack = discovery_pb2.DiscoveryRequest(
            type_url=type_url,
            version_info=response.version_info,
            response_nonce=response.nonce,
            resource_names=list(names),
        )
        self._outbox.put_nowait(ack)
        self.acked[type_url] = response.version_info
        self.acked_at[type_url] = time.monotonic()
        version = self.version
        if version and version != self._running:
            self.converged_at[version] = time.monotonic()
            self._running = version
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, timeout: float) -> None:
        await wait_event(self._changed, timeout)

    def close(self) -> None:
        """End the stream from the client's side (the sidecar went away)."""
        self._outbox.put_nowait(None)
        if self._call is not None:
            self._call.cancel()


def _eds_names(response: discovery_pb2.DiscoveryResponse) -> tuple[str, ...]:
    names = []
    for packed in response.resources:
        cluster = cluster_pb2.Cluster()
        packed.Unpack(cluster)
        if cluster.type == cluster_pb2.Cluster.EDS:
            names.append(cluster.name)
    return tuple(sorted(names))


_EDS_SEEN: dict[tuple[str, int], tuple[str, ...]] = {}


def _eds_names_seen(response: discovery_pb2.DiscoveryResponse) -> tuple[str, ...]:
    """:func:`_eds_names`, parsed once per cluster version for the sidecars that do not
    parse (``parse_clusters``): thousands of simulated Envoys in one process would
    otherwise spend the bench's CPU unpacking the same clusters. Envoy's versions
    are opaque; mgmt-api's are digests of what the clusters are made from, and
    the parsing sidecars check what they carry."""
    key = (response.version_info, len(response.resources))
    names = _EDS_SEEN.get(key)
    if names is None:
        names = _EDS_SEEN[key] = _eds_names(response)
    return names


def _endpoints(response: discovery_pb2.DiscoveryResponse) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for packed in response.resources:
        assignment = endpoint_pb2.ClusterLoadAssignment()
        packed.Unpack(assignment)
        out[assignment.cluster_name] = sorted(
            lb.endpoint.address.socket_address.port_value
            for group in assignment.endpoints
            for lb in group.lb_endpoints
        )
    return out


def sidecar(
    org: str, cluster: str, pod: PodRef, inbound_port: int, issuer: TestIssuer
) -> SimSidecar:
    """A simulated sidecar of ``pod`` (its first service), with the pod's token."""
    node = SidecarNode(
        org, cluster, f"{pod.name}.{pod.namespace}", pod.namespace, pod.service_account,
        pod.services[0], 8080, pod.ip, inbound_port,
    )  # fmt: skip
    return SimSidecar(node, issuer.token(pod, ttl=7200))


class SimLoop:
    """An asyncio loop on a thread, for tests that drive simulated sidecars from plain code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._tasks: list[asyncio.Task[None]] = []

    def call(self, factory: Callable[[], Coroutine[Any, Any, T]], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(factory(), self.loop).result(timeout)

    def start(self, sim: SimSidecar, grpc_port: int) -> SimSidecar:
        """Open ``sim``'s stream to mgmt-api at ``grpc_port`` (its own channel)."""

        async def run() -> None:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                await sim.run(channel)

        async def spawn() -> asyncio.Task[None]:
            return asyncio.create_task(run())

        self._tasks.append(self.call(spawn))
        return sim

    def stop(self, sim: SimSidecar) -> None:
        self.loop.call_soon_threadsafe(sim.close)

    def close(self) -> None:
        async def cancel_all() -> None:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            # What gRPC started for the streams (their request readers) too.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        self.call(cancel_all)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


async def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` on the loop until true, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)
