"""A gateway's whole Envoy configuration, as the xDS resources mgmt-api's ADS server sends.

The cluster's ``envoyconfig`` document (:func:`mgmt_api.compiler.envoy_config.render`:
the ext_authz and rate-limit filters, their per-route settings, their gRPC
clusters, the gateway knobs) is the single source; this module places it
around the cluster's HTTPRoutes and Backends (:mod:`mgmt_api.compiler.http_route`):

- **one listener** (``gateway``) on the address the gateway's bootstrap names,
  an HTTP connection manager with the document's ``httpFilters`` then the
  router, its routes over RDS, so that a policy change reaches connections
  that are already open (a listener change would only apply to new ones);
- **one route configuration** (``gateway``): a virtual host per hostname the
  routes name (``*`` for routes that name none), each HTTPRoute rule's matches
  as Envoy routes in Gateway API precedence (``Exact`` first, then longer
  prefixes), each carrying the rate limits of the BackendTrafficPolicy that
  targets the route (or, failing one, the gateway), and the ext_authz
  settings of the SecuritySetting whose group selects the route's namespace;
  a route no setting selects disables ext_authz (spec 4.11.5: not checked);
- **clusters**: the document's gRPC clusters (ext_authz, ratelimit) and one
  per upstream a route references (a ``Backend`` by its endpoints, a
  ``Service`` by its cluster DNS name), each with the cluster's circuit
  breakers, so an upstream that cannot keep up gives 503, not 429.

A route whose backend does not exist still renders (Envoy answers 503, no
healthy upstream) and the cluster's status warns of it (:mod:`mgmt_api.compiler.references`).

Pure: no store, no clock. The version of a gateway's configuration is
:meth:`GatewayInput.version`, a digest of the cluster-level input only; what
differs between gateways (listener address, gateway name, ratelimit
address) is fixed for the life of a stream, so equal versions mean equal
resources for a given gateway.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from meshplane.gateway_contract import GatewayNode
from mgmt_api.compiler import denials, envoy_config, local_jwt, quota, tracing
from mgmt_api.compiler.http_route import Backend, BackendRef, HTTPRoute, RouteRule
from mgmt_api.compiler.protojson import JsonDict

LISTENER_NAME = "gateway"
ROUTE_CONFIG_NAME = "gateway"
ROUTER_FILTER = "envoy.filters.http.router"
HCM_FILTER = "envoy.filters.network.http_connection_manager"
_TYPE = "type.googleapis.com/"
_HCM = _TYPE + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = _TYPE + "envoy.extensions.filters.http.router.v3.Router"
_EXT_AUTHZ_PER_ROUTE = _TYPE + "envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute"
#: How long a connection to an upstream may take to open.
UPSTREAM_CONNECT_TIMEOUT = "1s"

#: Route matching, RBAC path rules and ext_authz all see the normalized path,
#: so `/a/../admin`, `%2e%2e` or `//admin` cannot slip past a rule written for
#: `/admin`; an escaped slash is unescaped by a redirect so the client and Envoy
#: agree on the path. Every listener that enforces path rules carries it.
PATH_NORMALIZATION: JsonDict = {
    "normalizePath": True,
    "mergeSlashes": True,
    "pathWithEscapedSlashesAction": "UNESCAPE_AND_REDIRECT",
}

LISTENER_TYPE = _TYPE + "envoy.config.listener.v3.Listener"
ROUTE_TYPE = _TYPE + "envoy.config.route.v3.RouteConfiguration"
CLUSTER_TYPE = _TYPE + "envoy.config.cluster.v3.Cluster"
#: SDS: a sidecar's workload certificate and its mesh CA (docs/mesh.md); gateways have none.
SECRET_TYPE = _TYPE + "envoy.extensions.transport_sockets.tls.v3.Secret"


@dataclass(frozen=True)
class GatewayInput:
    """What a cluster's gateways are configured from (read in one transaction)."""

    policies: envoy_config.EnvoyConfigInput
    http_routes: tuple[tuple[str, HTTPRoute], ...] = ()  # (fqn, route), FQN order
    backends: tuple[tuple[str, Backend], ...] = ()

    def document(self, ratelimit_service: str) -> JsonDict:
        """The ``envoyconfig`` document with the gateway's own ratelimit address."""
        return envoy_config.render(
            dataclasses.replace(self.policies, ratelimit_service=ratelimit_service)
        )

    def version(self) -> str:
        """Digest of everything cluster-wide a gateway's resources depend on."""
        content = {
            "document": self.document(envoy_config.DEFAULT_RATELIMIT_SERVICE),
            "routes": [(f, r.model_dump(mode="json", by_alias=True)) for f, r in self.http_routes],
            "backends": [(f, b.model_dump(mode="json", by_alias=True)) for f, b in self.backends],
        }
        encoded = json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(encoded).hexdigest()[:20]


