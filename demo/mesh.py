"""The demo's mesh half: two workloads, each behind a sidecar Envoy, in two namespaces.

``scripts/run`` starts, for each :data:`WORKLOADS` entry, the demo app
(:mod:`demo.upstream` with ``--name``) on its own loopback port and
its sidecar through the pod-local sidecar agent (``meshplane-sidecar-agent``),
exactly as in a pod: the agent holds the workload's token, makes its key, has
its certificate signed, relays ADS, and starts the sidecar Envoy (admin on a
Unix socket). Outside Kubernetes the token is a JWT of a projected token's
shape, minted by the demo's own issuer (its public JWKS registered on the
demo cluster, ``workloadIdentity.issuers``), and the cluster agent's static
file lists the demo pods (:func:`pod_entry`) so mgmt-api can check the token's
pod against the inventory. The tour then plays the app: it sends a request to a
workload's *outbound* listener with the callee's service name as ``Host``
(``payments.billing``), which is what the app's own HTTP client would do.

Pure: ports, pods and token claims; the processes are started by
:class:`demo.stack.Stack`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from meshplane.workload_contract import TOKEN_AUDIENCE

#: The issuer URL of the demo's workload tokens (``iss``).
DEMO_TOKEN_ISSUER = "https://workloads.demo.meshplane.local"  # noqa: S105 - a URL
#: Lifetime of a demo workload token; the stack rewrites each before half of it passed.
DEMO_TOKEN_TTL_SECONDS = 3600


class MeshPorts(Protocol):
    """The part of :class:`demo.stack.Ports` a workload reads (the rest by name)."""

    @property
    def host(self) -> str: ...


@dataclass(frozen=True)
class DemoWorkload:
    """One demo workload: its identity and the prefix of its four ports' field names."""

    name: str
    namespace: str
    service_account: str

    @property
    def instance(self) -> str:
        """The sidecar's node id, as the cluster status lists it."""
        return f"{self.namespace}-{self.name}"

    @property
    def host(self) -> str:
        """The name other workloads call it by (``SERVICE.NAMESPACE``)."""
        return f"{self.name}.{self.namespace}"

    @property
    def pod_uid(self) -> str:
        """The demo pod's uid: stable, so a restarted demo's pods are the same pods."""
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"meshplane-demo/{self.instance}"))

    def port(self, ports: object, role: str) -> int:
        """``role`` is ``app``, ``inbound`` or ``outbound``."""
        value = getattr(ports, f"{self.name}_{role}")
        assert isinstance(value, int)
        return value


#: The workloads of the tour: a caller in ``shop`` and a callee in ``billing``.
WORKLOADS = (
    DemoWorkload("web", "shop", "web"),
    DemoWorkload("payments", "billing", "payments"),
)

#: The three ports of each workload: (field suffix, what it is for). The sidecar's
#: Envoy admin is a Unix socket in its agent's directory, never a port.
WORKLOAD_PORTS = (
    ("app", "the app on loopback"),
    ("inbound", "its sidecar's inbound listener (mTLS from other sidecars)"),
    ("outbound", "its sidecar's outbound listener (the app's calls)"),
)


def pod_entry(w: DemoWorkload, ip: str) -> dict[str, Any]:
    """The workload as the cluster agent's static file lists it (``pods:``)."""
    return {
        "namespace": w.namespace,
        "name": w.instance,
        "uid": w.pod_uid,
        "serviceAccount": w.service_account,
        "ip": ip,
        "services": [w.name],
    }


def token_claims(w: DemoWorkload, now: float) -> dict[str, Any]:
    """A projected service-account token's claims for ``w``'s pod, valid from ``now``."""
    issued = int(now)
    return {
        "iss": DEMO_TOKEN_ISSUER,
        "aud": [TOKEN_AUDIENCE],
        "sub": f"system:serviceaccount:{w.namespace}:{w.service_account}",
        "iat": issued,
        "nbf": issued,
        "exp": issued + DEMO_TOKEN_TTL_SECONDS,
        "kubernetes.io": {
            "namespace": w.namespace,
            "pod": {"name": w.instance, "uid": w.pod_uid},
            "serviceaccount": {
                "name": w.service_account,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"meshplane-demo/{w.namespace}/sa")),
            },
        },
    }
