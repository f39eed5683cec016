"""Seed a demo organization, cluster and policies through the REST API.

Data-driven and safe to re-run, so ``scripts/run`` (and a compose seed step)
runs it on every start: :func:`demo_plan` describes the objects, :func:`seed`
creates what is missing and leaves what exists as it is (a user's edit to a
seeded object survives a restart), and writes each cluster component's key (agent,
gateway, extauthz, ratelimit: :func:`credential_files`) for its own
``--credentials``. Everything goes through the public REST API,
as an admin would, so the demo exercises the same validation and
distribution paths as production writes.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from demo import mesh
from mgmt_api.compiler.extauthz import policy_name
from mgmt_api.compiler.http_route import ENVOY_GATEWAY_GROUP
from mgmt_api.compiler.key_material import redact
from mgmt_api.compiler.ratelimit import domain_of, route_rate_limits
from mgmt_api.compiler.traffic_policy import BackendTrafficPolicy
from mgmt_api.domain import cluster_accounts

# A demo secret, printed in the README's commands: never reuse it.
DEMO_HMAC_SECRET = "meshplane-demo-hmac-secret-do-not-use"  # noqa: S105


#: The demo Backend (namespace ``default``) the demo routes send to.
DEMO_BACKEND = "demo"
#: The demo cluster's circuit breakers, small on purpose: the gateway allows 2
#: connections and 2 queued requests to an upstream, so 20 concurrent calls
#: to the demo upstream's ``/slow`` overflow them and some are answered 503
#: at once (spec 4.10.7), where the rate limit would answer 429.
DEMO_CIRCUIT_BREAKERS: Mapping[str, int] = {
    "maxConnections": 2,
    "maxPendingRequests": 2,
    "maxRequests": 2,
    "maxRetries": 1,
}
#: The demo cluster's tracing: its Envoys start a W3C trace for every request
#: (so each decision line names one) and send the spans to an OTLP/gRPC
#: collector on the standard port, if one listens there.
DEMO_TRACING: Mapping[str, Any] = {
    "collector": "grpc://127.0.0.1:4317",
    "samplingPercentage": 100,
}


class SeedError(RuntimeError):
    """The server refused a seed write (the message carries its answer)."""


@dataclass(frozen=True)
class Resource:
    """One REST object: POSTed to ``collection`` as ``{name, <field>: spec}``."""

    collection: str  # e.g. /v2/organizations/demo/clusters
    name: str
    field: str  # the body field of the kind, e.g. "backendTrafficPolicy"
    spec: Mapping[str, Any]
    update: bool = True  # the demo owns the spec: bring it to the plan while untouched

    @property
    def path(self) -> str:
        return f"{self.collection}/{self.name}"


@dataclass(frozen=True)
class DemoPlan:
    """What the demo consists of, and what the printed commands need to know."""

    organization: str
    cluster: str
    resources: tuple[Resource, ...]
    hmac_secret: str
    extauthz_policy: str  # the ``meshplane.policy`` context extension value
    rate_limit_domain: str
    rate_limit_descriptors: tuple[tuple[tuple[str, str], ...], ...]
    limit: str  # e.g. "3/Minute"
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def cluster_path(self) -> str:
        return f"/v2/organizations/{self.organization}/clusters/{self.cluster}"


def _envoy_descriptors(
    cluster: str, policy: BackendTrafficPolicy
) -> tuple[tuple[tuple[str, str], ...], ...]:
    """The descriptors Envoy sends for the policy's route when no header
    selector applies: the generic-key actions of :func:`route_rate_limits`."""
    out = []
    for rate_limit in route_rate_limits(cluster, policy)["rateLimits"]:
        entries = []
        for action in rate_limit["actions"]:
            generic = action.get("genericKey")
            if generic is None:
                raise ValueError("the demo descriptor only covers generic-key actions")
            entries.append((generic["descriptorKey"], generic["descriptorValue"]))
        out.append(tuple(entries))
    return tuple(out)


def demo_plan(
    *,
    organization: str = "demo",
    cluster: str = "demo",
    extauthz_uri: str = "grpc://127.0.0.1:9191",
    requests: int = 3,
    unit: str = "Minute",
    hmac_secret: str = DEMO_HMAC_SECRET,
    cluster_rate_limit: Mapping[str, Any] | None = None,
    upstream: Mapping[str, Any] | None = None,
    workload_issuers: Sequence[Mapping[str, Any]] = (),
) -> DemoPlan:
    """The demo: a cluster with a ``requests``/``unit`` limit on route ``web``,
    and a JWT policy (HS256 ``hmac_secret``, path claim) selected by a
    SecuritySetting whose ext_authz server is ``extauthz_uri``.

    The cluster's gateways route to the demo upstream (Backend
    ``default.demo``, the endpoint ``upstream``: ``{"ip": {address, port}}`` or
    ``{"fqdn": {hostname, port}}``): HTTPRoute ``default.web`` takes every path
    and is the one the limit targets; HTTPRoute ``default.slow`` takes
    ``/slow`` (the longer prefix wins, as in the Gateway API) and is not
    limited, so a burst of slow calls meets the cluster's circuit breakers
    (:data:`DEMO_CIRCUIT_BREAKERS`, 503) rather than the limit (429). Both
    routes are in namespace ``default``, which the security group selects
    (every namespace of the cluster), so ext_authz checks both.
    ``workload_issuers`` (public JWKS only) sign the mesh workloads' tokens.
    """
    org = f"/v2/organizations/{organization}"
    traffic = _traffic_spec(requests, unit)
    policy = BackendTrafficPolicy.model_validate(
        {
            "apiVersion": "gateway.envoyproxy.io/v1alpha1",
            "kind": "BackendTrafficPolicy",
            "metadata": {"namespace": "default", "name": "web-limit"},
            "spec": traffic,
        }
    )
    cluster_spec = {
        "rateLimit": dict(cluster_rate_limit or {"redis": {"disabled": True}}),
        "circuitBreakers": dict(DEMO_CIRCUIT_BREAKERS),
        "tracing": dict(DEMO_TRACING),
    }
    if workload_issuers:
        cluster_spec["workloadIdentity"] = {"issuers": [dict(i) for i in workload_issuers]}
    endpoint = dict(upstream or {"ip": {"address": "127.0.0.1", "port": 8000}})
    group = f"{org}/tenants/demo/workspaces/demo/securitygroups/web"
    resources = (
        Resource("/v2/organizations", organization, "organization", {}, update=False),
        *_cluster_resources(org, cluster, cluster_spec, endpoint, traffic),
        *_security_resources(org, cluster, extauthz_uri, hmac_secret),
        *_mesh_security_resources(org, cluster, extauthz_uri, hmac_secret),
    )
    return DemoPlan(
        organization=organization,
        cluster=cluster,
        resources=resources,
        hmac_secret=hmac_secret,
        extauthz_policy=policy_name(group.removeprefix("/v2/"), "jwt"),
        rate_limit_domain=domain_of(cluster, policy),
        rate_limit_descriptors=_envoy_descriptors(cluster, policy),
        limit=f"{requests}/{unit}",
    )


def _traffic_spec(requests: int, unit: str) -> dict[str, Any]:
    """The demo BackendTrafficPolicy's spec: ``requests``/``unit`` on route ``web``."""
    return {
        "targetRef": {"kind": "HTTPRoute", "name": "web"},
        "rateLimit": {
            "type": "Global",
            "global": {"rules": [{"limit": {"requests": requests, "unit": unit}}]},
        },
    }


