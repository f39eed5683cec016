"""The BackendTrafficPolicy resource (docs/api.md), in Envoy Gateway's shape.

Validation lives in these models so the REST layer, the compiler and the
tests agree on one definition. Field names and shapes follow Envoy Gateway's
``gateway.envoyproxy.io/v1alpha1`` API (``cost.request`` is its
``{from: Number, number: N}``; a bare integer is accepted too and stored in
that form); the subset accepted is the one the platform enforces (global
rules only; units up to Day; costs from a number, not from metadata;
``targetRef`` a Gateway API ``HTTPRoute`` or ``Gateway``).

Numbers and booleans are strict: ``requests: "3"``, ``3.0`` or ``true`` is
refused naming the field instead of being coerced, and the REST layer stores
this model's dump, so what is stored is exactly what the compiler reads.
"""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from extauthz.contract import MAX_METADATA_CLAIMS
from mgmt_api.compiler.jwt_claims import JwtClaimMatch
from mgmt_api.fqn import is_name

API_VERSION = "gateway.envoyproxy.io/v1alpha1"
KIND = "BackendTrafficPolicy"
GATEWAY_API_GROUP = "gateway.networking.k8s.io"
MAX_RULES = 256
MAX_SELECTORS = 8
MAX_HEADERS = 128
#: Claims one selector may name; a policy's claims are published by ext_authz,
#: which caps them (extauthz.contract.MAX_METADATA_CLAIMS).
MAX_JWT_CLAIMS = 4

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
#: An HTTP field name (an RFC 9110 token); the API's one rule for header names.
HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class RateLimitUnit(StrEnum):
    """Units the platform accepts (Envoy Gateway also has Week..Year)."""

    SECOND = "Second"
    MINUTE = "Minute"
    HOUR = "Hour"
    DAY = "Day"

    @property
    def rls_unit(self) -> str:
        """The unit as envoyproxy/ratelimit's YAML spells it."""
        return self.value.upper()

    @property
    def seconds(self) -> int:
        return _UNIT_SECONDS[self]


_UNIT_SECONDS = {
    RateLimitUnit.SECOND: 1,
    RateLimitUnit.MINUTE: 60,
    RateLimitUnit.HOUR: 3600,
    RateLimitUnit.DAY: 86400,
}
#: The longest window a rule may have (unit times unitMultiplier): 365 days.
MAX_WINDOW_SECONDS = 365 * 86400


class RateLimitAlgorithm(StrEnum):
    """How a rule counts: fixed windows (spec 4.10.2, the default) or the
    weighted two-window sliding count (docs/ratelimit.md, "Algorithms")."""

    FIXED_WINDOW = "FixedWindow"
    SLIDING_WINDOW = "SlidingWindow"


class RateLimitMode(StrEnum):
    """How a rule is enforced (docs/ratelimit.md, "Global limits as quotas").

    ``exact``: the gateway calls the rate-limit service on every request
    (ShouldRateLimit), which counts exactly and answers the x-ratelimit
    headers. ``quota``: the gateway enforces a token-bucket share of the
    limit itself and reports its usage every few seconds (RLQS); no call per
    request, and the sum across gateways is approximate.
    """

    EXACT = "exact"
    QUOTA = "quota"


class MatchType(StrEnum):
    EXACT = "Exact"
    REGULAR_EXPRESSION = "RegularExpression"
    DISTINCT = "Distinct"


class SourceMatchType(StrEnum):
    EXACT = "Exact"
    DISTINCT = "Distinct"


class HeaderMatch(_Model):
    name: str = Field(min_length=1, max_length=256)
    type: MatchType = MatchType.EXACT
    value: str | None = Field(default=None, max_length=1024)
    invert: StrictBool = False

    @field_validator("name")
    @classmethod
    def _token(cls, v: str) -> str:
        if not HEADER_NAME.match(v):
            raise ValueError("must be an HTTP header name")
        return v.lower()

    @model_validator(mode="after")
    def _value_rules(self) -> HeaderMatch:
        if self.type is MatchType.DISTINCT:
            if self.value is not None:
                raise ValueError("value must be empty when type is Distinct")
            if self.invert:
                raise ValueError("invert is not supported when type is Distinct")
        elif not self.value:
            raise ValueError(f"value is required when type is {self.type.value}")
        if self.type is MatchType.REGULAR_EXPRESSION:
            try:
                re.compile(self.value or "")
            except re.error as exc:
                raise ValueError(f"value is not a valid regular expression: {exc}") from exc
        return self


