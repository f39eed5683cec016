"""BackendTrafficPolicy rules in ``mode: quota`` → Envoy's ``rate_limit_quota`` filters.

A quota rule is enforced inside the gateway: Envoy's filter takes a token from
a bucket the rate-limit service assigned (RLQS, docs/ratelimit.md "Global
limits as quotas") and reports its usage every 5 s, with no call per request.
Each quota rule becomes one filter, so that, as with the exact path, every rule
of a route applies to a request (one filter's matcher picks one bucket):

- named ``envoy.filters.http.rate_limit_quota/<namespace>/<policy>/<rule>``,
  on the listener. Envoy's filter takes no per-route config (it refuses one,
  so it cannot be disabled on the listener and enabled by a route), so the
  routes the policy targets mark their requests instead: a
  ``header_to_metadata`` filter (:data:`ROUTE_MARK_FILTER`), disabled on the
  listener and enabled by those routes' config, sets dynamic metadata
  ``meshplane.quota`` ``<namespace>/<policy>`` = ``on``, and each quota
  filter's matcher requires it (``DynamicMetadataInput``). Only a filter sets
  dynamic metadata, so a client cannot put a request in a bucket of a route
  it is not on; elsewhere the quota filters match nothing and pass;
- ``domain``: the cluster's name, the same for every quota filter, so a
  gateway opens one stream to the service (Envoy keeps one per server and
  domain), on the ``ratelimit`` cluster that the exact path calls;
- the matcher: the rule's header selectors (``Exact``, ``RegularExpression``
  as predicates, ``Distinct`` as a bucket per value, read from the header);
  a request they do not match is not counted;
- the bucket id: the rule's descriptor, as the exact path sends it (the
  policy's domain, the route's node, ``rule-R-match-M`` entries), in the
  service's bucket-id form (:data:`ratelimit.contract.QUOTA_DOMAIN_KEY`,
  :func:`ratelimit.contract.quota_entry_key`), so the service reads the limit
  from the same config file;
- ``noAssignmentBehavior``: until the service first answers for a bucket,
  ``ALLOW_ALL`` (``DENY_ALL`` when the cluster's ``rateLimit.failureMode`` is
  ``deny``). Envoy can only use a blanket rule here: a token bucket as the
  default assignment has no bucket behind it;
- ``expiredAssignmentBehavior``: when an assignment's TTL passes without a
  new one (the service is down), each gateway enforces the whole limit on
  its own (a token bucket of ``requests`` per window) for a day, then
  ``noAssignmentBehavior``. Envoy does not implement ``reuse_last_assignment``;
- a denied request is a 429 with ``x-ratelimit-quota: exhausted`` (Envoy's
  filter adds no x-ratelimit headers; those are the exact path's).
"""

from __future__ import annotations

from mgmt_api.compiler.protojson import JsonDict
from mgmt_api.compiler.ratelimit import Entry, domain_of, route_key, rule_entries
from mgmt_api.compiler.traffic_policy import BackendTrafficPolicy, RateLimitRule
from ratelimit.contract import QUOTA_DOMAIN_KEY, QuotaSettings, quota_entry_key

QUOTA_FILTER = "envoy.filters.http.rate_limit_quota"
#: Marks the requests of the routes a quota policy targets (see the module doc).
ROUTE_MARK_FILTER = "envoy.filters.http.header_to_metadata/quota-routes"
#: The dynamic-metadata namespace of the mark; one key per policy.
MARK_NAMESPACE = "meshplane.quota"
MARK_VALUE = "on"
#: How long a gateway enforces the whole limit alone after its assignment expired.
FALLBACK_SECONDS = 86400
#: The header a quota denial carries.
DENIED_HEADER = ("x-ratelimit-quota", "exhausted")

_TYPE = "type.googleapis.com/"
_FILTER_CONFIG = (
    _TYPE + "envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig"
)
_SETTINGS = _TYPE + "envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings"
_HEADER_INPUT = _TYPE + "envoy.type.matcher.v3.HttpRequestHeaderMatchInput"
_HEADER_TO_METADATA = _TYPE + "envoy.extensions.filters.http.header_to_metadata.v3.Config"
_METADATA_INPUT = _TYPE + "envoy.extensions.matching.common_inputs.network.v3.DynamicMetadataInput"
_METADATA_MATCH = _TYPE + "envoy.extensions.matching.input_matchers.metadata.v3.Metadata"


def filter_name(policy: BackendTrafficPolicy, index: int) -> str:
    return f"{QUOTA_FILTER}/{policy.metadata.namespace}/{policy.metadata.name}/{index}"


def quota_rules(policy: BackendTrafficPolicy) -> list[tuple[int, RateLimitRule]]:
    return [(i, r) for i, r in enumerate(policy.spec.rate_limit.global_.rules) if r.quota]


def _header_input(name: str) -> JsonDict:
    return {"name": "header", "typedConfig": {"@type": _HEADER_INPUT, "headerName": name}}


def mark_key(policy: BackendTrafficPolicy) -> str:
    return f"{policy.metadata.namespace}/{policy.metadata.name}"