def _cluster_resources(
    org: str,
    cluster: str,
    cluster_spec: dict[str, Any],
    endpoint: dict[str, Any],
    traffic: dict[str, Any],
) -> tuple[Resource, ...]:
    """The cluster, its demo Backend, the routes ``web`` and ``slow`` to it, and the limit."""
    backend_ref = {"group": ENVOY_GATEWAY_GROUP, "kind": "Backend", "name": DEMO_BACKEND}
    routes = {
        name: {
            "spec": {
                "rules": [
                    {
                        "matches": [{"path": {"type": "PathPrefix", "value": prefix}}],
                        "backendRefs": [backend_ref],
                    }
                ]
            }
        }
        for name, prefix in (("web", "/"), ("slow", "/slow"))
    }
    return (
        Resource(f"{org}/clusters", cluster, "cluster", cluster_spec),
        Resource(
            f"{org}/clusters/{cluster}/backends",
            f"default.{DEMO_BACKEND}",
            "backend",
            {"spec": {"endpoints": [endpoint]}},
        ),
        *(
            Resource(f"{org}/clusters/{cluster}/httproutes", f"default.{name}", "httpRoute", spec)
            for name, spec in routes.items()
        ),
        Resource(
            f"{org}/clusters/{cluster}/backendtrafficpolicies",
            "default.web-limit",
            "backendTrafficPolicy",
            {"spec": traffic},
        ),
    )


#: The path the tour's token grants; the callee's local rule allows exactly it.
MESH_PATH = "/headers"