@dataclass(frozen=True)
class GatewayResources:
    """The resources of one gateway, by xDS type, in protojson (camelCase, ``@type``)."""

    listeners: tuple[JsonDict, ...]
    route_configurations: tuple[JsonDict, ...]
    clusters: tuple[JsonDict, ...]
    warnings: tuple[str, ...]
    secrets: tuple[JsonDict, ...] = ()  # SDS, sidecars only: they carry private keys

    def by_type(self) -> dict[str, tuple[JsonDict, ...]]:
        return {
            LISTENER_TYPE: self.listeners,
            ROUTE_TYPE: self.route_configurations,
            CLUSTER_TYPE: self.clusters,
            SECRET_TYPE: self.secrets,
        }


def _socket(host: str, port: int) -> JsonDict:
    return {"socketAddress": {"address": host, "portValue": port}}


def listener(
    node: GatewayNode,
    http_filters: list[JsonDict],
    traced: tracing.TracingSettings | None = None,
) -> JsonDict:
    """The gateway's one HTTP listener; routes come over RDS (see the module docstring)."""
    manager: JsonDict = {
        "@type": _HCM,
        "statPrefix": "gateway",
        # Host headers carry ports; virtual hosts name bare hostnames.
        "stripAnyHostPort": True,
        **PATH_NORMALIZATION,
        "rds": {
            "routeConfigName": ROUTE_CONFIG_NAME,
            "configSource": {"ads": {}, "resourceApiVersion": "V3"},
        },
        "httpFilters": [
            *http_filters,
            {"name": ROUTER_FILTER, "typedConfig": {"@type": _ROUTER}},
        ],
        # Every refusal says why: reason header, decision id, one decision line.
        **denials.denial_settings("gateway"),
    }
    if traced is not None:
        manager["tracing"] = tracing.hcm_tracing(traced, node.gateway_name)
    return {
        "name": LISTENER_NAME,
        "address": _socket(node.listen_host, node.listen_port),
        "filterChains": [{"filters": [{"name": HCM_FILTER, "typedConfig": manager}]}],
    }


def _backend_cluster_name(ref: BackendRef, namespace: str) -> str:
    ns = ref.namespace or namespace
    if ref.kind == "Backend":
        return f"backend/{ns}/{ref.name}"
    return f"service/{ns}/{ref.name}/{ref.port}"


def _upstream_cluster(name: str, endpoints: list[tuple[str, int]], dns: bool) -> JsonDict:
    return {
        "name": name,
        "type": "STRICT_DNS" if dns else "STATIC",
        "connectTimeout": UPSTREAM_CONNECT_TIMEOUT,
        "loadAssignment": {
            "clusterName": name,
            "endpoints": [
                {"lbEndpoints": [{"endpoint": {"address": _socket(h, p)}} for h, p in endpoints]}
            ],
        },
    }


def _upstreams(inp: GatewayInput, circuit_breakers: JsonDict | None) -> list[JsonDict]:
    """Clusters for every upstream a route references that exists."""
    backends = {(b.metadata.namespace, b.metadata.name): b for _, b in inp.backends}
    clusters: dict[str, JsonDict] = {}
    for _fqn, route in inp.http_routes:
        namespace = route.metadata.namespace
        for rule in route.spec.rules:
            for ref in rule.backend_refs:
                name = _backend_cluster_name(ref, namespace)
                if name in clusters:
                    continue
                if ref.kind == "Service":
                    assert ref.port is not None  # the model requires it for a Service
                    host = f"{ref.name}.{ref.namespace or namespace}.svc.cluster.local"
                    clusters[name] = _upstream_cluster(name, [(host, ref.port)], dns=True)
                    continue
                backend = backends.get((ref.namespace or namespace, ref.name))
                if backend is None:  # the status warns of it (compiler.references)
                    continue
                endpoints = [
                    (e.ip.address, e.ip.port) if e.ip else (e.fqdn.hostname, e.fqdn.port)  # type: ignore[union-attr]
                    for e in backend.spec.endpoints
                ]
                dns = backend.spec.endpoints[0].fqdn is not None
                clusters[name] = _upstream_cluster(name, endpoints, dns=dns)
    if circuit_breakers:
        for cluster in clusters.values():
            cluster["circuitBreakers"] = circuit_breakers
    return [clusters[n] for n in sorted(clusters)]


