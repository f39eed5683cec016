"""What a gateway Envoy in one cluster needs to enforce the cluster's policies.

``GET .../clusters/{cluster}/envoyconfig`` serves :func:`render`. The output
is protojson (camelCase fields, ``"@type"`` on every typed config), so each
piece can be pasted into a bootstrap or handed to an xDS server as is:

- ``httpFilters``: ``envoy.config.listener``-style ``HttpFilter`` entries to
  put before the router: one ``envoy.filters.http.ext_authz`` per ext_authz
  server the cluster's SecuritySettings name, and ``envoy.filters.http.ratelimit``
  when the cluster has BackendTrafficPolicies.
- ``routes``: one entry per policy, naming what it applies to (``targetRef``
  for a BackendTrafficPolicy, ``workloads`` for a SecuritySetting) and the
  route's ``typedPerFilterConfig``. Rate limits use ``RateLimitPerRoute`` with
  the policy's own ``domain`` and ``rateLimits`` (Envoy >= 1.33), rendered by
  :func:`mgmt_api.compiler.ratelimit.route_rate_limits`, the same code that
  names the descriptors the ratelimit service loads.
- ``clusters``: the gRPC upstream clusters the filters call (HTTP/2).
- ``warnings``: what cannot be rendered faithfully (two policies on one route).

Decisions, and why:

- ext_authz selects the policy with the ``meshplane.policy`` context
  extension (``extauthz.contract.POLICY_CONTEXT_KEY``) set to the name the
  published ext_authz file gives it, so Envoy and ext_authz agree by
  construction. ``failureModeAllow`` is false and ``statusOnError`` 503, as
  docs/extauthz.md recommends: an outage must not open the gateway, and must
  be told apart from a denial.
- With several ext_authz servers, each filter is named after its server and
  every ext_authz route disables the filters of the other servers, so a route
  is checked once, by its own group's server.
- The ratelimit service adds the ``x-ratelimit-*`` headers itself, so
  ``enableXRatelimitHeaders`` stays ``OFF`` (on, the headers would be doubled).
- ``failureModeDeny`` follows the cluster's ``rateLimit.failureMode``: only
  ``deny`` fails closed when the service cannot answer; ``allow`` and
  ``unavailable`` (the default) let the request through, as the service's own
  failure modes do.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from extauthz.contract import POLICY_CONTEXT_KEY
from mgmt_api.compiler.ratelimit import route_key, route_rate_limits
from mgmt_api.compiler.traffic_policy import BackendTrafficPolicy

JsonDict = dict[str, Any]

EXT_AUTHZ_FILTER = "envoy.filters.http.ext_authz"
RATELIMIT_FILTER = "envoy.filters.http.ratelimit"
RATELIMIT_CLUSTER = "ratelimit"
DEFAULT_RATELIMIT_SERVICE = "grpc://ratelimit:8081"

_TYPE = "type.googleapis.com/"
_EXT_AUTHZ = _TYPE + "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz"
_EXT_AUTHZ_PER_ROUTE = _TYPE + "envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute"
_RATELIMIT = _TYPE + "envoy.extensions.filters.http.ratelimit.v3.RateLimit"
_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


@dataclass(frozen=True)
class ExtAuthzRoute:
    """One SecuritySetting with ``authorization.http.external``, seen from a cluster.

    ``namespaces`` are the namespaces of this cluster its group selects
    (``*`` for all); ``policy`` is the ext_authz policy name to select, or
    None to leave the choice to ext_authz's ``defaultPolicy`` (deny).
    ``disabled`` renders a route that skips ext_authz (mode ``DISABLED``).
    """

    setting: str
    group: str
    namespaces: tuple[str, ...]
    uri: str
    policy: str | None
    disabled: bool = False


@dataclass(frozen=True)
class ClusterPolicies:
    """Everything the renderer reads, gathered from the store by the route."""

    cluster_fqn: str
    cluster: str
    failure_mode: str | None
    traffic_policies: tuple[tuple[str, BackendTrafficPolicy], ...]  # (fqn, policy)
    ext_authz: tuple[ExtAuthzRoute, ...]
    ratelimit_service: str = DEFAULT_RATELIMIT_SERVICE
    notes: tuple[str, ...] = ()  # warnings found while gathering


def grpc_address(uri: str) -> tuple[str, int]:
    """``grpc://host:port`` (already validated) as (host, port)."""
    parts = urlsplit(uri)
    assert parts.hostname is not None and parts.port is not None, uri
    return parts.hostname, parts.port


def grpc_cluster(name: str, uri: str) -> JsonDict:
    """An ``envoy.config.cluster.v3.Cluster`` reaching a gRPC server over HTTP/2."""
    host, port = grpc_address(uri)
    return {
        "name": name,
        "type": "STRICT_DNS",
        "connectTimeout": "0.250s",
        "typedExtensionProtocolOptions": {
            _HTTP_OPTIONS: {
                "@type": _TYPE + _HTTP_OPTIONS,
                "explicitHttpConfig": {"http2ProtocolOptions": {}},
            }
        },
        "loadAssignment": {
            "clusterName": name,
            "endpoints": [
                {
                    "lbEndpoints": [
                        {
                            "endpoint": {
                                "address": {"socketAddress": {"address": host, "portValue": port}}
                            }
                        }
                    ]
                }
            ],
        },
    }