def _mesh_security_resources(
    org: str, cluster: str, extauthz_uri: str, hmac_secret: str
) -> tuple[Resource, ...]:
    """One security group per demo workload's namespace, each with its setting.

    ``shop`` (the caller ``web``): mode CLUSTER and ext_authz at its sidecar,
    with the gateway's JWT policy. ``billing`` (the callee ``payments``): mode
    CUSTOM admitting only ``shop/web``, and local JWT rules: the sidecar's own
    ``jwt_authn`` verifies the demo token (HS256, the same secret as an inline
    JWKS) and allows GET of :data:`MESH_PATH` to a token whose ``path`` claim
    grants it, with no ext_authz call. Both groups sort before ``web``, whose
    setting selects every namespace, so they are the ones that apply here.
    """
    workspace = f"{org}/tenants/demo/workspaces/demo"
    web, payments = mesh.WORKLOADS
    key = base64.urlsafe_b64encode(hmac_secret.encode()).decode().rstrip("=")
    jwks = {"keys": [{"kty": "oct", "alg": "HS256", "k": key}]}
    granted = base64.b64encode(MESH_PATH.encode()).decode()
    local = {
        "rules": [
            {
                "from": [{"jwt": {"other": {"path": granted}}}],
                "to": [{"paths": [MESH_PATH], "methods": ["GET"]}],
            }
        ],
        "keys": {"jwks": {"value": json.dumps(jwks)}},
    }
    shop = {
        "mode": "CLUSTER",
        "http": {"external": {"uri": extauthz_uri, "policy": "jwt"}},
    }
    billing = {
        "mode": "CUSTOM",
        "serviceAccounts": [f"{web.namespace}/{web.service_account}"],
        "http": {"local": local},
    }
    resources: list[Resource] = []
    for w, authorization in ((web, shop), (payments, billing)):
        group = f"{workspace}/securitygroups/{w.namespace}"
        selector = {"namespaceSelector": {"names": [f"{cluster}/{w.namespace}"]}}
        resources.append(
            Resource(f"{workspace}/securitygroups", w.namespace, "securityGroup", selector)
        )
        if "external" in authorization["http"]:
            resources.append(
                Resource(
                    f"{group}/extauthzpolicies", "jwt", "extAuthzPolicy", _jwt_policy(hmac_secret)
                )
            )
        setting = {"authorization": authorization}
        resources.append(Resource(f"{group}/settings", "default", "securitySetting", setting))
    return tuple(resources)


def _jwt_policy(hmac_secret: str) -> dict[str, Any]:
    """The demo's ExtAuthzPolicy: HS256 with ``hmac_secret``, the path claim as a prefix."""
    return {
        "jwt": {"algorithms": ["HS256"], "keys": [{"hmacSecret": {"value": hmac_secret}}]},
        "pathClaim": {"name": "path", "match": "PREFIX"},
    }


def _security_resources(
    org: str, cluster: str, extauthz_uri: str, hmac_secret: str
) -> tuple[Resource, ...]:
    """Tenant and workspace ``demo`` over the cluster, and security group ``web`` with
    the JWT policy and the setting that sends its checks to ``extauthz_uri``."""
    workspace = f"{org}/tenants/demo/workspaces/demo"
    group = f"{workspace}/securitygroups/web"
    jwt_policy = _jwt_policy(hmac_secret)
    setting = {
        "authorization": {
            # The setting's mode (docs/api.md); CUSTOM needs an explicit serviceAccounts list.
            "mode": "CLUSTER",
            "http": {"external": {"uri": extauthz_uri, "policy": "jwt"}},
        }
    }
    return (
        Resource(f"{org}/tenants", "demo", "tenant", {}, update=False),
        Resource(
            f"{org}/tenants/demo/workspaces",
            "demo",
            "workspace",
            {"namespaceSelector": {"names": [f"{cluster}/*"]}},
        ),
        Resource(f"{workspace}/securitygroups", "web", "securityGroup", {"configMode": "BRIDGED"}),
        Resource(f"{group}/extauthzpolicies", "jwt", "extAuthzPolicy", jwt_policy),
        Resource(f"{group}/settings", "default", "securitySetting", setting),
    )


def _differs(stored: Mapping[str, Any], wanted: Mapping[str, Any], field: str) -> bool:
    """Whether the server's object differs from the plan.

    Key material comes back redacted (a marker with the secret's
    fingerprint): compare it with the plan redacted the same way, so an
    unchanged secret is "unchanged" and a changed one is sent again.
    """
    # The kinds table pulls in the store and FastAPI (2 CPU-seconds): imported only
    # on a re-run, when something exists to compare, not before a first start.
    from mgmt_api.kinds import KINDS  # noqa: PLC0415

    secrets = next(k.behaviour.secrets for k in KINDS.values() if k.body_field == field)
    return not _holds(stored, redact(dict(wanted), secrets))


def _holds(stored: Any, wanted: Any) -> bool:
    """Whether ``stored`` says everything ``wanted`` says.

    Objects compare by the keys the plan sets: the server fills in defaults
    (a Backend ref's ``weight``, an HTTPRoute's empty ``parentRefs``), and
    those alone must not make a re-run "update" what it just created.
    """
    if isinstance(wanted, Mapping):
        return isinstance(stored, Mapping) and all(
            key in stored and _holds(stored[key], value) for key, value in wanted.items()
        )
    if isinstance(wanted, list | tuple):
        return (
            isinstance(stored, list | tuple)
            and len(stored) == len(wanted)
            and all(_holds(s, w) for s, w in zip(stored, wanted, strict=True))
        )
    return bool(stored == wanted)


