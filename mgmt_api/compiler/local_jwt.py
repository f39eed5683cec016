"""SecuritySetting ``authorization.http.local`` -> Envoy ``jwt_authn`` + ``rbac``.

Pure: a setting in, protojson dicts out, so the gateway compiler and the
sidecar inbound listener can both use it without any gateway-only input.

Shape of the output, and WHY:

* ``http_filters``: a ``jwt_authn`` filter whose provider is reachable only
  through ``requirement_map`` (no top-level ``rules``), then an ``rbac`` filter
  with no ``rules``. On their own both do nothing, so routes that do not use
  this setting are untouched and no ext_authz-style call is made for them.
* ``per_route``: for the setting's routes, ``jwt_authn`` selects the
  requirement (missing/invalid token -> 401 with ``WWW-Authenticate``) and
  ``rbac`` carries the ALLOW policies (a verified token no rule allows -> 403).
  RBAC reads the claims from the dynamic metadata ``jwt_authn`` wrote, i.e.
  only from a token whose signature, ``exp`` and ``nbf`` were checked.
* ``clusters``: the cluster a remote JWKS is fetched through, if any.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from extauthz import contract as extauthz_contract
from meshplane.config_error import ConfigError
from mgmt_api.compiler import extauthz as extauthz_compiler
from mgmt_api.compiler import path_claim_lua
from mgmt_api.compiler.protojson import JsonDict

JWT_AUTHN_FILTER = "envoy.filters.http.jwt_authn"
RBAC_FILTER = "envoy.filters.http.rbac"
PAYLOAD_KEY = "jwt_payload"
_JWT_AUTHN = "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication"
_JWT_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.PerRouteConfig"
_RBAC = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
_RBAC_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBACPerRoute"
_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"


@dataclass(frozen=True)
class LocalJwtConfig:
    http_filters: list[JsonDict]
    per_route: JsonDict
    clusters: list[JsonDict]


def compile_local_jwt(name: str, local: JsonDict) -> LocalJwtConfig:
    """``local`` (the validated ``authorization.http.local``) named ``name``.

    ``name`` keys the provider and requirement so that several settings can
    share one filter pair on a listener (the caller merges their maps)."""
    provider, clusters = _provider(name, local)
    jwt_authn = {
        "@type": _JWT_AUTHN,
        "providers": {name: provider},
        "requirementMap": {name: {"providerName": name}},
    }
    filters = [
        {"name": JWT_AUTHN_FILTER, "typedConfig": jwt_authn},
        {"name": RBAC_FILTER, "typedConfig": {"@type": _RBAC}},
    ]
    policies = {f"rule-{i}": _policy(rule) for i, rule in enumerate(local["rules"])}
    per_route = {
        JWT_AUTHN_FILTER: {"@type": _JWT_PER_ROUTE, "requirementName": name},
        RBAC_FILTER: {
            "@type": _RBAC_PER_ROUTE,
            "rbac": {"rules": {"action": "ALLOW", "policies": policies}},
        },
    }
    return LocalJwtConfig(filters, per_route, clusters)


#: Verified tokens each Envoy worker keeps per provider (Envoy's default is 100).
JWT_CACHE_ENTRIES = 256


def _provider(name: str, local: JsonDict) -> tuple[JsonDict, list[JsonDict]]:
    """The jwt_authn provider; ``forward: false`` keeps the token from upstreams."""
    keys = local["keys"]
    provider: JsonDict = {
        "forward": False,
        "payloadInMetadata": PAYLOAD_KEY,
        # Envoy reads 0 (proto3's unset) as its default of 60 s: "no skew" is 1 s.
        "clockSkewSeconds": max(1, int(local.get("clockSkew", 0))),
        # Verified tokens are cached by their text, so a client's next request
        # skips the signature check (most of jwt_authn's cost per request).
        # Envoy re-checks exp on every hit and caches only valid tokens of at
        # most 4 KiB: at most JWT_CACHE_ENTRIES x 4 KiB per worker.
        "jwtCacheConfig": {"jwtCacheSize": JWT_CACHE_ENTRIES},
    }
    jwks = keys.get("jwks") or {}
    if jwks.get("uri") is None:
        inline = jwks.get("value") if jwks.get("value") is not None else keys["pem"]
        provider["localJwks"] = {"inlineString": inline}
        return provider, []
    cluster = f"local-jwks-{name}"
    provider["remoteJwks"] = {
        "httpUri": {"uri": jwks["uri"], "cluster": cluster, "timeout": "5s"},
        "cacheDuration": "300s",
    }
    return provider, [_jwks_cluster(cluster, jwks["uri"])]


def _jwks_cluster(name: str, uri: str) -> JsonDict:
    """A DNS cluster to the JWKS host; TLS (with SNI) for https URLs."""
    parts = urlsplit(uri)
    tls = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if tls else 80)
    cluster: JsonDict = {
        "name": name,
        "type": "STRICT_DNS",
        "connectTimeout": "5s",
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
    if tls:
        cluster["transportSocket"] = {
            "name": "envoy.transport_sockets.tls",
            "typedConfig": {"@type": _TLS, "sni": host},
        }
    return cluster


def _policy(rule: JsonDict) -> JsonDict:
    """One reference rule: any ``from`` (principals) AND any ``to`` (permissions)."""
    targets = rule.get("to") or []
    permissions = [_permission(t) for t in targets] or [{"any": True}]
    principals = [_principal(source["jwt"]) for source in rule["from"]]
    return {"permissions": permissions, "principals": principals}


def _principal(jwt: JsonDict) -> JsonDict:
    """Every given claim must equal its value in the verified payload."""
    claims = [(k, jwt[k]) for k in ("iss", "sub") if jwt.get(k) is not None]
    claims += sorted((jwt.get("other") or {}).items())
    ids = [
        {
            "metadata": {
                "filter": JWT_AUTHN_FILTER,
                "path": [{"key": PAYLOAD_KEY}, {"key": claim}],
                "value": {"stringMatch": {"exact": value}},
            }
        }
        for claim, value in claims
    ]
    return {"andIds": {"ids": ids}}


def _permission(target: JsonDict) -> JsonDict:
    """Paths (``/x/*`` a prefix, else exact; normalized by the HCM) AND methods."""
    rules: list[JsonDict] = []
    paths = target.get("paths") or []
    if paths:
        rules.append({"orRules": {"rules": [{"urlPath": {"path": _path(p)}} for p in paths]}})
    methods = target.get("methods") or []
    if methods:
        headers = [{"header": {"name": ":method", "stringMatch": {"exact": m}}} for m in methods]
        rules.append({"orRules": {"rules": headers}})
    return {"andRules": {"rules": rules}} if rules else {"any": True}


def _path(path: str) -> JsonDict:
    if path.endswith("/*"):
        return {"prefix": path[:-1]}
    return {"exact": path}


@dataclass(frozen=True)
class LocalJwtListener:
    """Every local-rules setting of one listener, merged: one ``jwt_authn`` and
    one ``rbac`` filter for all of them (a filter name appears once in a chain),
    each setting's per-route config by its name, and the JWKS clusters."""

    http_filters: list[JsonDict]
    per_route: dict[str, JsonDict]
    clusters: list[JsonDict]


def compile_listener(
    settings: list[tuple[str, JsonDict]],
    policies: Sequence[tuple[str, PolicyEnforcement]] = (),
) -> LocalJwtListener:
    """``[(name, local)]`` and the locally enforced ExtAuthzPolicies
    ``[(name, enforcement)]`` -> the merged filters; none for neither.

    A policy's routes get its jwt_authn provider and its Lua check; the
    Lua filter comes after jwt_authn (it reads what jwt_authn wrote) and
    before any ext_authz filter (which it lets through only what it refers).
    """
    inside = [(name, how) for name, how in policies if how.provider is not None]
    if not settings and not inside:
        return LocalJwtListener([], {}, [])
    providers: JsonDict = {}
    requirements: JsonDict = {}
    per_route: dict[str, JsonDict] = {}
    clusters: list[JsonDict] = []
    for name, local in settings:
        one = compile_local_jwt(name, local)
        jwt_authn = one.http_filters[0]["typedConfig"]
        providers.update(jwt_authn["providers"])
        requirements.update(jwt_authn["requirementMap"])
        per_route[name] = one.per_route
        clusters.extend(one.clusters)
    for name, how in inside:
        providers.update(how.provider or {})
        requirements[f"extauthz:{name}"] = policy_requirement(name)
        per_route[f"extauthz:{name}"] = policy_per_route(name, how)
    merged = {"@type": _JWT_AUTHN, "providers": providers, "requirementMap": requirements}
    filters = [{"name": JWT_AUTHN_FILTER, "typedConfig": merged}]
    if settings:
        filters.append({"name": RBAC_FILTER, "typedConfig": {"@type": _RBAC}})
    if inside:
        filters.append(lua_filter())
    return LocalJwtListener(filters, per_route, clusters)


# --- An ExtAuthzPolicy's path-claim rules, enforced inside the gateway ------

#: The Lua filter that applies a policy's path-claim rules (route-only, like jwt_authn).
LUA_FILTER = "envoy.filters.http.lua"
_LUA = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"
_LUA_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute"
#: Where jwt_authn writes a policy provider's verified payload and header.
POLICY_PAYLOAD_KEY = "extauthz_payload"
POLICY_HEADER_KEY = "extauthz_header"
#: A token without ``kid`` is tried against at most this many keys by
#: extauthz (``extauthz.tokens.MAX_KIDLESS_CANDIDATES``); beyond, it refuses.
_MAX_KIDLESS_KEYS = 8
ENFORCEMENT_LOCAL = "local"
ENFORCEMENT_EXTERNAL = "external"


@dataclass(frozen=True)
class PolicyEnforcement:
    """Which path a route under one ExtAuthzPolicy takes, and why.

    ``provider`` and ``lua`` are set when it is ``local``: the jwt_authn
    provider (keys inline) and the policy's Lua check.
    """

    path: str
    reason: str
    provider: JsonDict | None = None
    lua: str | None = None

    def document(self) -> JsonDict:
        """The ``enforcement`` field of the route in the ``envoyconfig`` document."""
        return {"path": self.path, "reason": self.reason}


def _external(reason: str) -> PolicyEnforcement:
    return PolicyEnforcement(ENFORCEMENT_EXTERNAL, reason)


def policy_enforcement(
    name: str, spec: Mapping[str, Any], published: tuple[str, ...] = ()
) -> PolicyEnforcement:
    """How the gateway enforces ExtAuthzPolicy ``spec`` (published as ``name``).

    ``local`` when the policy asks for it (the default) and the local form
    can apply it exactly; else ``external`` with the reason. The keys are
    read with extauthz's own loader, so jwt_authn gets exactly the keys the
    service would use.
    """
    asked = spec.get("enforcement") or ENFORCEMENT_LOCAL
    if asked == ENFORCEMENT_EXTERNAL:
        return _external("the policy sets enforcement: external")
    if spec.get("claimsToHeaders"):
        return _external("claimsToHeaders is applied by extauthz only")
    if published:
        return _external("claims published as metadata (claim limits) are set by extauthz only")
    try:
        config = extauthz_contract.parse_config(
            extauthz_compiler.render_file([(name, _policy_only(spec))])
        ).policies[name]
    except (ConfigError, KeyError):
        return _external("the policy does not load")
    jwt = config.jwt
    if jwt.jwks_uris:
        return _external(
            "keys from a JWKS URL: extauthz's refetch rules (unknown kid, cache) "
            "differ from Envoy's"
        )
    if jwt.leeway_seconds != int(jwt.leeway_seconds):
        return _external("leewaySeconds is not a whole number of seconds")
    keys = jwt.static_keys
    with_kid = {key.kid for key in keys if key.kid is not None}
    if (with_kid and len(with_kid) != len(keys)) or len({k.kid for k in keys}) != len(keys):
        return _external("keys with and without a kid, or a kid shared by several keys")
    if not with_kid and len(keys) > _MAX_KIDLESS_KEYS:
        return _external(f"more than {_MAX_KIDLESS_KEYS} keys without a kid")
    provider_name = f"extauthz:{name}"
    provider: JsonDict = {
        # The token stays: a request the Lua check refers is decided by
        # extauthz, which must see it; the check removes it itself.
        "forward": True,
        "fromHeaders": [{"name": "authorization", "valuePrefix": "Bearer "}],
        "payloadInMetadata": POLICY_PAYLOAD_KEY,
        "headerInMetadata": POLICY_HEADER_KEY,
        # Envoy reads 0 as 60 s; the Lua check applies extauthz's own leeway.
        "clockSkewSeconds": max(1, int(jwt.leeway_seconds)),
        "localJwks": {"inlineString": json.dumps({"keys": [_jwk(key) for key in keys]})},
        "jwtCacheConfig": {"jwtCacheSize": JWT_CACHE_ENTRIES},
    }
    path_claim = config.path_claim
    lua = path_claim_lua.lua_source(
        payload_key=POLICY_PAYLOAD_KEY,
        header_key=POLICY_HEADER_KEY,
        algorithms=jwt.algorithms,
        kids=with_kid,
        leeway=int(jwt.leeway_seconds),
        claim=None if path_claim is None else path_claim.name,
        segment=path_claim is not None and path_claim.match.value == "SEGMENT",
        issuer=jwt.issuer,
        audiences=jwt.audiences or None,
        remove_authorization=config.remove_authorization,
        policy=name,
        rules=extauthz_contract.REASON_RULES,
        reason_header=extauthz_contract.REASON_HEADER,
    )
    reason = "jwt_authn and the path-claim check run inside Envoy"
    return PolicyEnforcement(ENFORCEMENT_LOCAL, reason, {provider_name: provider}, lua)


def _policy_only(spec: Mapping[str, Any]) -> Any:
    """The stored spec without the gateway-only ``enforcement`` switch."""
    return {k: v for k, v in spec.items() if k != "enforcement"}


def _jwk(key: Any) -> JsonDict:
    """One extauthz key (``extauthz.keys.VerifyKey``) as a public JWK (oct for HMAC)."""
    family = str(key.family.value).upper()
    if family == "HMAC":
        jwk: JsonDict = {
            "kty": "oct",
            "k": base64.urlsafe_b64encode(bytes(key.material)).decode().rstrip("="),
        }
    else:
        to_jwk: Any = {
            "RSA": RSAAlgorithm.to_jwk,
            "EC": ECAlgorithm.to_jwk,
            "OKP": OKPAlgorithm.to_jwk,
        }[family]
        jwk = json.loads(to_jwk(key.material))
    if key.kid is not None:
        jwk["kid"] = key.kid
    if key.alg is not None:
        jwk["alg"] = key.alg
    return jwk


def policy_per_route(name: str, enforcement: PolicyEnforcement) -> JsonDict:
    """The route's jwt_authn and Lua config for a locally enforced policy.

    jwt_authn never answers by itself (a missing or failed token is allowed
    through to the check, which refers it to extauthz)."""
    assert enforcement.lua is not None
    return {
        JWT_AUTHN_FILTER: {"@type": _JWT_PER_ROUTE, "requirementName": f"extauthz:{name}"},
        LUA_FILTER: {
            "@type": _LUA_PER_ROUTE,
            "sourceCode": {"inlineString": enforcement.lua},
        },
    }


def policy_requirement(name: str) -> JsonDict:
    """The requirement of a locally enforced policy: its provider, else pass on."""
    return {
        "requiresAny": {
            "requirements": [{"providerName": f"extauthz:{name}"}, {"allowMissingOrFailed": {}}]
        }
    }


def lua_filter() -> JsonDict:
    """The listener's Lua filter: it does nothing unless a route gives it a script."""
    return {
        "name": LUA_FILTER,
        "typedConfig": {"@type": _LUA, "defaultSourceCode": {"inlineString": ""}},
    }
