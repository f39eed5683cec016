"""Per-kind validation of specs beyond what the pydantic models express.

Each check raises INVALID_ARGUMENT naming the field as the client wrote it
(``cluster.tokenTtl``, ``workspace.namespaceSelector.names[2]``).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pydantic

from meshplane.config_error import ConfigError
from mgmt_api import fqn as fqnmod
from mgmt_api.auth import passwords
from mgmt_api.compiler import extauthz as extauthz_compiler
from mgmt_api.compiler import key_material
from mgmt_api.compiler.traffic_policy import BackendTrafficPolicy
from mgmt_api.domain import rbac
from mgmt_api.domain.durations import format_duration, parse_duration
from mgmt_api.domain.lookup import validate_names
from mgmt_api.errors import invalid
from ratelimit.contract import RedisUrlError, parse_redis_url

DEFAULT_TOKEN_TTL = "3600s"  # noqa: S105 - a duration


def _selector(spec: dict[str, Any], prefix: str, required: bool) -> None:
    sel = spec.get("namespaceSelector")
    if sel is None:
        if required:
            raise invalid(f"{prefix}.namespaceSelector", "is required")
        return
    names = sel.get("names") or []
    if not names:
        raise invalid(f"{prefix}.namespaceSelector.names", "needs at least one cluster/namespace")
    validate_names(names, f"{prefix}.namespaceSelector.names")


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _traffic_policy(prefix: str, spec: dict[str, Any], name: str) -> None:
    """Check with the compiler's model; metadata defaults to the FQN's ``ns.name``."""
    namespace, short = fqnmod.split_namespaced(name)
    metadata = dict(spec.get("metadata") or {})
    metadata.setdefault("namespace", namespace)
    metadata.setdefault("name", short)
    if (metadata["namespace"], metadata["name"]) != (namespace, short):
        raise invalid(
            f"{prefix}.metadata",
            f"namespace/name {metadata['namespace']}/{metadata['name']} "
            f"differ from the object name {name!r} ({{namespace}}.{{name}})",
        )
    doc = {
        "apiVersion": spec.get("apiVersion", "gateway.envoyproxy.io/v1alpha1"),
        "kind": spec.get("kind", "BackendTrafficPolicy"),
        "metadata": metadata,
        "spec": spec.get("spec"),
    }
    try:
        model = BackendTrafficPolicy.model_validate(doc)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        raise invalid(prefix + _loc(tuple(first.get("loc", ()))), message) from None
    # Store what the model read (numbers as numbers, header names lower-case,
    # CIDRs normalised, cost in Envoy Gateway's shape), not the text as sent.
    spec.update(
        apiVersion=doc["apiVersion"],
        kind=doc["kind"],
        metadata=metadata,
        spec=model.spec.model_dump(mode="json", by_alias=True, exclude_unset=True),
    )


def check_grpc_uri(field: str, uri: str) -> None:
    """``grpc://host:port``: Envoy's ext_authz needs a cluster address, nothing more."""
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:
        port = None
        parts = urlsplit("")
    if (
        parts.scheme != "grpc"
        or not parts.hostname
        or port is None
        or not 0 < port < 65536
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
    ):
        raise invalid(field, f"{uri!r} is not grpc://host:port")


# ``ns/sa``, ``ns/*``, ``./sa`` or ``./*`` (``.``: the setting's own namespaces).
_SERVICE_ACCOUNT = re.compile(
    r"^(\.|[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)/(\*|[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)$"
)


def _security_setting(prefix: str, spec: dict[str, Any]) -> None:
    """``mode: CUSTOM`` is an explicit ``serviceAccounts`` list (the reference's
    AuthorizationSettings); ``http.external`` is the ext_authz server, with any mode."""
    authz = spec.get("authorization") or {}
    external = (authz.get("http") or {}).get("external")
    if external is not None:
        check_grpc_uri(f"{prefix}.authorization.http.external.uri", external.get("uri", ""))
        if external.get("policy") is not None:
            fqnmod.validate_name(external["policy"], f"{prefix}.authorization.http.external.policy")
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
                f"{field}[{i}]", f"{account!r} is not ns/sa, ns/*, ./sa or ./* (DNS-1123 names)"
            )
        if account in seen:
            raise invalid(f"{field}[{i}]", f"{account!r} is listed twice")
        seen.add(account)