def _on_marked_route(policy: BackendTrafficPolicy) -> JsonDict:
    """The request is on a route the policy targets (the route set the mark)."""
    return {
        "input": {
            "name": "route-mark",
            "typedConfig": {
                "@type": _METADATA_INPUT,
                "filter": MARK_NAMESPACE,
                "path": [{"key": mark_key(policy)}],
            },
        },
        "customMatch": {
            "name": "route-mark",
            "typedConfig": {
                "@type": _METADATA_MATCH,
                "value": {"stringMatch": {"exact": MARK_VALUE}},
            },
        },
    }


def _xds(string_match: JsonDict) -> JsonDict:
    """An Envoy ``StringMatcher`` as the xDS matcher's (its regex names its engine)."""
    regex = string_match.get("safeRegex")
    if regex is None:
        return string_match
    return {"safeRegex": {"googleRe2": {}, "regex": regex["regex"]}}


def _predicate(policy: BackendTrafficPolicy, entries: list[Entry]) -> JsonDict:
    """On a route of the policy, every Exact/RegularExpression header matching and
    every Distinct one present."""
    singles: list[JsonDict] = [_on_marked_route(policy)]
    for entry in entries:
        matched = entry.action.get("headerValueMatch")
        if matched is not None:
            (header,) = matched["headers"]
            singles.append(
                {"input": _header_input(header["name"]), "valueMatch": _xds(header["stringMatch"])}
            )
        distinct = entry.action.get("requestHeaders")
        if distinct is not None:
            singles.append(
                {
                    "input": _header_input(distinct["headerName"]),
                    "valueMatch": _xds({"safeRegex": {"regex": ".*"}}),
                }
            )
    if len(singles) == 1:
        return {"singlePredicate": singles[0]}
    return {"andMatcher": {"predicate": [{"singlePredicate": s} for s in singles]}}


def _bucket_id(cluster: str, policy: BackendTrafficPolicy, entries: list[Entry]) -> JsonDict:
    route = route_key(policy)
    builders: JsonDict = {
        QUOTA_DOMAIN_KEY: {"stringValue": domain_of(cluster, policy)},
        quota_entry_key(0, route): {"stringValue": route},
    }
    for position, entry in enumerate(entries, start=1):
        key = quota_entry_key(position, entry.key)
        if entry.value is not None:
            builders[key] = {"stringValue": entry.value}
        else:
            header = entry.action["requestHeaders"]["headerName"]
            builders[key] = {"customValue": _header_input(header)}
    return {"bucketIdBuilder": builders}


def _fallback(rule: RateLimitRule) -> JsonDict:
    """The whole limit on one gateway: ``requests`` per window, a burst of at most that."""
    requests = rule.limit.requests
    if requests == 0:
        return {"blanketRule": "DENY_ALL"}
    window = rule.limit.unit.seconds * rule.limit.multiplier
    return {
        "tokenBucket": {
            "maxTokens": requests,
            "tokensPerFill": requests,
            "fillInterval": f"{window}s",
        }
    }


def quota_filter(
    cluster: str, policy: BackendTrafficPolicy, index: int, rule: RateLimitRule, *,
    rlqs_cluster: str, fail_closed: bool,
) -> JsonDict:  # fmt: skip
    """The ``HttpFilter`` of one quota rule (disabled until a route enables it)."""
    entries = rule_entries(index, rule)
    settings: JsonDict = {
        "@type": _SETTINGS,
        "bucketIdBuilder": _bucket_id(cluster, policy, entries),
        # Required by the proto; Envoy reports every 5 s whatever it says.
        "reportingInterval": f"{int(QuotaSettings.report_interval)}s",
        "denyResponseSettings": {
            "responseHeadersToAdd": [
                {"header": {"key": DENIED_HEADER[0], "value": DENIED_HEADER[1]}}
            ]
        },
        "noAssignmentBehavior": {
            "fallbackRateLimit": {"blanketRule": "DENY_ALL" if fail_closed else "ALLOW_ALL"}
        },
        "expiredAssignmentBehavior": {
            "fallbackRateLimit": _fallback(rule),
            "expiredAssignmentBehaviorTimeout": f"{FALLBACK_SECONDS}s",
        },
    }
    matcher = {
        "matcherList": {
            "matchers": [
                {
                    "predicate": _predicate(policy, entries),
                    "onMatch": {"action": {"name": "quota", "typedConfig": settings}},
                }
            ]
        }
    }
    return {
        "name": filter_name(policy, index),
        "typedConfig": {
            "@type": _FILTER_CONFIG,
            "rlqsServer": {"envoyGrpc": {"clusterName": rlqs_cluster, "skipEnvoyHeaders": True}},
            "domain": cluster,
            "bucketMatchers": matcher,
        },
    }


def mark_filter() -> JsonDict:
    """The listener's ``header_to_metadata`` filter that the quota routes enable."""
    return {"name": ROUTE_MARK_FILTER, "typedConfig": {"@type": _HEADER_TO_METADATA}}


def route_marks(policy: BackendTrafficPolicy) -> JsonDict:
    """The route's ``typedPerFilterConfig`` entry that marks its requests for the
    policy's quota filters (empty when the policy has no quota rule)."""
    if not quota_rules(policy):
        return {}
    rule = {
        "header": ":path",  # every request has one: the mark is a constant
        "onHeaderPresent": {
            "metadataNamespace": MARK_NAMESPACE,
            "key": mark_key(policy),
            "value": MARK_VALUE,
        },
    }
    return {ROUTE_MARK_FILTER: {"@type": _HEADER_TO_METADATA, "requestRules": [rule]}}
