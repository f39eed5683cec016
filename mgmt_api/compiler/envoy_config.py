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
- ``circuitBreakers``: the ``envoy.config.cluster.v3.CircuitBreakers`` to set
  on the user's upstream (backend) clusters behind the gateway, or null when
  the cluster sets none (Envoy's defaults then apply: 1024 connections,
  1024 pending requests, 1024 requests, 3 retries).
- ``warnings``: what cannot be rendered faithfully (two policies on one route).

Decisions, and why:

- ext_authz selects the policy with the ``meshplane.policy`` context
  extension (``extauthz.contract.POLICY_CONTEXT_KEY``) set to the name the
  published ext_authz file gives it, so Envoy and ext_authz agree by
  construction. ``statusOnError`` is 503, so an outage is told apart from a
  denial; ``failureModeAllow`` is the cluster's ``extAuthz.failureModeAllow``,
  false unless set (an outage must not open the gateway).
- The filters' timeouts are explicit and per cluster (:class:`GatewaySettings`):
  Envoy's own default for the rate-limit filter is 20 ms, and when it fires
  the request goes through unlimited (fail open) or is refused, silently,
  under exactly the load a limit is for (Envoy Gateway issues #1655, #6487).
- With several ext_authz servers, each filter is named after its server and
  every ext_authz route disables the filters of the other servers, so a route
  is checked once, by its own group's server.
- A Check to meshplane's own extauthz carries only the request headers it
  reads (``allowedHeaders``: :data:`CHECK_HEADERS`, plus any
  ``includeRequestHeadersInCheck``); method, path, host, addresses and the
  context extensions are fields of the Check, sent whatever the list.
  Encoding every header into each Check cost the gateway Envoy ~8k
  instructions a request (of ~510k for ext_authz + rate limit + proxying;
  bench/gateway/calls.py). A setting that names an ExtAuthzPolicy is known to
  call meshplane's extauthz (only it selects by ``meshplane.policy``); one
  that names neither a policy nor headers may call any ext_authz server, so
  its server gets every header (Envoy's default, and the Gateway API's rule
  for an empty ``allowedHeaders``): narrowing there could hide a header a
  foreign policy decides on. See :meth:`ExtAuthzRoute.check_headers`.
- Both filters' gRPC calls skip Envoy's own request headers
  (``skipEnvoyHeaders``: ``x-envoy-internal``, and an ``x-forwarded-for``
  naming a made-up address): neither service reads them, and adding them cost
  ~7k instructions a request on ``/on``. ``grpc-timeout`` is still sent.
- The ratelimit service adds the ``x-ratelimit-*`` headers itself, so
  ``enableXRatelimitHeaders`` stays ``OFF`` (on, the headers would be doubled).
- ``failureModeDeny`` follows the cluster's ``rateLimit.failureMode``, the
  cluster's one fail-open/fail-closed switch: only ``deny`` fails closed
  (Envoy answers 500 when the service cannot answer in time); ``allow`` and
  ``unavailable`` (the default) let the request through, as the service's own
  failure modes do.
- Circuit breakers are rendered for the user's upstream clusters, not for the
  ``extauthz``/``ratelimit`` clusters: they make an upstream that cannot keep
  up answer 503 at the gateway (spec 4.10.7), which a client tells apart from
  a 429 limit.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from extauthz.contract import POLICY_CONTEXT_KEY
from meshplane.netaddr import parse_service_uri
from mgmt_api.compiler import local_jwt, path_claim_lua, quota, tracing
from mgmt_api.compiler.grpc_cluster import grpc_cluster
from mgmt_api.compiler.protojson import JsonDict
from mgmt_api.compiler.ratelimit import has_exact_rules, route_key, route_rate_limits
from mgmt_api.compiler.traffic_policy import BackendTrafficPolicy

EXT_AUTHZ_FILTER = "envoy.filters.http.ext_authz"
RATELIMIT_FILTER = "envoy.filters.http.ratelimit"
RATELIMIT_CLUSTER = "ratelimit"
DEFAULT_RATELIMIT_SERVICE = "grpc://ratelimit:8081"

_TYPE = "type.googleapis.com/"
_EXT_AUTHZ = _TYPE + "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz"
_EXT_AUTHZ_PER_ROUTE = _TYPE + "envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute"
_RATELIMIT = _TYPE + "envoy.extensions.filters.http.ratelimit.v3.RateLimit"

#: The request headers meshplane's extauthz reads from a Check: the token
#: (``extauthz.grpc_api.attributes_from_check``) and the W3C trace context its
#: decision log and spans continue (``extauthz.decisions``,
#: ``extauthz.grpc_api``). The path and method it reads are Check fields.
CHECK_HEADERS = ("authorization", "traceparent", "tracestate")

#: Bounds of the filters' timeouts, in seconds (also the API's, see kinds/cluster.py).
MIN_TIMEOUT_SECONDS = 0.001
MAX_TIMEOUT_SECONDS = 60.0
#: Circuit-breaker threshold fields (``Thresholds`` protojson names), in render order.
CIRCUIT_BREAKER_FIELDS = ("maxConnections", "maxPendingRequests", "maxRequests", "maxRetries")
#: A threshold is a ``UInt32Value``; the API caps it at the largest signed 32-bit integer.
MAX_THRESHOLD = 2**31 - 1
#: The protojson duration form as the API stores it (``"0.1s"``, ``"60s"``).
_STORED_DURATION = re.compile(r"(\d+(?:\.\d{1,3})?)s")


class StoredSecretRef(TypedDict, total=False):
    name: str
    namespace: str


class StoredRedisBackend(TypedDict, total=False):
    url: str
    urlRef: StoredSecretRef
    tls: dict[str, StoredSecretRef]  # {"certificateRef": ...}


class StoredRateLimitBackend(TypedDict, total=False):
    type: str
    redis: StoredRedisBackend


class StoredRateLimit(TypedDict, total=False):
    """A Cluster's ``rateLimit`` as the API stored it (``schemas.resources.ClusterRateLimit``
    by alias, the timeout normalized to protojson seconds): the gateway filter's knobs
    (``timeout``, ``failureMode``) and the ratelimit service's switches."""

    redis: dict[str, bool]  # {"disabled": ...}
    backend: StoredRateLimitBackend
    failureMode: str
    timeout: str


class StoredExtAuthz(TypedDict, total=False):
    """A Cluster's ``extAuthz`` as stored (``schemas.resources.ClusterExtAuthz`` by alias)."""

    timeout: str
    failureModeAllow: bool


class GatewayKnobs(TypedDict, total=False):
    """The :data:`GATEWAY_SPEC_KEYS` of a stored Cluster spec, which
    :func:`gateway_settings` reads. Typed as the API writes them; read defensively all
    the same (a ValueError names the field) since the store may be written around it."""

    rateLimit: StoredRateLimit
    extAuthz: StoredExtAuthz
    circuitBreakers: dict[str, int]  # CIRCUIT_BREAKER_FIELDS -> threshold
    tracing: tracing.StoredTracing


#: The Cluster spec keys :func:`gateway_settings` reads: :class:`GatewayKnobs`' own.
GATEWAY_SPEC_KEYS = tuple(GatewayKnobs.__annotations__)


def protojson_duration(seconds: float) -> str:
    """``0.1`` -> ``"0.100s"``: the millisecond-precise protojson form rendered to Envoy."""
    return f"{seconds:.3f}s"


@dataclass(frozen=True)
class GatewaySettings:
    """A cluster's knobs for the filters its gateways run, ready to render.

    Defaults, and why:

    - ``ratelimit_timeout`` 100 ms, not Envoy's 20 ms: under load a 20 ms
      deadline fires before the ratelimit service answers, and every such
      request then bypasses its limit (or, fail closed, is refused) without
      anyone having decided so (Envoy Gateway issues #1655 and #6487). The
      service answers in well under a millisecond and gives Redis 10 ms.
    - ``ratelimit_fail_closed`` False: ``rateLimit.failureMode`` other than
      ``deny`` lets a request through when the service cannot answer.
    - ``ext_authz_timeout`` 200 ms (Envoy's default, made explicit) and
      ``ext_authz_failure_mode_allow`` False: an authorization outage must
      not open the gateway.
    - ``circuit_breakers`` None: Envoy's own thresholds apply.

    ``circuit_breakers`` is an ``envoy.config.cluster.v3.CircuitBreakers`` in
    protojson (``{"thresholds": [{"priority": "DEFAULT", ...}]}``) for the
    user's upstream clusters; being a dict, it makes instances unhashable.
    """

    ratelimit_timeout: str = "0.100s"
    ratelimit_fail_closed: bool = False
    ext_authz_timeout: str = "0.200s"
    ext_authz_failure_mode_allow: bool = False
    circuit_breakers: JsonDict | None = None
    tracing: tracing.TracingSettings | None = None  # Envoy's tracer: mgmt_api.compiler.tracing


def _stored_timeout(value: Any, field: str, default: str) -> str:
    """A stored timeout (``"0.1s"``) in the rendered form; ``default`` when unset."""
    if value is None:
        return default
    m = _STORED_DURATION.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"{field}: {value!r} is not a duration in seconds such as '0.1s'")
    seconds = float(m.group(1))
    if not MIN_TIMEOUT_SECONDS <= seconds <= MAX_TIMEOUT_SECONDS:
        raise ValueError(f"{field}: {value!r} is not between 1ms and 60s")
    return protojson_duration(seconds)