class SourceMatch(_Model):
    type: SourceMatchType = SourceMatchType.EXACT
    value: str
    invert: StrictBool = False

    @field_validator("value")
    @classmethod
    def _cidr(cls, v: str) -> str:
        try:
            return str(ipaddress.ip_network(v, strict=False))
        except ValueError as exc:
            raise ValueError(f"not a CIDR: {v!r}") from exc

    @model_validator(mode="after")
    def _not_inverted(self) -> SourceMatch:
        # Envoy's masked_remote_address action (what the route renders) cannot
        # express "outside this range"; accepting invert would store a rule
        # that never matches.
        if self.invert:
            raise ValueError("invert is not supported for sourceCIDR")
        return self


class RateLimitSelectCondition(_Model):
    headers: tuple[HeaderMatch, ...] = Field(default=(), max_length=MAX_HEADERS)
    source_cidr: SourceMatch | None = Field(default=None, alias="sourceCIDR")
    jwt_claims: tuple[JwtClaimMatch, ...] = Field(
        default=(), alias="jwtClaims", max_length=MAX_JWT_CLAIMS
    )

    @model_validator(mode="after")
    def _not_empty(self) -> RateLimitSelectCondition:
        if not self.headers and self.source_cidr is None and not self.jwt_claims:
            raise ValueError("a client selector needs headers, sourceCIDR or jwtClaims")
        return self


class RateLimitValue(_Model):
    """``requests`` per window of ``unitMultiplier`` units (default one unit).

    The window is capped at 365 days, as the service caps ``unit_multiplier``
    (ratelimit/config.py): a longer one is a typo far more often than a policy.
    """

    requests: StrictInt = Field(ge=0, le=4294967295)
    unit: RateLimitUnit
    # None (absent) rather than 1, so stored policies that never set it keep their shape.
    unit_multiplier: StrictInt | None = Field(default=None, ge=1, alias="unitMultiplier")

    @property
    def multiplier(self) -> int:
        """How many units the window is (absent: one)."""
        return self.unit_multiplier or 1

    @model_validator(mode="after")
    def _window_cap(self) -> RateLimitValue:
        most = MAX_WINDOW_SECONDS // self.unit.seconds
        if self.multiplier > most:
            raise ValueError(
                f"unitMultiplier {self.unit_multiplier} makes a window longer than 365 days;"
                f" at most {most} with unit {self.unit.value}"
            )
        return self


class RateLimitCostSpecifier(_Model):
    """Envoy Gateway's ``RateLimitCostSpecifier``: ``{from: Number, number: N}``.

    ``from: Metadata`` (a cost read from dynamic metadata) is Envoy Gateway's
    too, but not rendered by this platform, so it is refused.
    """

    from_: Literal["Number"] = Field(alias="from")
    number: StrictInt = Field(ge=0, le=4294967295)


class RateLimitCost(_Model):
    """How many hits a request takes from the bucket (Envoy's ``hits_addend``).

    Envoy Gateway's ``response`` cost (charged when the response ends) is not
    supported: it needs Envoy's ``apply_on_stream_done``, which the rendered
    route actions do not set.
    """

    request: RateLimitCostSpecifier

    @field_validator("request", mode="before")
    @classmethod
    def _bare_number(cls, v: Any) -> Any:
        # The integer form documented before Envoy Gateway's shape was adopted.
        if isinstance(v, int) and not isinstance(v, bool):
            return {"from": "Number", "number": v}
        return v


