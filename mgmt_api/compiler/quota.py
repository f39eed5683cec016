"""BackendTrafficPolicy rules in ``mode: quota`` → Envoy's ``rate_limit_quota`` filters.

A quota rule is enforced inside the gateway: Envoy's filter takes a token from
a bucket the rate-limit service assigned (RLQS, docs/ratelimit.md "Global
limits as quotas") and reports its usage every 5 s, with no call per request.
Each quota rule becomes one filter, so that, as with the exact path, every rule
of a route applies to a request (one filter's matcher picks one bucket):

- named ``envoy.filters.http.rate_limit_quota/<namespace>/<policy>/<rule>``,
  on the listener but disabled there, and enabled by the routes the policy
  targets (``FilterConfig{disabled: false}``); a filter that is not enabled
  is not even created for a request;
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
_ROUTE_FILTER_CONFIG = _TYPE + "envoy.config.route.v3.FilterConfig"


def filter_name(policy: BackendTrafficPolicy, index: int) -> str:
    return f"{QUOTA_FILTER}/{policy.metadata.namespace}/{policy.metadata.name}/{index}"


def quota_rules(policy: BackendTrafficPolicy) -> list[tuple[int, RateLimitRule]]:
    return [(i, r) for i, r in enumerate(policy.spec.rate_limit.global_.rules) if r.quota]


def _header_input(name: str) -> JsonDict:
    return {"name": "header", "typedConfig": {"@type": _HEADER_INPUT, "headerName": name}}


def _predicate(entries: list[Entry]) -> JsonDict:
    """Every Exact/RegularExpression header must match; a Distinct one must be present."""
    singles: list[JsonDict] = []
    for entry in entries:
        matched = entry.action.get("headerValueMatch")
        if matched is not None:
            (header,) = matched["headers"]
            singles.append(
                {"input": _header_input(header["name"]), "valueMatch": header["stringMatch"]}
            )
        distinct = entry.action.get("requestHeaders")
        if distinct is not None:
            singles.append(
                {
                    "input": _header_input(distinct["headerName"]),
                    "valueMatch": {"safeRegex": {"regex": ".*"}},
                }
            )
    if not singles:  # a rule without selectors: every request (":path" is always there)
        singles.append(
            {"input": _header_input(":path"), "valueMatch": {"safeRegex": {"regex": ".*"}}}
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
                    "predicate": _predicate(entries),
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


def route_enables(policy: BackendTrafficPolicy) -> JsonDict:
    """The route's ``typedPerFilterConfig`` entries that enable the policy's quota filters."""
    return {
        filter_name(policy, index): {"@type": _ROUTE_FILTER_CONFIG, "disabled": False}
        for index, _ in quota_rules(policy)
    }