def _stored_bool(value: Any, field: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"{field}: {value!r} is not a boolean")
    return value


def circuit_breakers(thresholds: Mapping[str, object] | None) -> JsonDict | None:
    """``CircuitBreakers``: one DEFAULT-priority ``Thresholds`` of the fields set; None if none."""
    chosen: JsonDict = {}
    for name in CIRCUIT_BREAKER_FIELDS:
        value = (thresholds or {}).get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"circuitBreakers.{name}: {value!r} is not an integer")
        if not 1 <= value <= MAX_THRESHOLD:
            raise ValueError(
                f"circuitBreakers.{name}: {value} is not between 1 and {MAX_THRESHOLD}"
            )
        chosen[name] = value
    if not chosen:
        return None
    return {"thresholds": [{"priority": "DEFAULT", **chosen}]}


def gateway_settings(cluster_spec: GatewayKnobs) -> GatewaySettings:
    """The :class:`GatewaySettings` of a stored Cluster spec (``rateLimit``,
    ``extAuthz``, ``circuitBreakers``; every field optional).

    The API validated and normalized the spec when it was written (timeouts
    stored as protojson seconds), so a ValueError naming the field means the
    store was written around the API.
    """
    rate_limit: StoredRateLimit = cluster_spec.get("rateLimit") or {}
    ext_authz: StoredExtAuthz = cluster_spec.get("extAuthz") or {}
    defaults = GatewaySettings()
    return GatewaySettings(
        ratelimit_timeout=_stored_timeout(
            rate_limit.get("timeout"), "rateLimit.timeout", defaults.ratelimit_timeout
        ),
        ratelimit_fail_closed=rate_limit.get("failureMode") == "deny",
        ext_authz_timeout=_stored_timeout(
            ext_authz.get("timeout"), "extAuthz.timeout", defaults.ext_authz_timeout
        ),
        ext_authz_failure_mode_allow=_stored_bool(
            ext_authz.get("failureModeAllow"), "extAuthz.failureModeAllow"
        ),
        circuit_breakers=circuit_breakers(cluster_spec.get("circuitBreakers")),
        tracing=tracing.settings_of(cluster_spec.get("tracing")),
    )


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
    #: ``authorization.http.local`` (JSON, validated): local JWT rules, which
    #: Envoy's own jwt_authn and rbac filters enforce instead of an ext_authz call.
    local: Mapping[str, Any] | None = None
    #: ``http.external.includeRequestHeadersInCheck``: request headers the
    #: server reads besides :data:`CHECK_HEADERS`.
    include_headers: tuple[str, ...] = ()

    @property
    def check_headers(self) -> frozenset[str] | None:
        """The request headers its server's Checks must carry; None for all.

        Known only when the setting names an ExtAuthzPolicy (meshplane's
        extauthz) or lists its headers; otherwise the server may be anyone's.
        """
        if self.policy is None and not self.include_headers:
            return None
        return frozenset((*CHECK_HEADERS, *(h.lower() for h in self.include_headers)))

    @property
    def skips_ext_authz(self) -> bool:
        """No ext_authz call on its routes: mode DISABLED, or local rules instead."""
        return self.disabled or self.local is not None

    @property
    def local_name(self) -> str:
        """The jwt_authn provider and requirement name of its local rules."""
        return f"local:{self.setting}"