class RateLimitRule(_Model):
    client_selectors: tuple[RateLimitSelectCondition, ...] = Field(
        default=(), alias="clientSelectors", max_length=MAX_SELECTORS
    )
    limit: RateLimitValue
    cost: RateLimitCost | None = None
    shadow_mode: StrictBool = Field(default=False, alias="shadowMode")
    # None (absent) means FixedWindow, and keeps stored policies' shape.
    algorithm: RateLimitAlgorithm | None = None
    # None (absent) means exact, and keeps stored policies' shape.
    mode: RateLimitMode | None = None

    @property
    def quota(self) -> bool:
        return self.mode is RateLimitMode.QUOTA

    @model_validator(mode="after")
    def _quota_expressible(self) -> RateLimitRule:
        """A quota rule is enforced by Envoy's rate_limit_quota filter, which takes
        one token a request from a token bucket and matches request headers only:
        what it cannot express is refused, naming the field, rather than enforced
        differently."""
        if not self.quota:
            return self
        refused = {
            "cost": self.cost is not None,
            "shadowMode": self.shadow_mode,
            "algorithm": self.algorithm is RateLimitAlgorithm.SLIDING_WINDOW,
        }
        for name, bad in refused.items():
            if bad:
                raise ValueError(f"{name}: not supported with mode quota (use mode exact)")
        for i, selector in enumerate(self.client_selectors):
            if selector.source_cidr is not None:
                raise ValueError(
                    f"clientSelectors[{i}].sourceCIDR: not supported with mode quota"
                    " (the quota filter matches request headers only)"
                )
            if selector.jwt_claims:
                raise ValueError(
                    f"clientSelectors[{i}].jwtClaims: not supported with mode quota"
                    " (the quota filter matches request headers only)"
                )
            for j, header in enumerate(selector.headers):
                if header.invert:
                    raise ValueError(
                        f"clientSelectors[{i}].headers[{j}].invert: not supported with mode quota"
                    )
        return self


class GlobalRateLimit(_Model):
    rules: tuple[RateLimitRule, ...] = Field(min_length=1, max_length=MAX_RULES)

    @model_validator(mode="after")
    def _claims_publishable(self) -> GlobalRateLimit:
        # ext_authz publishes at most this many claims per policy.
        names = {c.name for r in self.rules for s in r.client_selectors for c in s.jwt_claims}
        if len(names) > MAX_METADATA_CLAIMS:
            raise ValueError(
                f"the rules select on {len(names)} JWT claims; at most "
                f"{MAX_METADATA_CLAIMS} can be published by ext_authz"
            )
        return self


class RateLimitSpec(_Model):
    type: Literal["Global"] = "Global"
    global_: GlobalRateLimit = Field(alias="global")


class TargetRef(_Model):
    """A Gateway API route or gateway: what Envoy Gateway's policy attaches to."""

    group: Literal["gateway.networking.k8s.io"] = "gateway.networking.k8s.io"
    kind: Literal["HTTPRoute", "Gateway"] = "HTTPRoute"
    name: str

    @field_validator("name")
    @classmethod
    def _dns(cls, v: str) -> str:
        if not _DNS_SUBDOMAIN.match(v):
            raise ValueError("must be a DNS-1123 subdomain")
        return v


class Metadata(_Model):
    name: str
    namespace: str = "default"

    @field_validator("name", "namespace")
    @classmethod
    def _dns(cls, v: str) -> str:
        if not is_name(v):
            raise ValueError("must be a DNS-1123 label")
        return v


class BackendTrafficPolicySpec(_Model):
    target_ref: TargetRef = Field(alias="targetRef")
    rate_limit: RateLimitSpec = Field(alias="rateLimit")


class BackendTrafficPolicy(_Model):
    """One policy; ``apiVersion`` and ``kind`` are checked when present."""

    api_version: Literal["gateway.envoyproxy.io/v1alpha1"] = Field(
        default="gateway.envoyproxy.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["BackendTrafficPolicy"] = "BackendTrafficPolicy"
    metadata: Metadata
    spec: BackendTrafficPolicySpec
