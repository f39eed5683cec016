"""Namespace selectors (``cluster/namespace`` patterns) and registered-service views.

One matcher serves the service lookup, the cleanup of security groups that
select nothing, and anything else that asks "does this selector reach that
namespace": ``*`` matches a whole segment, and a trailing ``*`` on the
namespace matches by prefix (``c1/shop*``). The grammar is the reference's
``^(\\*|[^/*]+)/(\\*|[^/*]+\\*?)$``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from mgmt_api.errors import invalid

SELECTOR_PATTERN = re.compile(r"^(\*|[^/*]+)/(\*|[^/*]+\*?)$")
SELECTOR_HINT = "cluster/namespace ('*' for a segment, trailing '*' on the namespace)"


def validate_names(names: Sequence[str], field: str) -> None:
    """400 naming ``field[i]`` for the first name that is not a selector pattern."""
    for i, name in enumerate(names):
        if not SELECTOR_PATTERN.match(name):
            raise invalid(f"{field}[{i}]", f"{name!r} is not {SELECTOR_HINT}")


def matches(pattern: str, cluster: str, namespace: str) -> bool:
    """Whether one (valid) pattern selects ``namespace`` of ``cluster``."""
    want_cluster, _, want_ns = pattern.partition("/")
    if want_cluster not in ("*", cluster):
        return False
    if want_ns == "*":
        return True
    if want_ns.endswith("*"):
        return namespace.startswith(want_ns[:-1])
    return namespace == want_ns


def selects(names: Iterable[str], cluster: str, namespace: str) -> bool:
    return any(matches(p, cluster, namespace) for p in names)


def cluster_segments(names: Iterable[str]) -> list[str] | None:
    """The cluster names the (valid) patterns can reach; None when one says ``*``.

    Lets a caller skip, without reading them, clusters no pattern names.
    """
    clusters = [p.partition("/")[0] for p in names]
    return None if "*" in clusters else sorted(set(clusters))


ServiceKey = tuple[str, str, str]  # (cluster FQN, namespace, service name)


def service_fqn(key: ServiceKey) -> str:
    cluster, namespace, name = key
    return f"{cluster}/namespaces/{namespace}/services/{name}"


def service_key(fqn: str, organization: str, field: str) -> ServiceKey:
    """The sort key of a RegisteredService FQN of ``organization`` (a page token's content).

    Lookup results are ordered by this tuple, not by the FQN string: the
    string order of ``east/...`` and ``east-2/...`` differs from the order of
    the clusters themselves.
    """
    parts = fqn.rsplit("/", 4)
    prefix = f"{organization}/clusters/"
    if (
        len(parts) != 5
        or parts[1] != "namespaces"
        or parts[3] != "services"
        or not parts[0].startswith(prefix)
        or "/" in parts[0][len(prefix) :]
    ):
        raise invalid(field, "is not a token this server issued for this lookup")
    return parts[0], parts[2], parts[4]


def service_type(service: dict[str, Any]) -> str:
    """INTERNAL, LOADBALANCER (it has external addresses) or MESH_EXTERNAL."""
    if service.get("meshExternal"):
        return "MESH_EXTERNAL"
    if service.get("kubernetesExternalAddresses"):
        return "LOADBALANCER"
    return "INTERNAL"


def registered_service(cluster_fqn: str, namespace: str, service: dict[str, Any]) -> dict[str, Any]:
    """The RegisteredService view (docs/api.md, "Service lookup") of one reported service.

    ``fqn`` identifies the reported service (``{cluster}/namespaces/{ns}/services/{name}``);
    it is not a REST object of its own: services are read-only agent data.
    """
    name = str(service["name"])
    hostname = (
        service.get("hostname")
        or service.get("kubernetesServiceFqdn")
        or f"{name}.{namespace}.svc.cluster.local"
    )
    view: dict[str, Any] = {
        "fqn": f"{cluster_fqn}/namespaces/{namespace}/services/{name}",
        "cluster": cluster_fqn,
        "namespace": namespace,
        "shortName": name,
        "hostnames": [hostname],
        "ports": [
            {k: p[k] for k in ("number", "name") if k in p} for p in service.get("ports") or []
        ],
        "serviceType": service_type(service),
        "externalAddresses": list(service.get("kubernetesExternalAddresses") or []),
        "state": str(service.get("state") or "OBSERVED").upper(),
        "spiffeIds": list(service.get("spiffeIds") or []),
    }
    if service.get("canonicalName"):
        view["canonicalName"] = service["canonicalName"]
    return view