def namespace_selected(patterns: Sequence[str], namespace: str) -> bool:
    """Whether ``*``, a prefix ``ab*`` or an exact name of ``patterns`` selects ``namespace``.

    ``patterns`` are an :class:`ExtAuthzRoute`'s ``namespaces``: the namespace
    half of ``domain.lookup.matches`` (the cluster half was resolved when the
    read model was built; the compiler may not import domain). Gateways and
    sidecars both decide with it which setting applies to a namespace.
    """
    for pattern in patterns:
        if pattern in (namespace, "*"):
            return True
        if pattern.endswith("*") and namespace.startswith(pattern[:-1]):
            return True
    return False


@dataclass(frozen=True)
class EnvoyConfigInput:
    """Everything the renderer reads, gathered from the store by the route."""

    cluster_fqn: str
    cluster: str
    traffic_policies: tuple[tuple[str, BackendTrafficPolicy], ...]  # (fqn, policy)
    ext_authz: tuple[ExtAuthzRoute, ...]
    ratelimit_service: str = DEFAULT_RATELIMIT_SERVICE
    notes: tuple[str, ...] = ()  # warnings found while gathering
    gateway: GatewaySettings = GatewaySettings()  # the cluster's filter knobs
    #: (published name, stored spec) of the ExtAuthzPolicies reaching the
    #: cluster, and the claims each publishes as metadata: what decides
    #: whether a route's policy runs inside Envoy (:func:`policy_enforcements`).
    extauthz_policies: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    published_claims: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def _ext_authz_names(uris: list[str]) -> dict[str, tuple[str, str]]:
    """uri -> (filter name, cluster name); plain names when there is one server."""
    if len(uris) == 1:
        return {uris[0]: (EXT_AUTHZ_FILTER, "extauthz")}
    out = {}
    for uri in uris:
        label = parse_service_uri(uri).label
        out[uri] = (f"{EXT_AUTHZ_FILTER}/{label}", f"extauthz/{label}")
    return out


