"""SecuritySetting: a security group's authorization settings.

The reference's ``AuthorizationSettings`` is ``{mode, serviceAccounts[],
http}``. ``mode: CUSTOM`` means "the workloads may be called by exactly these
service accounts", given as ``ns/sa``, ``ns/*`` or ``./*`` (``.``: the
workload's namespace). ``mode`` and ``serviceAccounts`` govern
workload-to-workload (mTLS identity) authorization, enforced by the sidecars'
RBAC on the caller's SPIFFE id (``mgmt_api.compiler.mesh_authz``; the table of
what each mode admits is in docs/mesh.md; ``RULES`` is not modelled and
refuses). ``http.external`` is the ext_authz server Envoy calls, with any
mode, at gateways and sidecars; ``http.local`` are local JWT rules Envoy
enforces itself, whose inline keys are write-only (:data:`SECRETS`: a read
shows a fingerprint marker, an update that sends it back keeps the key).
``mode: DISABLED`` turns all of it off.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field

from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.compiler.key_material import Material, SecretField, is_public_pem, jwks_problem
from mgmt_api.compiler.traffic_policy import HEADER_NAME
from mgmt_api.domain.uris import check_grpc_uri
from mgmt_api.errors import invalid
from mgmt_api.kinds.base import Behaviour, KindDef, Write
from mgmt_api.schemas.base import ApiModel
from mgmt_api.schemas.resources import Meta

AuthorizationMode = Literal[
    "UNSET", "NAMESPACE", "GROUP", "WORKSPACE", "CLUSTER", "DISABLED", "CUSTOM", "RULES"
]

# ``ns/sa``, ``ns/*``, ``./sa`` or ``./*`` (``.``: the setting's own namespaces).
_SERVICE_ACCOUNT = re.compile(
    r"^(\.|[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)/(\*|[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)$"
)


class ExternalAuthorization(ApiModel):
    uri: str = Field(description="grpc://host:port of the ext_authz server.")
    policy: str | None = Field(
        default=None,
        description="Name of an ExtAuthzPolicy of the same security group to enforce.",
    )
    include_request_headers_in_check: list[str] | None = Field(
        default=None,
        max_length=64,
        description="Request headers the server reads. With them, or with a policy named, "
        "a Check carries only these and authorization, traceparent and tracestate; with "
        "neither, every request header (method and path always).",
    )


_CLAIM = r"^[A-Za-z0-9_.:-]{1,128}$"
_MAX_HEADER_CHARS = 256
_METHOD = r"^(GET|HEAD|POST|PUT|DELETE|PATCH|OPTIONS|CONNECT|TRACE)$"


class LocalJwtMatch(ApiModel):
    """Claims a verified token must carry; every given one must match exactly."""

    iss: str | None = Field(default=None, min_length=1, max_length=512)
    sub: str | None = Field(default=None, min_length=1, max_length=512)
    other: dict[str, str] | None = Field(
        default=None,
        max_length=16,
        description="Further claims, name -> exact string value (names: [A-Za-z0-9_.:-]).",
    )


class LocalJwtSource(ApiModel):
    jwt: LocalJwtMatch


class LocalJwtTarget(ApiModel):
    # Paths are matched after Envoy's normalization, so only absolute paths
    # make sense; ``/x/*`` is a prefix, anything else exact.
    paths: list[str] | None = Field(default=None, max_length=64)
    methods: list[str] | None = Field(default=None, max_length=9)


class LocalJwtRule(ApiModel):
    """Allow when any ``from`` entry matches AND any ``to`` entry matches."""

    from_: list[LocalJwtSource] = Field(alias="from", min_length=1, max_length=32)
    to: list[LocalJwtTarget] | None = Field(default=None, max_length=32)


class LocalJwks(ApiModel):
    value: str | None = Field(default=None, max_length=65536)
    uri: str | None = Field(default=None, max_length=2048)


class LocalJwtKeys(ApiModel):
    """The keys tokens must verify with: an inline JWKS, a PEM public key, or a
    remote JWKS the proxy fetches itself (no key material passes through us)."""

    jwks: LocalJwks | None = None
    pem: str | None = Field(default=None, max_length=65536)


class LocalAuthorization(ApiModel):
    rules: list[LocalJwtRule] = Field(min_length=1, max_length=64)
    keys: LocalJwtKeys
    clock_skew: int = Field(
        default=0, ge=0, le=300, description="Seconds of exp/nbf leeway (default 0)."
    )


class HttpAuthorization(ApiModel):
    external: ExternalAuthorization | None = None
    local: LocalAuthorization | None = None


class AuthorizationSettings(ApiModel):
    mode: AuthorizationMode = "UNSET"
    http: HttpAuthorization | None = None
    service_accounts: list[str] | None = Field(
        default=None,
        max_length=256,
        description="With mode CUSTOM only: the service accounts allowed to call the "
        "group's workloads, as ns/sa, ns/* or ./* (. is the workload's namespace).",
    )


class SecuritySetting(Meta):
    """A security group's settings; only authorization is modelled."""

    authorization: AuthorizationSettings | None = None


