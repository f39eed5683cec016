"""BackendTrafficPolicy → envoyproxy/ratelimit config and Envoy route actions.

The descriptor *keys* follow Envoy Gateway's translator
(``internal/xds/translator/ratelimit.go``: ``rule-R-match-M``,
``rule-R-match--1`` for a rule without selectors, ``masked_remote_address``,
``remote_address``, a ``generic_key`` naming the route first), so operators
who know it can read ours. The *domain* and the route node's name are ours:
Envoy Gateway uses one domain per listener (or gateway) and the xDS route
name, neither of which exists here, where a policy is compiled for a cluster
without the gateway's listeners. Everything is produced in one place for
both halves: the descriptor *tree* the rate-limit service loads, and the
route *actions* that make Envoy send matching descriptors. A rule becomes one
chain under the route's node; the limit sits on the chain's last entry, at
exactly the depth of the descriptor Envoy sends.

- Domain: ``<cluster>/<namespace>/<policy>``, one per policy, selected per
  route through ``RateLimitPerRoute.domain`` so policies never share counters
  by accident.
- Route node: ``generic_key`` ``httproute/<ns>/<route>`` (or
  ``gateway/<ns>/<gateway>``), key = value.
- Per rule R and selector entry M: ``rule-R-match-M``: Exact/RegularExpression
  headers use ``header_value_match`` (key = value), Distinct headers use
  ``request_headers`` (key only: one counter per value); ``sourceCIDR`` uses
  Envoy's ``masked_remote_address`` action with the CIDR's prefix length, so
  a client inside the range sends ``masked_remote_address`` = the CIDR, the
  node's value (a client outside sends another network, which matches
  nothing); Distinct adds ``remote_address``.
  A rule without selectors uses ``generic_key`` ``rule-R-match--1``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import yaml

from mgmt_api.compiler.jwt_claims import ClaimMatchType, claim_action
from mgmt_api.compiler.protojson import JsonDict
from mgmt_api.compiler.traffic_policy import (
    BackendTrafficPolicy,
    MatchType,
    RateLimitAlgorithm,
    RateLimitRule,
    SourceMatchType,
)


@dataclass(frozen=True)
class Entry:
    """One descriptor entry: the RLS tree node and the Envoy action for it."""

    key: str
    value: str | None  # None: key-only node (distinct values)
    action: JsonDict


def domain_of(cluster: str, policy: BackendTrafficPolicy) -> str:
    return f"{cluster}/{policy.metadata.namespace}/{policy.metadata.name}"


def route_key(policy: BackendTrafficPolicy) -> str:
    ref = policy.spec.target_ref
    prefix = "httproute" if ref.kind == "HTTPRoute" else "gateway"
    return f"{prefix}/{policy.metadata.namespace}/{ref.name}"


def rule_entries(index: int, rule: RateLimitRule) -> list[Entry]:
    entries: list[Entry] = []
    match_index = 0
    for selector in rule.client_selectors:
        for header in selector.headers:
            key = f"rule-{index}-match-{match_index}"
            match_index += 1
            if header.type is MatchType.DISTINCT:
                entries.append(
                    Entry(
                        key,
                        None,
                        {"requestHeaders": {"headerName": header.name, "descriptorKey": key}},
                    )
                )
                continue
            matcher: JsonDict = {"name": header.name}
            if header.type is MatchType.EXACT:
                matcher["stringMatch"] = {"exact": header.value}
            else:
                matcher["stringMatch"] = {"safeRegex": {"regex": header.value}}
            entries.append(
                Entry(
                    key,
                    key,
                    {
                        "headerValueMatch": {
                            "descriptorKey": key,
                            "descriptorValue": key,
                            "expectMatch": not header.invert,
                            "headers": [matcher],
                        }
                    },
                )
            )
        cidr = selector.source_cidr
        if cidr is not None:
            network = ipaddress.ip_network(cidr.value)
            mask_field = "v4PrefixMaskLen" if network.version == 4 else "v6PrefixMaskLen"
            entries.append(
                Entry(
                    "masked_remote_address",
                    cidr.value,
                    {"maskedRemoteAddress": {mask_field: network.prefixlen}},
                )
            )
            if cidr.type is SourceMatchType.DISTINCT:
                entries.append(Entry("remote_address", None, {"remoteAddress": {}}))
        for claim in selector.jwt_claims:
            key = f"rule-{index}-match-{match_index}"
            match_index += 1
            value = None if claim.type is ClaimMatchType.DISTINCT else claim.value
            entries.append(Entry(key, value, claim_action(key, claim.name)))
    if not entries:
        key = f"rule-{index}-match--1"
        entries.append(
            Entry(key, key, {"genericKey": {"descriptorKey": key, "descriptorValue": key}})
        )
    return entries


def _rate_limit(rule: RateLimitRule) -> JsonDict:
    """A rule's ``rate_limit``; ``unit_multiplier`` only when not one, so
    one-unit rules compile exactly as an operator would write them."""
    out: JsonDict = {"unit": rule.limit.unit.rls_unit, "requests_per_unit": rule.limit.requests}
    if rule.limit.multiplier != 1:
        out["unit_multiplier"] = rule.limit.multiplier
    if rule.algorithm is RateLimitAlgorithm.SLIDING_WINDOW:
        out["algorithm"] = "sliding_window"
    return out


def compile_policy(cluster: str, policy: BackendTrafficPolicy) -> JsonDict:
    """The envoyproxy/ratelimit YAML document (as a dict) for one policy."""
    route = route_key(policy)
    chains: list[JsonDict] = []
    for index, rule in enumerate(policy.spec.rate_limit.global_.rules):
        leaf: JsonDict | None = None
        for entry in reversed(rule_entries(index, rule)):
            node: JsonDict = {"key": entry.key}
            if entry.value is not None:
                node["value"] = entry.value
            if rule.shadow_mode:
                node["shadow_mode"] = True
            if leaf is None:
                node["rate_limit"] = _rate_limit(rule)
            else:
                node["descriptors"] = [leaf]
            leaf = node
        assert leaf is not None
        chains.append(leaf)
    return {
        "domain": domain_of(cluster, policy),
        "descriptors": [{"key": route, "value": route, "descriptors": chains}],
    }


def render_rls_files(cluster: str, policies: list[BackendTrafficPolicy]) -> dict[str, bytes]:
    """One YAML file per policy, named so directory order is stable."""
    files: dict[str, bytes] = {}
    for policy in sorted(policies, key=lambda p: (p.metadata.namespace, p.metadata.name)):
        name = f"{policy.metadata.namespace}--{policy.metadata.name}.yaml"
        files[name] = yaml.safe_dump(
            compile_policy(cluster, policy), sort_keys=False, default_flow_style=False
        ).encode()
    return files


def has_exact_rules(policy: BackendTrafficPolicy) -> bool:
    """Whether any rule of the policy calls the rate-limit service per request."""
    return any(not rule.quota for rule in policy.spec.rate_limit.global_.rules)


def route_rate_limits(cluster: str, policy: BackendTrafficPolicy) -> JsonDict:
    """The ``RateLimitPerRoute`` (protojson) that makes Envoy send matching descriptors
    for the policy's exact rules (its quota rules are the quota filters')."""
    route = route_key(policy)
    rate_limits: list[JsonDict] = []
    for index, rule in enumerate(policy.spec.rate_limit.global_.rules):
        if rule.quota:  # enforced by the quota filter (mgmt_api/compiler/quota.py)
            continue
        actions: list[JsonDict] = [
            {"genericKey": {"descriptorKey": route, "descriptorValue": route}},
            *(entry.action for entry in rule_entries(index, rule)),
        ]
        rate_limit: JsonDict = {"actions": actions}
        if rule.cost is not None:
            rate_limit["hitsAddend"] = {"number": str(rule.cost.request.number)}
        rate_limits.append(rate_limit)
    return {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
        "domain": domain_of(cluster, policy),
        "rateLimits": rate_limits,
    }