def _route_action(rule: RouteRule, namespace: str) -> JsonDict | None:
    weighted = [(_backend_cluster_name(r, namespace), r.weight) for r in rule.backend_refs]
    live = [(name, weight) for name, weight in weighted if weight > 0]
    if not live:
        return None
    if len(live) == 1:
        return {"cluster": live[0][0]}
    merged: dict[str, int] = {}
    for name, weight in live:
        merged[name] = merged.get(name, 0) + weight
    return {
        "weightedClusters": {
            "clusters": [{"name": n, "weight": w} for n, w in sorted(merged.items())]
        }
    }


_ExtAuthzEntry = tuple[tuple[str, ...], JsonDict, str]


def _per_route_policies(
    document: JsonDict,
) -> tuple[dict[tuple[str, str, str], JsonDict], list[_ExtAuthzEntry], list[str]]:
    """From the document's route entries: rate limits by target and ext_authz by namespaces.

    Returns ((kind, namespace, name) → typedPerFilterConfig of the first
    BackendTrafficPolicy targeting it, [(namespaces, typedPerFilterConfig,
    setting)] of the ext_authz entries in setting order, the ext_authz filter
    names).
    """
    rate_limits: dict[tuple[str, str, str], JsonDict] = {}
    ext_authz: list[_ExtAuthzEntry] = []
    for entry in document["routes"]:
        ref = entry.get("targetRef")
        if ref is not None:
            rate_limits.setdefault(
                (ref["kind"], ref["namespace"], ref["name"]), entry["typedPerFilterConfig"]
            )
        elif "workloads" in entry:
            ext_authz.append(
                (
                    tuple(entry["workloads"]["namespaces"]),
                    entry["typedPerFilterConfig"],
                    entry["setting"],
                )
            )
    filters = [
        f["name"]
        for f in document["httpFilters"]
        if f["name"].startswith(envoy_config.EXT_AUTHZ_FILTER)
    ]
    return rate_limits, ext_authz, filters


#: Filters that do nothing on a route without their per-route config
#: (local JWT rules). They are on every gateway listener of a cluster with
#: local rules but disabled there, and enabled by each route that has their
#: config: a disabled filter is not even created for a request, whereas
#: pass-through it cost about 9 µs of CPU a request (docs/benchmarks.md,
#: "Pass-through filters"). Not leaving them out of the listener instead: a
#: listener change reaches new connections only, so a route added under local
#: rules would be served unchecked on connections opened before it.
_ROUTE_ONLY_FILTERS = frozenset(
    {
        local_jwt.JWT_AUTHN_FILTER,
        local_jwt.RBAC_FILTER,
        local_jwt.LUA_FILTER,
        quota.ROUTE_MARK_FILTER,  # marks the routes of quota policies
    }
)
_FILTER_CONFIG = _TYPE + "envoy.config.route.v3.FilterConfig"


def _disabled_by_default(http_filters: list[JsonDict]) -> list[JsonDict]:
    """The document's filters, the route-only ones disabled unless a route enables them."""
    return [
        {**f, "disabled": True} if f["name"] in _ROUTE_ONLY_FILTERS else f for f in http_filters
    ]


def _enable_route_only(per_filter: JsonDict) -> None:
    """Wrap a route's config of the route-only filters so that it enables them."""
    for name in _ROUTE_ONLY_FILTERS & per_filter.keys():
        per_filter[name] = {"@type": _FILTER_CONFIG, "config": per_filter[name]}