def _check(response: httpx.Response, what: str) -> Any:
    if response.status_code != 200:
        raise SeedError(f"{what}: HTTP {response.status_code}: {response.text[:500]}")
    return response.json()


#: What :func:`seed` did with an object: made it; brought the seeder's own untouched
#: object to a changed plan; left it as it is (it says what the plan says, or it is
#: an organization or tenant, whose spec the demo does not own); left it, and it
#: says something else than the plan (someone changed it: kept).
CREATED, UPDATED, LEFT, KEPT = "created", "updated", "left as it is", "kept as changed"


def apply_resource(
    client: httpx.Client, resource: Resource, seeded_etag: str | None = None
) -> tuple[str, Any]:
    """Create ``resource`` when it is missing; otherwise leave it as it is, unless it is
    still exactly what the seeder wrote (its etag is ``seeded_etag``) and the plan moved.

    Return (:data:`CREATED`/:data:`UPDATED`/:data:`LEFT`/:data:`KEPT`, the server's body).

    An existing object is the user's once anyone wrote it after the seeder
    (its etag changed): a re-run never overwrites that. An object the seeder
    wrote and nobody touched since is the demo's own, so a re-run brings it
    to the plan when the plan changed (the ports moved, so the extauthz URI
    or the upstream did): that is no one's edit to keep.
    """
    found = client.get(resource.path)
    if found.status_code == 404:
        body = {"name": resource.name, resource.field: dict(resource.spec)}
        return CREATED, _check(client.post(resource.collection, json=body), resource.path)
    stored = _check(found, resource.path)
    if not resource.update or not _differs(stored, resource.spec, resource.field):
        return LEFT, stored
    if seeded_etag is None or stored.get("etag") != seeded_etag:
        return KEPT, stored
    body = {**resource.spec, "etag": stored["etag"]}
    return UPDATED, _check(client.put(resource.path, json=body), resource.path)


def _read_ledger(path: Path | None) -> dict[str, str]:
    """The etag each object had when the seeder last wrote it (empty: none known)."""
    if path is None:
        return {}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}


def _write_secret(path: Path, doc: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(doc, handle)


def credential_files(directory: Path) -> dict[str, Path]:
    """Where each cluster component's key goes: ``DIR/{component}-credentials.json``."""
    return {a.name: directory / f"{a.name}-credentials.json" for a in cluster_accounts.ACCOUNTS}


def _write_keys(body: Any, credentials: Mapping[str, Path]) -> None:
    """Each component's entry of the install template to its own file."""
    try:
        secrets = body["installTemplate"]["helm"]["secrets"]
    except (KeyError, TypeError):
        raise SeedError("the cluster came back without its install template") from None
    for account in cluster_accounts.ACCOUNTS:
        secret = secrets.get(account.template_secret) if isinstance(secrets, Mapping) else None
        if not isinstance(secret, Mapping):
            raise SeedError(f"the install template has no {account.template_secret}")
        _write_secret(credentials[account.name], secret)


def seed(
    client: httpx.Client,
    plan: DemoPlan,
    credentials: Mapping[str, Path],
    ledger: Path | None = None,
) -> dict[str, str]:
    """Create what of ``plan`` the server lacks; write each component's key to
    ``credentials`` (component -> file, :func:`credential_files`).

    What exists is left as it is (:func:`apply_resource`): a re-run never
    undoes a user's change. ``ledger`` (a JSON file: path -> the etag the
    seeder left) tells the seeder's untouched objects from edited ones;
    without it nothing existing is ever written. The keys are written when
    the cluster is created, or fetched again (new keys) when a file is
    missing. Returns each object's path → what was done.
    """
    etags = _read_ledger(ledger)
    report: dict[str, str] = {}
    for resource in plan.resources:
        action, body = apply_resource(client, resource, etags.get(resource.path))
        report[resource.path] = action
        if action in (CREATED, UPDATED) and isinstance(body, Mapping) and "etag" in body:
            etags[resource.path] = str(body["etag"])
        if resource.field == "cluster" and resource.name == plan.cluster:
            if action == CREATED:
                _write_keys(body, credentials)
            elif not all(path.exists() for path in credentials.values()):
                fresh = client.get(resource.path, params={"includeInstallTemplate": "true"})
                _write_keys(_check(fresh, resource.path), credentials)
    if ledger is not None:
        ledger.parent.mkdir(parents=True, exist_ok=True)
        ledger.write_text(json.dumps(etags, indent=1, sort_keys=True) + "\n")
    return report
