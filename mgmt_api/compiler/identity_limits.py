"""Per-identity rate limits across the two services: which claims ext_authz must publish.

A BackendTrafficPolicy rule that selects on ``jwtClaims`` counts the claims
ext_authz publishes after verifying the token (:mod:`mgmt_api.compiler.jwt_claims`).
This module joins the two halves of a cluster, the way the gateway does
(:mod:`mgmt_api.compiler.gateway_xds`):

- the routes a policy applies to: its ``HTTPRoute``, or for a ``Gateway``
  target every HTTPRoute attached to that gateway without a policy of its own;
- the ext_authz policy that checks such a route: that of the first
  SecuritySetting (by name) selecting the route's namespace, unless it
  disables ext_authz or names no policy.

The result, :class:`ClaimLimits`, says which claims each ext_authz policy
publishes (the union over the routes it checks, so a policy publishes only
what some limit reads), and lists the errors the cluster's status shows: a
policy selecting on claims for a route no ext_authz policy checks can never
see a verified claim there; its rules on claims then never apply (Envoy sends
no descriptor without the claim), and the policy's other rules still do.

Pure: no store, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from extauthz.contract import MAX_METADATA_CLAIMS
from mgmt_api.compiler.envoy_config import ExtAuthzRoute
from mgmt_api.compiler.http_route import HTTPRoute
from mgmt_api.compiler.traffic_policy import BackendTrafficPolicy


class ClaimLimitErrorJson(TypedDict):
    """A :class:`ClaimLimitError` as the cluster's status lists it (``policyErrors``)."""

    policy: str
    route: str
    message: str


@dataclass(frozen=True)
class ClaimLimitError:
    """A policy whose claim selectors cannot work where it applies."""

    policy: str  # the BackendTrafficPolicy's FQN
    route: str  # httproute/<namespace>/<name>
    message: str

    def to_json(self) -> ClaimLimitErrorJson:
        return {"policy": self.policy, "route": self.route, "message": self.message}


@dataclass(frozen=True)
class ClaimLimits:
    """ext_authz policy name → claims it publishes (sorted), and the errors found."""

    published: dict[str, tuple[str, ...]] = field(default_factory=dict)
    errors: tuple[ClaimLimitError, ...] = ()


def claim_names(policy: BackendTrafficPolicy) -> tuple[str, ...]:
    """Every claim the policy's rules select on, sorted, each once."""
    return tuple(
        sorted(
            {
                claim.name
                for rule in policy.spec.rate_limit.global_.rules
                for selector in rule.client_selectors
                for claim in selector.jwt_claims
            }
        )
    )


def _attached(route: HTTPRoute, gateway: str) -> bool:
    refs = route.spec.parent_refs
    return not refs or any(ref.name == gateway for ref in refs)


def _routes_of(
    policy: BackendTrafficPolicy,
    http_routes: Sequence[HTTPRoute],
    own: set[tuple[str, str]],
) -> list[tuple[str, str]]:
    """(namespace, name) of the HTTPRoutes the policy's limits apply to."""
    ref = policy.spec.target_ref
    if ref.kind == "HTTPRoute":
        return [(policy.metadata.namespace, ref.name)]
    out = []
    for route in http_routes:
        key = (route.metadata.namespace, route.metadata.name)
        if key not in own and _attached(route, ref.name):
            out.append(key)
    return sorted(out)


def _checking_policy(namespace: str, settings: Sequence[ExtAuthzRoute]) -> str | None:
    """The ext_authz policy that checks a route in ``namespace``, or None if none does."""
    for setting in settings:  # sorted by setting, as the gateway picks the first
        if "*" in setting.namespaces or namespace in setting.namespaces:
            return None if setting.skips_ext_authz else setting.policy
    return None


def compile_claim_limits(
    traffic_policies: Iterable[tuple[str, BackendTrafficPolicy]],
    ext_authz: Iterable[ExtAuthzRoute],
    http_routes: Iterable[HTTPRoute],
) -> ClaimLimits:
    """What ext_authz publishes for the cluster's claim limits, and where they cannot work."""
    settings = sorted(ext_authz, key=lambda e: e.setting)
    routes = list(http_routes)
    ordered = sorted(traffic_policies, key=lambda p: p[0])
    own = {
        (p.metadata.namespace, p.spec.target_ref.name)
        for _, p in ordered
        if p.spec.target_ref.kind == "HTTPRoute"
    }
    wanted: dict[str, set[str]] = {}
    errors: list[ClaimLimitError] = []
    for fqn, policy in ordered:
        names = claim_names(policy)
        if not names:
            continue
        for namespace, name in _routes_of(policy, routes, own):
            route = f"httproute/{namespace}/{name}"
            checker = _checking_policy(namespace, settings)
            if checker is None:
                errors.append(
                    ClaimLimitError(
                        fqn,
                        route,
                        f"{fqn} selects on JWT claims ({', '.join(names)}) for {route}, "
                        "which no ext_authz policy checks: no verified claim reaches it, so "
                        "the rules selecting on claims never apply there (the others do)",
                    )
                )
                continue
            wanted.setdefault(checker, set()).update(names)
    published: dict[str, tuple[str, ...]] = {}
    for checker, names_wanted in sorted(wanted.items()):
        chosen = tuple(sorted(names_wanted))
        if len(chosen) > MAX_METADATA_CLAIMS:
            dropped = chosen[MAX_METADATA_CLAIMS:]
            chosen = chosen[:MAX_METADATA_CLAIMS]
            errors.append(
                ClaimLimitError(
                    "",
                    "",
                    f"ext_authz policy {checker} would publish {len(names_wanted)} claims; "
                    f"at most {MAX_METADATA_CLAIMS} are published, so rules on "
                    f"{', '.join(dropped)} never apply on its routes",
                )
            )
        published[checker] = chosen
    return ClaimLimits(published, tuple(errors))
