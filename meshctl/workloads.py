"""``meshctl get workloads``: a cluster's sidecars as ``GET .../clusters/{c}/workloads`` shows them.

One row per sidecar: its namespace, service and SPIFFE identity, when its
certificate expires, the authorization mode and who may call it (read off
the rules its sidecar enforces), its configuration state (ACK, NACK, ...,
the words ``meshctl status`` uses) and the replica holding its stream.
``-o json``/``-o yaml`` print the server's view as it is, trust domain and
mesh namespaces included.

Imported only when ``get workloads`` runs, so ``meshctl get`` of other kinds
never loads it (nor :mod:`meshctl.status`, whose state words it reuses).
Pure parts (:func:`rows`, :func:`render_table`) take the view and the clock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import yaml

from meshctl.client import ApiClient
from meshctl.errors import ApiFailure, Exit, MeshctlError
from meshctl.kinds import parse_fqn
from meshctl.ops import refine
from meshctl.output import age, table
from meshctl.status import instance_state

HEADERS = (
    "NAMESPACE", "SERVICE", "IDENTITY", "CERT EXPIRES", "MODE", "CALLERS", "CONFIG", "REPLICA",
)  # fmt: skip


def until(stamp: Any, now: datetime) -> str:
    """RFC 3339 time ahead -> ``in 23h`` (``expired 5m ago`` once past; ``-`` unknown)."""
    if not isinstance(stamp, str):
        return "-"
    try:
        then = datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return "-"
    if then <= now:
        return f"expired {age(stamp, now)} ago"
    return f"in {age(now.isoformat(), then)}"


def callers(authorization: Mapping[str, Any]) -> str:
    """Who may call: ``anyone (no setting)``, ``anyone (mode UNSET)``, ``nobody``, or the
    SPIFFE ids and prefixes the mode admits."""
    principals = authorization.get("principals")
    if principals is None:
        mode = authorization.get("mode")
        return f"anyone (mode {mode})" if mode else "anyone (no setting)"
    return ", ".join(str(p) for p in principals) or "nobody"


def rows(view: Mapping[str, Any], now: datetime) -> list[list[str]]:
    out = []
    for w in view.get("workloads") or []:
        certificate = w.get("certificate") or {}
        config = w.get("config")
        authorization = w.get("authorization") or {}
        out.append(
            [
                str(w.get("namespace", "")),
                str(w.get("service", "")),
                str(w.get("spiffeId", "")),
                until(certificate.get("notAfter"), now),
                str(authorization.get("mode") or "-"),
                callers(authorization),
                instance_state(config) if config else "-",
                str(w.get("replica", "")),
            ]
        )
    return out


def render_table(view: Mapping[str, Any], now: datetime) -> str:
    found = rows(view, now)
    out = f"Trust domain: {view.get('trustDomain', '-')}\n"
    namespaces = [str(n.get("name")) for n in view.get("namespaces") or []]
    out += f"Mesh namespaces: {', '.join(namespaces) or 'none'}\n"
    out += table(found, HEADERS) if found else "No sidecar is connected.\n"
    return out


def render(view: Mapping[str, Any], fmt: str, now: datetime) -> str:
    if fmt == "json":
        return json.dumps(view, indent=2) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(dict(view), sort_keys=False)
    return render_table(view, now)


def fetch(client: ApiClient, organization: str, cluster: str) -> dict[str, Any]:
    ref = parse_fqn(f"organizations/{organization}/clusters/{cluster}")
    try:
        view: dict[str, Any] = client.get(ref.path + "/workloads")
    except ApiFailure as exc:
        raise refine(exc, ref) from None
    return view


def names(organization: str | None, cluster: str | None) -> tuple[str, str]:
    """(organization, cluster) from ``--org``/the profile and ``--cluster`` (or ``ORG/CLUSTER``)."""
    if cluster and "/" in cluster:
        organization, _, cluster = cluster.partition("/")
    if not organization or not cluster:
        raise MeshctlError(
            "meshctl get workloads needs --cluster (ORG/CLUSTER, or CLUSTER with --org "
            "or the profile's organization)",
            Exit.USAGE,
        )
    return organization, cluster


def show(client: ApiClient, organization: str, cluster: str, fmt: str) -> str:
    """What ``meshctl get workloads`` prints."""
    return render(fetch(client, organization, cluster), fmt, datetime.now(UTC))