def redis_url(value: str) -> str:
    """The Redis URL a ``backend.redis.url`` means: spec §2.9 writes ``<host>:<port>``
    (as Envoy Gateway's ``redis.url`` does); a ``redis://``/``rediss://`` URL is taken
    as it is."""
    return value if "://" in value else f"redis://{value}"


def _cluster_rate_limit(prefix: str, rate_limit: dict[str, Any] | None) -> None:
    """The counter store is Redis unless ``redis.disabled`` (then in memory, per
    instance); with Redis, exactly one of ``url`` and ``urlRef`` says where."""
    if not rate_limit:
        return
    disabled = bool((rate_limit.get("redis") or {}).get("disabled"))
    redis = (rate_limit.get("backend") or {}).get("redis")
    if disabled:
        if redis is not None:
            raise invalid(f"{prefix}.backend.redis", "must be empty when redis.disabled is true")
        return
    if rate_limit.get("backend") is None:
        return
    redis = redis or {}
    if ("url" in redis) == ("urlRef" in redis):
        raise invalid(f"{prefix}.backend.redis", "give exactly one of url and urlRef")
    if "url" in redis:
        url = redis_url(redis["url"])
        try:
            parse_redis_url(url)
        except RedisUrlError as exc:
            raise invalid(f"{prefix}.backend.redis.url", str(exc)) from None
        if urlsplit(url).password is not None:
            # Every reader of the cluster would see it: secrets go in urlRef.
            raise invalid(
                f"{prefix}.backend.redis.url", "must not carry a password; use urlRef (a Secret)"
            )
    for ref_field in ("urlRef", "tls.certificateRef"):
        ref = redis
        for part in ref_field.split("."):
            ref = (ref or {}).get(part)
        if ref is not None:
            fqnmod.validate_name(ref["name"], f"{prefix}.backend.redis.{ref_field}.name")
            if ref.get("namespace") is not None:
                fqnmod.validate_name(
                    ref["namespace"], f"{prefix}.backend.redis.{ref_field}.namespace"
                )


def restore_secrets(
    prefix: str, spec: dict[str, Any], stored: dict[str, Any] | None
) -> dict[str, Any]:
    """An ExtAuthzPolicy update: the redaction markers a GET returned, put back
    as the stored secrets they stand for (``mgmt_api.compiler.key_material``)."""
    try:
        return key_material.restore(spec, stored)
    except key_material.UnknownMarker as exc:
        raise invalid(
            f"{prefix}.{exc.field}",
            "is a redacted value that matches none of this policy's stored secrets; "
            "send the secret itself",
        ) from None


# An HS256 key shorter than the hash is refused (RFC 7518 §3.2).
MIN_HMAC_SECRET_BYTES = 32


def _extauthz_policy(prefix: str, spec: dict[str, Any]) -> None:
    marker_field = key_material.first_marker(spec)
    if marker_field is not None:
        # A create (or a body copied from another policy): storing the marker
        # would make it the secret.
        raise invalid(
            f"{prefix}.{marker_field}",
            "is a redacted value; send the secret itself (a marker is only "
            "accepted on an update of the policy it was read from)",
        )
    for i, entry in enumerate(((spec.get("jwt") or {}).get("keys")) or []):
        value = ((entry or {}).get("hmacSecret") or {}).get("value")
        if isinstance(value, str) and len(value.encode()) < MIN_HMAC_SECRET_BYTES:
            # RFC 7518 §3.2. It also keeps the unkeyed fingerprint that REST
            # shows instead of the secret (key_material) from helping anyone
            # with READ guess it offline.
            raise invalid(
                f"{prefix}.jwt.keys[{i}].hmacSecret.value",
                f"an HMAC secret must be at least {MIN_HMAC_SECRET_BYTES} bytes "
                "(RFC 7518 §3.2); generate one, e.g. `openssl rand -base64 32`",
            )
    policy = {
        k: v
        for k, v in spec.items()
        if k in ("jwt", "pathClaim", "removeAuthorization", "claimsToHeaders")
    }
    try:
        extauthz_compiler.validate_policy(policy)
    except ConfigError as exc:
        field = f"{prefix}.{exc.field}" if exc.field else prefix
        raise invalid(field, exc.message) from None


def _profile_refs(prefix: str, spec: dict[str, Any]) -> None:
    """Each entry of ``profiles`` is a Profile FQN, listed once. Whether it
    exists and is visible from the object is checked in the write transaction
    (``mgmt_api.service.profiles.check_references``)."""
    seen: set[str] = set()
    for i, ref in enumerate(spec.get("profiles") or []):
        field = f"{prefix}.profiles[{i}]"
        if fqnmod.parse(ref, field).kind != "Profile":
            raise invalid(field, f"{ref!r} is not a profile FQN")
        if ref in seen:
            raise invalid(field, f"{ref!r} is listed twice")
        seen.add(ref)