def server_check_headers(routes: Sequence[ExtAuthzRoute]) -> list[str] | None:
    """The request headers one server's filter sends: every header any of its
    routes needs, sorted; None (all headers) if one of them needs all."""
    needed: set[str] = set()
    for route in routes:
        headers = route.check_headers
        if headers is None:
            return None
        needed |= headers
    return sorted(needed)


def ext_authz_filter(
    name: str,
    cluster: str,
    settings: GatewaySettings = GatewaySettings(),
    headers: Sequence[str] | None = None,
) -> JsonDict:
    """An ``HttpFilter`` calling ext_authz on gRPC cluster ``cluster``, with the
    cluster's timeout and failure mode; an error is a 503, never a 403. The
    Check carries the request headers ``headers`` (None: every header; see
    :func:`server_check_headers`)."""
    config: JsonDict = {
        "@type": _EXT_AUTHZ,
        "transportApiVersion": "V3",
        "grpcService": {
            "envoyGrpc": {"clusterName": cluster, "skipEnvoyHeaders": True},
            "timeout": settings.ext_authz_timeout,
        },
        "failureModeAllow": settings.ext_authz_failure_mode_allow,
        "statusOnError": {"code": "ServiceUnavailable"},
    }
    if headers is not None:
        config["allowedHeaders"] = {"patterns": [{"exact": header} for header in headers]}
    return {"name": name, "typedConfig": config}


