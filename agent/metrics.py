"""The agent's Prometheus metrics, in a registry of its own.

The agent is one process (no workers), so the multiprocess machinery of
:mod:`meshplane.metrics` is not needed; its own registry also lets tests
run several agents in one interpreter without mixing their numbers.

Every series of a closed label set (operations, the call codes the tunnel
records, inventory results, a successful connect) exists at 0 from the start
(:meth:`AgentMetrics.register_zeros`), so ``rate()`` counts the first event.
Failed connects are labelled with whatever gRPC code the channel gave, an
open set, so they appear with their first occurrence.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agent.contract import StatusCode
from meshplane.proto.tunnel.v1 import tunnel_pb2 as pb

#: The diagnostics operations: the ``operation`` oneof of a tunnel Call.
OPERATIONS: tuple[str, ...] = tuple(
    f.name for f in pb.Call.DESCRIPTOR.oneofs_by_name["operation"].fields
)
#: The codes agent.tunnel records for a call (busy, done, cancelled, crashed).
CALL_CODES: tuple[str, ...] = tuple(
    c.name
    for c in (
        StatusCode.OK,
        StatusCode.CANCELLED,
        StatusCode.INTERNAL,
        StatusCode.RESOURCE_EXHAUSTED,
    )
)


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.connected = Gauge(
            "meshplane_agent_tunnel_connected",
            "1 while the tunnel to the management plane is up.",
            registry=self.registry,
        )
        self.connects = Counter(
            "meshplane_agent_tunnel_connects",
            "Tunnel connection attempts, by result (ok, or the gRPC code).",
            ["result"],
            registry=self.registry,
        )
        self.calls = Counter(
            "meshplane_agent_calls",
            "Diagnostics calls answered, by operation and gRPC code.",
            ["operation", "code"],
            registry=self.registry,
        )
        self.active = Gauge(
            "meshplane_agent_active_calls",
            "Diagnostics calls in progress (log streams included), by operation.",
            ["operation"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "meshplane_agent_call_duration_seconds",
            "Time from a call's arrival to its last reply, by operation (log streams excluded).",
            ["operation"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.proxies = Gauge(
            "meshplane_agent_proxies",
            "Proxies discovery knows now.",
            registry=self.registry,
        )
        self.certificate_expiry = Gauge(
            "meshplane_agent_certificate_expiry_timestamp_seconds",
            "notAfter of the agent's mesh certificate (0: none; --workload-token).",
            registry=self.registry,
        )
        self.sign_failures = Counter(
            "meshplane_agent_sign_failures",
            "Sign calls for the agent's mesh certificate that failed.",
            registry=self.registry,
        )
        self.inventory = Counter(
            "meshplane_agent_inventory_reports",
            "Inventory reports sent, by result (ok, error).",
            ["result"],
            registry=self.registry,
        )

        self.register_zeros()

    def register_zeros(self) -> None:
        """Create the closed label sets' series at 0 (see the module docstring)."""
        self.connects.labels("ok")
        for result in ("ok", "error"):
            self.inventory.labels(result)
        for operation in OPERATIONS:
            self.active.labels(operation)
            if operation != "stream_logs":  # log streams are not timed
                self.duration.labels(operation)
            for code in CALL_CODES:
                self.calls.labels(operation, code)

    def render(self) -> bytes:
        return generate_latest(self.registry)