def _onboarding_config(prefix: str, spec: dict[str, Any], name: str) -> None:
    """Namespace names are DNS-1123 labels, each listed once; the name ``status``
    is reserved for ``.../onboarding/status``. System namespaces are checked in
    the write transaction (``mgmt_api.service.onboarding``): they live on the
    organization."""
    if name == "status":
        raise invalid("name", "'status' is reserved (GET .../onboarding/status)")
    seen: set[str] = set()
    for i, ns in enumerate(spec.get("namespaces") or []):
        field = f"{prefix}.namespaces[{i}].name"
        fqnmod.validate_name(ns.get("name", ""), field)
        if ns["name"] in seen:
            raise invalid(field, f"{ns['name']!r} is listed twice")
        seen.add(ns["name"])


def validate(
    kind: str, prefix: str, spec: dict[str, Any], creating: bool, name: str = ""
) -> dict[str, Any]:
    """Validate and normalise ``spec`` (camelCase) of ``kind``; returns the spec to store.

    ``name`` is the object's FQN segment (namespaced kinds derive metadata from it).
    """
    if kind in ("Organization", "Tenant", "Workspace"):
        _profile_refs(prefix, spec)
    if kind == "BackendTrafficPolicy":
        _traffic_policy(prefix, spec, name)
    elif kind == "SecuritySetting":
        _security_setting(prefix, spec)
    elif kind == "ClusterOnboardingConfig":
        _onboarding_config(prefix, spec, name)
    elif kind == "ExtAuthzPolicy":
        _extauthz_policy(prefix, spec)
    elif kind == "Workspace":
        _selector(spec, prefix, required=True)
    elif kind == "SecurityGroup":
        _selector(spec, prefix, required=False)
    elif kind == "Organization":
        for i, ns in enumerate(spec.get("systemNamespaces") or []):
            fqnmod.validate_name(ns, f"{prefix}.systemNamespaces[{i}]")
    elif kind == "Cluster":
        _cluster_rate_limit(f"{prefix}.rateLimit", spec.get("rateLimit"))
        ttl = spec.get("tokenTtl")
        seconds = parse_duration(ttl, f"{prefix}.tokenTtl") if ttl is not None else 3600.0
        spec["tokenTtl"] = format_duration(seconds)
        spec.setdefault("tier1Cluster", False)
    elif kind == "Team":
        for i, member in enumerate(spec.get("members") or []):
            field = f"{prefix}.members[{i}]"
            parsed = fqnmod.parse(member, field)
            if parsed.kind not in ("User", "ServiceAccount"):
                raise invalid(field, "members are user or service-account FQNs")
        spec.setdefault("sourceType", "MANUAL")
    elif kind == "User":
        spec.setdefault("sourceType", "MANUAL")
    elif kind == "Role" and creating and not spec.get("rules"):
        raise invalid(f"{prefix}.rules", "a role needs at least one rule")
    return spec


def validate_password(password: str, field: str) -> None:
    if not passwords.MIN_LENGTH <= len(password) <= passwords.MAX_LENGTH:
        raise invalid(field, f"must be {passwords.MIN_LENGTH} to {passwords.MAX_LENGTH} characters")


def validate_policy(allow: list[dict[str, Any]], known_custom_roles: set[str]) -> None:
    """Bindings name an existing role and subjects of the right kind."""
    kinds = {"user": "User", "team": "Team", "serviceAccount": "ServiceAccount"}
    for i, binding in enumerate(allow):
        role = binding.get("role", "")
        if role not in rbac.BUILTIN_ROLES and role not in known_custom_roles:
            raise invalid(
                f"allow[{i}].role", f"{role!r} is not a role (rbac/admin, rbac/editor, ...)"
            )
        for j, subject in enumerate(binding.get("subjects") or []):
            set_fields = [k for k, v in subject.items() if v]
            field = f"allow[{i}].subjects[{j}]"
            if len(set_fields) != 1:
                raise invalid(field, "exactly one of user, team, serviceAccount is required")
            key = set_fields[0]
            parsed = fqnmod.parse(subject[key], f"{field}.{key}")
            if parsed.kind != kinds[key]:
                raise invalid(f"{field}.{key}", f"{subject[key]!r} is not a {kinds[key]} FQN")