def ratelimit_filter(domain: str, settings: GatewaySettings = GatewaySettings()) -> JsonDict:
    """The ``envoy.filters.http.ratelimit`` ``HttpFilter``, calling cluster
    :data:`RATELIMIT_CLUSTER` with the cluster's timeout and failure mode."""
    return {
        "name": RATELIMIT_FILTER,
        "typedConfig": {
            "@type": _RATELIMIT,
            # Required by Envoy; every route that rate-limits overrides it
            # with its policy's domain (RateLimitPerRoute.domain).
            "domain": domain,
            "timeout": settings.ratelimit_timeout,
            "failureModeDeny": settings.ratelimit_fail_closed,
            "enableXRatelimitHeaders": "OFF",
            "disableXEnvoyRatelimitedHeader": True,
            "rateLimitService": {
                "transportApiVersion": "V3",
                "grpcService": {
                    "envoyGrpc": {"clusterName": RATELIMIT_CLUSTER, "skipEnvoyHeaders": True}
                },
            },
        },
    }


def _ext_authz_per_route(entry: ExtAuthzRoute) -> JsonDict:
    if entry.disabled:
        return {"@type": _EXT_AUTHZ_PER_ROUTE, "disabled": True}
    extensions = {POLICY_CONTEXT_KEY: entry.policy} if entry.policy else {}
    return {"@type": _EXT_AUTHZ_PER_ROUTE, "checkSettings": {"contextExtensions": extensions}}


def policy_enforcements(
    policies: EnvoyConfigInput,
) -> dict[str, local_jwt.PolicyEnforcement]:
    """policy name -> how its routes are enforced, for each policy a route selects.

    A policy nobody stored (the route's ext_authz denies) stays external.
    """
    specs = dict(policies.extauthz_policies)
    out: dict[str, local_jwt.PolicyEnforcement] = {}
    for entry in policies.ext_authz:
        name = entry.policy
        if name is None or entry.skips_ext_authz or name in out:
            continue
        spec = specs.get(name)
        out[name] = (
            local_jwt.PolicyEnforcement(
                local_jwt.ENFORCEMENT_EXTERNAL, "no such ExtAuthzPolicy: extauthz denies"
            )
            if spec is None
            else local_jwt.policy_enforcement(
                name, spec, tuple(policies.published_claims.get(name, ()))
            )
        )
    return out


def _decided_locally() -> JsonDict:
    """ext_authz runs unless the Lua check decided the request (``invert``)."""
    return {
        "filter": path_claim_lua.DECIDED_NAMESPACE,
        "path": [{"key": path_claim_lua.DECIDED_KEY}],
        "value": {"boolMatch": True},
        "invert": True,
    }