_LOCAL_KEYS = ("authorization", "http", "local", "keys")
#: The local JWT keys given inline: write-only (:mod:`mgmt_api.compiler.key_material`).
#: An HMAC key (``k``) verifies and mints alike; a public JWKS or PEM reads back as is.
SECRETS = (
    SecretField((*_LOCAL_KEYS, "jwks", "value"), Material.KEY),
    SecretField((*_LOCAL_KEYS, "pem"), Material.KEY),
)


class SecuritySettingBehaviour(Behaviour):
    secrets = SECRETS

    def validate(self, write: Write) -> None:
        prefix = write.prefix
        authz = write.spec.get("authorization") or {}
        external = (authz.get("http") or {}).get("external")
        if external is not None:
            check_grpc_uri(f"{prefix}.authorization.http.external.uri", external.get("uri", ""))
            if external.get("policy") is not None:
                fqnmod.validate_name(
                    external["policy"], f"{prefix}.authorization.http.external.policy"
                )
            field = f"{prefix}.authorization.http.external.includeRequestHeadersInCheck"
            for i, header in enumerate(external.get("includeRequestHeadersInCheck") or []):
                # A leading ":" names an HTTP/2 pseudo-header (``:authority``).
                name = header.removeprefix(":")
                if len(name) > _MAX_HEADER_CHARS or not HEADER_NAME.match(name):
                    raise invalid(f"{field}[{i}]", f"{header!r} is not an HTTP header name")
        local = (authz.get("http") or {}).get("local")
        if local is not None:
            _validate_local(f"{prefix}.authorization.http.local", local)
        accounts = authz.get("serviceAccounts")
        field = f"{prefix}.authorization.serviceAccounts"
        if authz.get("mode") == "CUSTOM":
            if not accounts:
                raise invalid(field, "is required when mode is CUSTOM (ns/sa, ns/* or ./*)")
        elif accounts is not None:
            raise invalid(field, "is only allowed with mode CUSTOM")
        seen: set[str] = set()
        for i, account in enumerate(accounts or []):
            if not _SERVICE_ACCOUNT.match(account):
                raise invalid(
                    f"{field}[{i}]",
                    f"{account!r} is not ns/sa, ns/*, ./sa or ./* (DNS-1123 names)",
                )
            if account in seen:
                raise invalid(f"{field}[{i}]", f"{account!r} is listed twice")
            seen.add(account)


def _validate_local(field: str, local: dict[str, Any]) -> None:
    """What pydantic's shapes cannot say: one key source, sane names and paths.

    Checked here rather than coerced later so a bad rule is a 400 naming the
    field, never a rule that silently matches nothing (or everything)."""
    keys = local.get("keys") or {}
    jwks = keys.get("jwks") or {}
    sources = [k for k in ("value", "uri") if jwks.get(k) is not None]
    if keys.get("pem") is not None:
        sources.append("pem")
    if len(sources) != 1:
        raise invalid(f"{field}.keys", "give exactly one of jwks.value, jwks.uri or pem")
    problem = jwks_problem(jwks["value"]) if jwks.get("value") is not None else None
    if problem is not None:
        raise invalid(f"{field}.keys.jwks.value", problem)
    if keys.get("pem") is not None and not is_public_pem(keys["pem"]):
        # Verifying needs the public half only; the value is never quoted back.
        raise invalid(
            f"{field}.keys.pem",
            "must be PEM public keys (-----BEGIN PUBLIC KEY-----); a private key never "
            "belongs here, and an HMAC key goes in jwks.value as an oct JWK",
        )
    uri = jwks.get("uri")
    if uri is not None and not re.match(r"^https?://[^/\s]+(/\S*)?$", uri):
        raise invalid(f"{field}.keys.jwks.uri", f"{uri!r} is not an http(s) URL")
    rules = local.get("rules") or []
    for i, rule in enumerate(rules):
        for j, source in enumerate(rule.get("from") or []):
            jwt = source.get("jwt") or {}
            where = f"{field}.rules[{i}].from[{j}].jwt"
            if not any(jwt.get(k) for k in ("iss", "sub", "other")):
                raise invalid(where, "needs at least one of iss, sub, other")
            for name in jwt.get("other") or {}:
                if not re.match(_CLAIM, name):
                    raise invalid(f"{where}.other", f"{name!r} is not a claim name")
        for j, target in enumerate(rule.get("to") or []):
            where = f"{field}.rules[{i}].to[{j}]"
            for k, path in enumerate(target.get("paths") or []):
                if not path.startswith("/") or len(path) > 1024:
                    raise invalid(f"{where}.paths[{k}]", f"{path!r} must start with /")
            for k, method in enumerate(target.get("methods") or []):
                if not re.match(_METHOD, method):
                    raise invalid(f"{where}.methods[{k}]", f"{method!r} is not an HTTP method")


KIND = KindDef(Kind.SECURITY_SETTING, SecuritySetting, behaviour=SecuritySettingBehaviour())
