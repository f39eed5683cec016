"""The three policy kinds the console edits, as data (pure).

Each entry says which kind it edits (where that kind lives in ``/v2``, its
collection, body and list fields, comes from the one table of kinds,
:mod:`meshplane.kinds_contract`), how its form looks, and where its
distribution status is. The routes and templates are generic over these
entries, so a fourth kind (an Envoy Gateway ``SecurityPolicy``, say) is one
more entry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from meshplane.kinds_contract import COMMON_OUTPUT_ONLY, SHAPES, Kind
from mgmt_api.console.forms import FieldDef, get_path

RULES = "spec.rateLimit.global.rules"
UNITS = ("Second", "Minute", "Hour", "Day")
MODES = ("UNSET", "NAMESPACE", "GROUP", "WORKSPACE", "CLUSTER", "DISABLED", "CUSTOM", "RULES")


@dataclass(frozen=True)
class PolicyKind:
    slug: str  # URL segment of the console: /ui/.../{slug}/{name}
    kind: Kind  # the API kind
    title: str
    plural: str  # the title of a list of them
    parent: str  # "cluster" or "group"
    fields: Callable[[Mapping[str, Any] | None], list[FieldDef]]
    name_help: str
    summary: Callable[[Mapping[str, Any]], str]

    @property
    def collection(self) -> str:
        """The API collection under the parent."""
        return SHAPES[self.kind].collection

    @property
    def body_field(self) -> str:
        return SHAPES[self.kind].body_field

    @property
    def list_field(self) -> str:
        return SHAPES[self.kind].list_field


def _traffic_fields(obj: Mapping[str, Any] | None) -> list[FieldDef]:
    """The route, and one row per rule plus an empty row to add one."""
    rules = get_path(obj or {}, RULES) or []
    out = [
        FieldDef("spec.targetRef.kind", "Target kind", "select", ("HTTPRoute", "Gateway")),
        FieldDef(
            "spec.targetRef.name",
            "Target name",
            required=True,
            help="The HTTPRoute (or Gateway) to limit.",
        ),
        FieldDef("spec.rateLimit.type", "Type", "select", ("Global",)),
    ]
    for i in range(len(rules) + 1):
        group = f"Rule {i + 1}" if i < len(rules) else "Add a rule"
        prefix = f"{RULES}[{i}]"
        out += [
            FieldDef(f"{prefix}.limit.requests", "Requests", "number", group=group),
            FieldDef(f"{prefix}.limit.unit", "per", "select", ("", *UNITS), group=group),
            FieldDef(
                f"{prefix}.clientSelectors",
                "Client selectors (JSON, optional)",
                "json",
                help='e.g. [{"headers": [{"name": "x-user", "type": "Distinct"}]}]',
                group=group,
            ),
        ]
    out.append(
        FieldDef("spec.rateLimit.global.shadowMode", "Shadow mode (count, never deny)", "checkbox")
    )
    return out


def _setting_fields(_obj: Mapping[str, Any] | None) -> list[FieldDef]:
    return [
        FieldDef("authorization.mode", "Authorization mode", "select", MODES),
        FieldDef(
            "authorization.serviceAccounts",
            "Service accounts (mode CUSTOM, one per line)",
            "lines",
            help="ns/sa, ns/*, ./sa or ./*",
        ),
        FieldDef(
            "authorization.http.external.uri",
            "External authorization server",
            help="grpc://host:port of the ext_authz service",
        ),
        FieldDef(
            "authorization.http.external.policy",
            "JWT policy",
            help="A JWT policy of this security group",
        ),
        FieldDef(
            "authorization.http.external.includeRequestHeadersInCheck",
            "Headers sent to the check (one per line)",
            "lines",
        ),
        FieldDef(
            "authorization.http.local",
            "Local JWT rules (JSON, optional)",
            "json",
            help='{"rules": [{"from": [{"jwt": {"iss": "...", "sub": "..."}}], "to": '
            '[{"paths": ["/api/*"], "methods": ["GET"]}]}], "keys": {"jwks": {"uri": '
            '"https://..."}}}: checked by the proxies themselves (docs/mesh.md)',
        ),
    ]


def _jwt_fields(_obj: Mapping[str, Any] | None) -> list[FieldDef]:
    return [
        FieldDef(
            "jwt.algorithms", "Algorithms (comma separated)", "csv", help="HS256, RS256, ES256, ..."
        ),
        FieldDef(
            "jwt.keys",
            "Keys (JSON)",
            "json",
            help='[{"hmacSecret": {"value": "..."}}] or [{"jwks": {"uri": "https://..."}}]; '
            "stored secrets show as <redacted sha256:...> and are kept as they are",
        ),
        FieldDef("jwt.issuer", "Issuer"),
        FieldDef("jwt.audiences", "Audiences (comma separated)", "csv"),
        FieldDef("jwt.leewaySeconds", "Leeway (seconds)", "number"),
        FieldDef(
            "pathClaim.name", "Path claim", help="A claim whose base64 value must prefix the path"
        ),
        FieldDef("pathClaim.match", "Path match", "select", ("", "PREFIX", "SEGMENT")),
        FieldDef("removeAuthorization", "Remove the Authorization header upstream", "checkbox"),
        FieldDef("claimsToHeaders", "Claims to headers (JSON, optional)", "json"),
    ]


def _traffic_summary(obj: Mapping[str, Any]) -> str:
    rules = get_path(obj, RULES) or []
    limits = ", ".join(
        f"{get_path(r, 'limit.requests')}/{get_path(r, 'limit.unit')}"
        for r in rules
        if isinstance(r, dict)
    )
    target = get_path(obj, "spec.targetRef.name") or "?"
    return f"{get_path(obj, 'spec.targetRef.kind') or 'HTTPRoute'} {target}: {limits or 'no rules'}"


def _setting_summary(obj: Mapping[str, Any]) -> str:
    uri = get_path(obj, "authorization.http.external.uri")
    policy = get_path(obj, "authorization.http.external.policy")
    mode = get_path(obj, "authorization.mode") or "UNSET"
    return f"{mode}" + (f", ext_authz {uri}" if uri else "") + (f" with {policy}" if policy else "")


def _jwt_summary(obj: Mapping[str, Any]) -> str:
    algorithms = ", ".join(get_path(obj, "jwt.algorithms") or [])
    claim = get_path(obj, "pathClaim.name")
    return f"{algorithms or 'no algorithm'}" + (f", path claim {claim}" if claim else "")


POLICY_PAGES: dict[str, PolicyKind] = {
    k.slug: k
    for k in (
        PolicyKind(
            "traffic",
            Kind.BACKEND_TRAFFIC_POLICY,
            "Rate limit (BackendTrafficPolicy)",
            "Rate limits",
            "cluster",
            _traffic_fields,
            "namespace.name, e.g. default.web-limit",
            _traffic_summary,
        ),
        PolicyKind(
            "settings",
            Kind.SECURITY_SETTING,
            "Security setting",
            "Security settings",
            "group",
            _setting_fields,
            "a DNS label, e.g. ext-authz",
            _setting_summary,
        ),
        PolicyKind(
            "jwt",
            Kind.EXT_AUTHZ_POLICY,
            "JWT policy",
            "JWT policies",
            "group",
            _jwt_fields,
            "a DNS label, e.g. jwt",
            _jwt_summary,
        ),
    )
}

# What a new object starts from (the form shows these values).
TEMPLATES: dict[str, dict[str, Any]] = {
    "traffic": {
        "spec": {
            "targetRef": {"kind": "HTTPRoute", "name": ""},
            "rateLimit": {
                "type": "Global",
                "global": {"rules": [{"limit": {"requests": 10, "unit": "Minute"}}]},
            },
        }
    },
    "settings": {
        "authorization": {"mode": "CLUSTER", "http": {"external": {"uri": "grpc://extauthz:9191"}}}
    },
    "jwt": {
        "jwt": {"algorithms": ["HS256"], "keys": []},
        "pathClaim": {"name": "path", "match": "PREFIX"},
    },
}

# Output-only fields: shown, never sent back in a form's body.
OUTPUT_ONLY = COMMON_OUTPUT_ONLY


def editable(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object without its output-only fields (the base a form edits)."""
    return {k: v for k, v in obj.items() if k not in OUTPUT_ONLY}