def _route_sort_key(
    match_type: str, value: str, fqn: str, rule: int, index: int
) -> tuple[int, int, str, int, int]:
    return (0 if match_type == "Exact" else 1, -len(value), fqn, rule, index)


def _attached(route: HTTPRoute, node: GatewayNode) -> bool:
    """Routes with parentRefs attach to the gateways they name; without, to all."""
    refs = route.spec.parent_refs
    return not refs or any(ref.name == node.gateway_name for ref in refs)


def compile_gateway(inp: GatewayInput, node: GatewayNode) -> GatewayResources:
    """The listener, route configuration and clusters of one gateway."""
    document = inp.document(node.ratelimit_service)
    warnings: list[str] = list(document["warnings"])
    circuit_breakers = document.get("circuitBreakers")
    upstreams = _upstreams(inp, circuit_breakers)
    rate_limits, ext_authz, authz_filters = _per_route_policies(document)
    gateway_limits = None
    for (kind, _namespace, name), config in sorted(rate_limits.items()):
        if kind == "Gateway" and name == node.gateway_name:
            gateway_limits = config
            break
    disabled = {"@type": _EXT_AUTHZ_PER_ROUTE, "disabled": True}

    hosts: dict[str, list[tuple[tuple[int, int, str, int, int], JsonDict]]] = {}
    for fqn, route in inp.http_routes:
        if not _attached(route, node):
            continue
        namespace = route.metadata.namespace
        per_filter: JsonDict = {}
        limits = rate_limits.get(("HTTPRoute", namespace, route.metadata.name), gateway_limits)
        if limits is not None:
            per_filter.update(limits)
        selected = [
            (cfg, setting)
            for spaces, cfg, setting in ext_authz
            if envoy_config.namespace_selected(spaces, namespace)
        ]
        if len(selected) > 1:
            warnings.append(
                f"{fqn}: {len(selected)} SecuritySettings select namespace {namespace!r}; "
                "the first (by name) applies"
            )
        per_filter.update(
            selected[0][0] if selected else {name: disabled for name in authz_filters}
        )
        _enable_route_only(per_filter)
        # The setting a refusal's decision line names (mgmt_api.compiler.denials).
        metadata = (
            {"filterMetadata": {denials.ROUTE_METADATA_KEY: {"setting": selected[0][1]}}}
            if selected
            else None
        )
        for rule_index, rule in enumerate(route.spec.rules):
            action = _route_action(rule, namespace)
            for match_index, match in enumerate(rule.matches):
                path = match.path
                envoy_match = (
                    {"path": path.value} if path.type == "Exact" else {"prefix": path.value}
                )
                name = f"httproute/{namespace}/{route.metadata.name}"
                entry: JsonDict = {
                    "name": f"{name}/rule/{rule_index}/match/{match_index}",
                    "match": envoy_match,
                }
                if action is None:  # every backendRef has weight 0 (Gateway API: 500)
                    entry["directResponse"] = {"status": 500}
                else:
                    entry["route"] = action
                if per_filter:
                    entry["typedPerFilterConfig"] = per_filter
                if metadata is not None:
                    entry["metadata"] = metadata
                key = _route_sort_key(path.type, path.value, fqn, rule_index, match_index)
                for host in route.spec.hostnames or ("*",):
                    hosts.setdefault(host, []).append((key, entry))
    virtual_hosts = [
        {
            "name": host,
            "domains": [host],
            "routes": [entry for _, entry in sorted(entries, key=lambda e: e[0])],
        }
        for host, entries in sorted(hosts.items(), key=lambda h: (h[0] == "*", h[0]))
    ]
    if "*" not in hosts:  # unmatched hosts: Envoy's 404, explicitly
        virtual_hosts.append({"name": "*", "domains": ["*"], "routes": []})
    route_configuration = {
        "name": ROUTE_CONFIG_NAME,
        "virtualHosts": virtual_hosts,
        # Upstream clusters are delivered with the routes (CDS before RDS).
        "validateClusters": False,
    }
    clusters = [*document["clusters"], *upstreams]
    http_filters = _disabled_by_default(document["httpFilters"])
    return GatewayResources(
        listeners=(listener(node, http_filters, inp.policies.gateway.tracing),),
        route_configurations=(route_configuration,),
        clusters=tuple(clusters),
        warnings=tuple(warnings),
    )