def render(policies: EnvoyConfigInput) -> JsonDict:
    """The ``envoyconfig`` document of one cluster (see the module docstring)."""
    filters: list[JsonDict] = []
    clusters: list[JsonDict] = []
    routes: list[JsonDict] = []
    warnings: list[str] = list(policies.notes)

    entries = sorted(policies.ext_authz, key=lambda e: e.setting)
    enforcement = policy_enforcements(policies)
    local = local_jwt.compile_listener(
        [(e.local_name, dict(e.local)) for e in entries if e.local is not None],
        sorted(enforcement.items()),
    )
    any_local = any(e.lua is not None for e in enforcement.values())
    filters.extend(local.http_filters)
    clusters.extend(local.clusters)
    uris = sorted({e.uri for e in policies.ext_authz if not e.skips_ext_authz})
    names = _ext_authz_names(uris)
    for uri in uris:
        filter_name, cluster_name = names[uri]
        # One filter per server: it sends what any of the server's settings needs.
        headers = server_check_headers(
            [e for e in entries if e.uri == uri and not e.skips_ext_authz]
        )
        one = ext_authz_filter(filter_name, cluster_name, policies.gateway, headers)
        if any_local:
            one["typedConfig"]["filterEnabledMetadata"] = _decided_locally()
        filters.append(one)
        clusters.append(grpc_cluster(cluster_name, uri))
    disabled = {"@type": _EXT_AUTHZ_PER_ROUTE, "disabled": True}
    for entry in entries:
        own = None if entry.skips_ext_authz else names[entry.uri][0]
        per_filter = {
            filter_name: _ext_authz_per_route(entry) if filter_name == own else disabled
            for filter_name, _ in names.values()
        }
        per_filter.update(local.per_route.get(entry.local_name, {}))
        how = enforcement.get(entry.policy or "") if not entry.skips_ext_authz else None
        if how is not None:
            per_filter.update(local.per_route.get(f"extauthz:{entry.policy}", {}))
        if not per_filter:  # DISABLED with no ext_authz filter in the cluster
            continue
        route: JsonDict = {
            "name": f"extauthz:{entry.setting}",
            "workloads": {"securityGroup": entry.group, "namespaces": list(entry.namespaces)},
            "setting": entry.setting,
            "typedPerFilterConfig": per_filter,
        }
        if how is not None:
            route["enforcement"] = how.document()
        routes.append(route)

    ordered = sorted(policies.traffic_policies, key=lambda p: p[0])
    if any(has_exact_rules(policy) for _, policy in ordered):
        filters.append(ratelimit_filter(policies.cluster, policies.gateway))
    if any(quota.quota_rules(policy) for _, policy in ordered):
        filters.append(quota.mark_filter())
    for _, policy in ordered:
        filters.extend(
            quota.quota_filter(
                policies.cluster,
                policy,
                index,
                rule,
                rlqs_cluster=RATELIMIT_CLUSTER,
                fail_closed=policies.gateway.ratelimit_fail_closed,
            )
            for index, rule in quota.quota_rules(policy)
        )
    if ordered:  # the exact and the quota path both go to the ratelimit service
        clusters.append(grpc_cluster(RATELIMIT_CLUSTER, policies.ratelimit_service))
    targets = Counter(route_key(policy) for _, policy in ordered)
    for fqn, policy in ordered:
        ref = policy.spec.target_ref
        limits: JsonDict = quota.route_marks(policy)
        if has_exact_rules(policy):
            limits[RATELIMIT_FILTER] = route_rate_limits(policies.cluster, policy)
        routes.append(
            {
                "name": f"ratelimit:{fqn}",
                "targetRef": {
                    "kind": ref.kind,
                    "namespace": policy.metadata.namespace,
                    "name": ref.name,
                },
                "policy": fqn,
                # Which path each rule takes: exact (a call a request) or quota (inside Envoy).
                "modes": [
                    "quota" if rule.quota else "exact"
                    for rule in policy.spec.rate_limit.global_.rules
                ],
                "typedPerFilterConfig": limits,
            }
        )
    warnings.extend(
        f"{count} BackendTrafficPolicies target {key}; an Envoy route takes one "
        "RateLimitPerRoute, so only one of them can be applied there"
        for key, count in sorted(targets.items())
        if count > 1
    )
    traced = policies.gateway.tracing
    if traced is not None:
        clusters.append(tracing.collector_cluster(traced))
    return {
        "cluster": policies.cluster_fqn,
        "tracing": tracing.document_section(traced),
        "httpFilters": filters,
        "routes": routes,
        "clusters": clusters,
        "circuitBreakers": policies.gateway.circuit_breakers,
        "warnings": warnings,
    }
