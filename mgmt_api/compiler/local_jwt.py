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

from dataclasses import dataclass
from urllib.parse import urlsplit

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


def compile_listener(settings: list[tuple[str, JsonDict]]) -> LocalJwtListener:
    """``[(name, local)]`` -> the merged filters; no filters for no settings."""
    if not settings:
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
    merged = {"@type": _JWT_AUTHN, "providers": providers, "requirementMap": requirements}
    filters = [
        {"name": JWT_AUTHN_FILTER, "typedConfig": merged},
        {"name": RBAC_FILTER, "typedConfig": {"@type": _RBAC}},
    ]
    return LocalJwtListener(filters, per_route, clusters)