def _ext_authz_names(uris: list[str]) -> dict[str, tuple[str, str]]:
    """uri -> (filter name, cluster name); plain names when there is one server."""
    if len(uris) == 1:
        return {uris[0]: (EXT_AUTHZ_FILTER, "extauthz")}
    out = {}
    for uri in uris:
        host, port = grpc_address(uri)
        out[uri] = (f"{EXT_AUTHZ_FILTER}/{host}:{port}", f"extauthz/{host}:{port}")
    return out


def ext_authz_filter(name: str, cluster: str) -> JsonDict:
    return {
        "name": name,
        "typedConfig": {
            "@type": _EXT_AUTHZ,
            "transportApiVersion": "V3",
            "grpcService": {"envoyGrpc": {"clusterName": cluster}, "timeout": "0.200s"},
            "failureModeAllow": False,
            "statusOnError": {"code": "ServiceUnavailable"},
        },
    }


def ratelimit_filter(domain: str, failure_mode: str | None) -> JsonDict:
    return {
        "name": RATELIMIT_FILTER,
        "typedConfig": {
            "@type": _RATELIMIT,
            # Required by Envoy; every route that rate-limits overrides it
            # with its policy's domain (RateLimitPerRoute.domain).
            "domain": domain,
            "failureModeDeny": failure_mode == "deny",
            "enableXRatelimitHeaders": "OFF",
            "disableXEnvoyRatelimitedHeader": True,
            "rateLimitService": {
                "transportApiVersion": "V3",
                "grpcService": {"envoyGrpc": {"clusterName": RATELIMIT_CLUSTER}},
            },
        },
    }


def _ext_authz_per_route(entry: ExtAuthzRoute) -> JsonDict:
    if entry.disabled:
        return {"@type": _EXT_AUTHZ_PER_ROUTE, "disabled": True}
    extensions = {POLICY_CONTEXT_KEY: entry.policy} if entry.policy else {}
    return {"@type": _EXT_AUTHZ_PER_ROUTE, "checkSettings": {"contextExtensions": extensions}}


def render(policies: ClusterPolicies) -> JsonDict:
    """The ``envoyconfig`` document of one cluster (see the module docstring)."""
    filters: list[JsonDict] = []
    clusters: list[JsonDict] = []
    routes: list[JsonDict] = []
    warnings: list[str] = list(policies.notes)

    uris = sorted({e.uri for e in policies.ext_authz if not e.disabled})
    names = _ext_authz_names(uris)
    for uri in uris:
        filter_name, cluster_name = names[uri]
        filters.append(ext_authz_filter(filter_name, cluster_name))
        clusters.append(grpc_cluster(cluster_name, uri))
    disabled = {"@type": _EXT_AUTHZ_PER_ROUTE, "disabled": True}
    for entry in sorted(policies.ext_authz, key=lambda e: e.setting):
        own = None if entry.disabled else names[entry.uri][0]
        per_filter = {
            filter_name: _ext_authz_per_route(entry) if filter_name == own else disabled
            for filter_name, _ in names.values()
        }
        if not per_filter:  # DISABLED with no ext_authz filter in the cluster
            continue
        routes.append(
            {
                "name": f"extauthz:{entry.setting}",
                "workloads": {"securityGroup": entry.group, "namespaces": list(entry.namespaces)},
                "setting": entry.setting,
                "typedPerFilterConfig": per_filter,
            }
        )

    ordered = sorted(policies.traffic_policies, key=lambda p: p[0])
    if ordered:
        filters.append(ratelimit_filter(policies.cluster, policies.failure_mode))
        clusters.append(grpc_cluster(RATELIMIT_CLUSTER, policies.ratelimit_service))
    targets = Counter(route_key(policy) for _, policy in ordered)
    for fqn, policy in ordered:
        ref = policy.spec.target_ref
        routes.append(
            {
                "name": f"ratelimit:{fqn}",
                "targetRef": {
                    "kind": ref.kind,
                    "namespace": policy.metadata.namespace,
                    "name": ref.name,
                },
                "policy": fqn,
                "typedPerFilterConfig": {
                    RATELIMIT_FILTER: route_rate_limits(policies.cluster, policy)
                },
            }
        )
    warnings.extend(
        f"{count} BackendTrafficPolicies target {key}; an Envoy route takes one "
        "RateLimitPerRoute, so only one of them can be applied there"
        for key, count in sorted(targets.items())
        if count > 1
    )
    return {
        "cluster": policies.cluster_fqn,
        "httpFilters": filters,
        "routes": routes,
        "clusters": clusters,
        "warnings": warnings,
    }
