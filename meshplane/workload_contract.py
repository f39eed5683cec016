"""A workload's contract with the management plane: its credential, its sockets, its secrets.

The trust model (docs/mesh.md, "Trust model"):

- A sidecar proves who it is with its pod's own **projected service-account
  token** (audience :data:`TOKEN_AUDIENCE`, short-lived, rotated by the
  kubelet), never with a credential shared by the cluster. The management
  plane verifies it against the cluster's service-account issuer and the pod
  inventory the cluster agent reports; the namespace and service account of
  the workload come from that verified token, never from Envoy's node
  metadata.
- A **pod-local sidecar agent** holds that token, generates the workload's
  private key (which never leaves the pod), has it signed through
  ``meshplane.workload.v1.WorkloadCertificates/Sign`` and serves Envoy over
  Unix sockets in the pod: SDS for the workload certificate
  (:data:`SVID_SECRET`, cluster :data:`SDS_CLUSTER`) and ADS, which it relays
  to mgmt-api with the token attached. Envoy's bootstrap holds no bearer
  token, and its admin API listens on a Unix socket.

This module holds only the names and shapes both sides share; nothing here
imports a server package.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

#: The audience a workload token must carry (the projected token's ``audience``).
TOKEN_AUDIENCE = "meshplane"  # noqa: S105 - an audience, not a secret
#: Where the injector mounts the projected token in the sidecar container.
DEFAULT_TOKEN_PATH = PurePosixPath("/var/run/secrets/meshplane.io/token")
#: The pod-local directory (an emptyDir shared by the agent and Envoy only) of the sockets.
DEFAULT_SOCKET_DIR = PurePosixPath("/var/run/meshplane")
#: Socket file names in that directory.
XDS_SOCKET = "xds.sock"
SDS_SOCKET = "sds.sock"
ADMIN_SOCKET = "admin.sock"
#: The bootstrap's static cluster that reaches the agent's SDS server.
SDS_CLUSTER = "meshplane_sds"
#: SDS secret names: the workload certificate and key (served by the pod-local
#: agent), and the cluster's trust bundle (served by mgmt-api over ADS).
#: Suffix of the trust domain a cluster without ``trustDomain`` gets.
DEFAULT_TRUST_DOMAIN_SUFFIX = "mesh.local"
SVID_SECRET = "svid"  # noqa: S105 - a name, not a secret
CA_SECRET = "mesh-ca"  # noqa: S105 - a name, not a secret


class WorkloadTokenError(ValueError):
    """A workload token's claims do not name a pod (the message says which claim)."""


@dataclass(frozen=True)
class WorkloadClaims:
    """What a verified projected service-account token says about its pod."""

    issuer: str
    namespace: str
    service_account: str
    pod_name: str
    pod_uid: str
    expires: float


def claims_of(payload: dict[str, Any]) -> WorkloadClaims:
    """The :class:`WorkloadClaims` of a token's (already verified) payload.

    Kubernetes' projected tokens carry ``sub``
    ``system:serviceaccount:<namespace>:<name>`` and a ``kubernetes.io`` claim
    with the namespace, the pod (name, uid) and the service account; both
    must agree. A token without a pod claim (a legacy or a TokenRequest
    token not bound to a pod) is refused: a workload is a pod.
    """
    kube = payload.get("kubernetes.io")
    if not isinstance(kube, dict):
        raise WorkloadTokenError("the token has no kubernetes.io claim")
    pod = kube.get("pod")
    account = kube.get("serviceaccount")
    if not isinstance(pod, dict) or not isinstance(account, dict):
        raise WorkloadTokenError("the token is not bound to a pod")
    namespace, sa = kube.get("namespace"), account.get("name")
    name, uid = pod.get("name"), pod.get("uid")
    values = (payload.get("iss"), namespace, sa, name, uid)
    if not all(isinstance(v, str) and v for v in values):
        raise WorkloadTokenError("the token's iss, namespace, service account or pod is missing")
    if payload.get("sub") != f"system:serviceaccount:{namespace}:{sa}":
        raise WorkloadTokenError("the token's sub does not match its kubernetes.io claim")
    exp = payload.get("exp")
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        raise WorkloadTokenError("the token has no exp")
    return WorkloadClaims(str(values[0]), str(namespace), str(sa), str(name), str(uid), float(exp))


def default_trust_domain(organization: str, cluster: str) -> str:
    """The trust domain of a cluster whose spec names none: ``CLUSTER.ORG.mesh.local``
    (mgmt-api's mesh CA names it; the cluster agent signs its certificate in it)."""
    return f"{cluster}.{organization}.{DEFAULT_TRUST_DOMAIN_SUFFIX}"
