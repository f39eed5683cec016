"""Load and validate the ext_authz policy file into immutable dataclasses.

Validation is strict because a typo in an authorization config is a security
bug: an unknown key (``algorithm:`` for ``algorithms:``), a missing key, an
algorithm we do not support (or ``none``), a key that no allowed algorithm can
use, or a secret file that cannot be read all stop the load with a
``ConfigError`` naming the file, the line and the field path
(``policies[0].jwt.keys[1].hmacSecret.file``). At start-up that aborts the
process; on a live reload the last good config stays in force.

Key material given by value, file or environment variable is read here, at
load time, so the request path never touches the filesystem. Relative file
paths are resolved against the config file's directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from extauthz.keys import (
    SUPPORTED_ALGORITHMS,
    KeyError_,
    VerifyKey,
    hmac_key,
    parse_jwks,
    pem_public_key,
)
from extauthz.paths import PathMatch
from meshplane.config_error import ConfigError
from meshplane.yamlconf import load_yaml, loads_yaml

BUILTIN_POLICIES = frozenset({"allow", "deny"})
"""Policy names with a fixed meaning; they cannot be redefined."""

POLICY_CONTEXT_KEY = "meshplane.policy"
"""The ``context_extensions`` key Envoy sets per route to select a policy."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_HEADER = re.compile(r"[a-z0-9][a-z0-9-]{0,99}")
_RESERVED_HEADERS = frozenset(
    {"authorization", "host", "content-length", "transfer-encoding", "connection", "te", "upgrade"}
)


@dataclass(frozen=True)
class JwksUriConfig:
    """A remote JWKS and how it is cached (see ``jwks_remote``)."""

    uri: str
    cache_seconds: float = 600.0
    min_refetch_seconds: float = 10.0
    timeout_seconds: float = 2.0
    kid_miss_wait_seconds: float = 0.1


@dataclass(frozen=True)
class JwtConfig:
    algorithms: frozenset[str]
    static_keys: tuple[VerifyKey, ...]
    jwks_uris: tuple[JwksUriConfig, ...]
    leeway_seconds: float = 0.0
    issuer: str | None = None
    audiences: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PathClaimConfig:
    name: str = "path"
    match: PathMatch = PathMatch.PREFIX


@dataclass(frozen=True)
class ClaimHeader:
    claim: str
    header: str


@dataclass(frozen=True)
class PolicyConfig:
    name: str
    jwt: JwtConfig
    path_claim: PathClaimConfig | None = None
    remove_authorization: bool = False
    claims_to_headers: tuple[ClaimHeader, ...] = ()


@dataclass(frozen=True)
class ExtAuthzConfig:
    default_policy: str
    policies: Mapping[str, PolicyConfig] = field(default_factory=dict)
    token_cache_size: int = 10_000
    source: str = ""
    key_files: tuple[Path, ...] = ()
    """Key material files read by this load; watched so a rotated Secret reloads."""


class _Validator:
    """Carries the file name so every error can say where it happened."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.source = str(path)
        self.files: list[Path] = []

    def error(self, message: str, where: str, node: Any = None, key: Any = None) -> ConfigError:
        line = None
        if node is not None:
            line_of = getattr(node, "line_of", None)
            line = line_of(key) if line_of is not None and key is not None else None
            line = line or getattr(node, "line", None)
        return ConfigError(message, source=self.source, line=line, field=where)

    def mapping(
        self,
        node: Any,
        where: str,
        *,
        required: tuple[str, ...] = (),
        optional: tuple[str, ...] = (),
        parent: Any = None,
        key: Any = None,
    ) -> Mapping[str, Any]:
        if not isinstance(node, dict):
            raise self.error("must be a mapping", where, parent, key)
        for name in node:
            if name not in required and name not in optional:
                allowed = ", ".join((*required, *optional))
                raise self.error(
                    f"unknown key (allowed: {allowed})", _join(where, name), node, name
                )
        for name in required:
            if name not in node:
                raise self.error("missing required key", _join(where, name), node)
        return node

    def string(self, node: Mapping[str, Any], key: str, where: str) -> str:
        value = node[key]
        if not isinstance(value, str) or not value:
            raise self.error("must be a non-empty string", _join(where, key), node, key)
        return value

    def number(
        self,
        node: Mapping[str, Any],
        key: str,
        where: str,
        *,
        default: float,
        lo: float,
        hi: float,
    ) -> float:
        if key not in node:
            return default
        value = node[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
            raise self.error(f"must be a number in [{lo}, {hi}]", _join(where, key), node, key)
        return float(value)

    def boolean(self, node: Mapping[str, Any], key: str, where: str) -> bool:
        value = node.get(key, False)
        if not isinstance(value, bool):
            raise self.error("must be true or false", _join(where, key), node, key)
        return value

    def material(self, node: Any, where: str, parent: Any, key: str) -> bytes:
        """Secret or key bytes from exactly one of {value, file, env}."""
        spec = self.mapping(node, where, optional=("value", "file", "env"), parent=parent, key=key)
        if len(spec) != 1:
            raise self.error("give exactly one of value, file, env", where, parent, key)
        kind, ref = next(iter(spec.items()))
        if not isinstance(ref, str) or not ref:
            raise self.error("must be a non-empty string", _join(where, kind), spec, kind)
        if kind == "value":
            return ref.encode("utf-8")
        if kind == "env":
            env = os.environ.get(ref)
            if not env:
                raise self.error(f"environment variable {ref} is unset or empty", where, spec, kind)
            return env.encode("utf-8")
        file = self.resolve(ref)
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise self.error(
                f"cannot read {file}: {exc.strerror}", _join(where, kind), spec, kind
            ) from None
        self.files.append(file)
        return data

    def resolve(self, ref: str) -> Path:
        file = Path(ref)
        return file if file.is_absolute() else self.path.parent / file


def _join(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def load_config(path: Path) -> ExtAuthzConfig:
    """Read, validate and freeze the policy file at ``path``.

    ``path`` may also be a directory holding at most one visible YAML file:
    the form a snapshot from the management plane takes on disk
    (``--control-plane``). An empty directory is a config that denies
    everything, so an instance that has never received a snapshot fails
    closed instead of refusing to start.
    """
    if path.is_dir():
        files = sorted(
            p
            for p in path.iterdir()
            if not p.name.startswith(".") and p.suffix in (".yaml", ".yml") and p.is_file()
        )
        if not files:
            return ExtAuthzConfig("deny", {}, source=str(path))
        if len(files) > 1:
            names = ", ".join(p.name for p in files)
            raise ConfigError(
                f"a config directory holds one policy file, found {names}", source=str(path)
            )
        path = files[0]
    return _config_of(_Validator(path), load_yaml(path))


def parse_config(text: str, source: str) -> ExtAuthzConfig:
    """Validate a policy document given as text (``source`` names it in errors).

    The same checks as :func:`load_config`, without a file: what the
    management plane runs on every policy it publishes (``extauthz.contract``).
    A relative ``file`` reference resolves against the current directory.
    """
    return _config_of(_Validator(Path(source)), loads_yaml(text, source=source))


def _config_of(v: _Validator, doc: Any) -> ExtAuthzConfig:
    root = v.mapping(
        doc, "", required=("defaultPolicy",), optional=("policies", "tokenCacheSize"), parent=doc
    )
    policies: dict[str, PolicyConfig] = {}
    items = root.get("policies") or []
    if not isinstance(items, list):
        raise v.error("must be a list", "policies", root, "policies")
    for index, item in enumerate(items):
        where = f"policies[{index}]"
        policy = _policy(v, item, where, items, index)
        if policy.name in policies:
            raise v.error(f"duplicate policy name {policy.name!r}", where + ".name", item, "name")
        policies[policy.name] = policy
    default = v.string(root, "defaultPolicy", "")
    if default not in BUILTIN_POLICIES and default not in policies:
        raise v.error(
            f"{default!r} is neither 'allow', 'deny' nor a defined policy",
            "defaultPolicy",
            root,
            "defaultPolicy",
        )
    cache_size = int(v.number(root, "tokenCacheSize", "", default=10_000, lo=0, hi=10_000_000))
    return ExtAuthzConfig(default, policies, cache_size, v.source, tuple(v.files))


def _policy(v: _Validator, node: Any, where: str, parent: Any, index: int) -> PolicyConfig:
    node = v.mapping(
        node,
        where,
        required=("name", "jwt"),
        optional=("pathClaim", "removeAuthorization", "claimsToHeaders"),
        parent=parent,
        key=index,
    )
    name = v.string(node, "name", where)
    if not _NAME.fullmatch(name) or name in BUILTIN_POLICIES:
        raise v.error(
            "must match [A-Za-z0-9][A-Za-z0-9._-]* (at most 63 chars) and not be allow/deny",
            where + ".name",
            node,
            "name",
        )
    jwt = _jwt(v, node["jwt"], where + ".jwt", node)
    path_claim = None
    if node.get("pathClaim") is not None:
        pc_where = where + ".pathClaim"
        pc = v.mapping(
            node["pathClaim"], pc_where, optional=("name", "match"), parent=node, key="pathClaim"
        )
        claim_name = v.string(pc, "name", pc_where) if "name" in pc else "path"
        match = pc.get("match", "PREFIX")
        if match not in ("PREFIX", "SEGMENT"):
            raise v.error("must be PREFIX or SEGMENT", pc_where + ".match", pc, "match")
        path_claim = PathClaimConfig(claim_name, PathMatch(match))
    headers: list[ClaimHeader] = []
    mappings = node.get("claimsToHeaders") or []
    if not isinstance(mappings, list):
        raise v.error("must be a list", where + ".claimsToHeaders", node, "claimsToHeaders")
    for i, raw_entry in enumerate(mappings):
        h_where = f"{where}.claimsToHeaders[{i}]"
        entry = v.mapping(raw_entry, h_where, required=("claim", "header"), parent=mappings, key=i)
        claim = v.string(entry, "claim", h_where)
        header = v.string(entry, "header", h_where).lower()
        if not _HEADER.fullmatch(header) or header in _RESERVED_HEADERS:
            raise v.error(
                "must be a plain lower-case header name, not a reserved one",
                h_where + ".header",
                entry,
                "header",
            )
        if header.startswith("x-ext-authz-"):
            raise v.error(
                "x-ext-authz-* headers are reserved", h_where + ".header", entry, "header"
            )
        headers.append(ClaimHeader(claim, header))
    if len({h.header for h in headers}) != len(headers):
        raise v.error("duplicate header", where + ".claimsToHeaders", node, "claimsToHeaders")
    return PolicyConfig(
        name=name,
        jwt=jwt,
        path_claim=path_claim,
        remove_authorization=v.boolean(node, "removeAuthorization", where),
        claims_to_headers=tuple(headers),
    )


def _jwt(v: _Validator, node: Any, where: str, parent: Any) -> JwtConfig:
    node = v.mapping(
        node,
        where,
        required=("algorithms", "keys"),
        optional=("leewaySeconds", "issuer", "audiences"),
        parent=parent,
        key="jwt",
    )
    algs = node["algorithms"]
    if not isinstance(algs, list) or not algs:
        raise v.error("must be a non-empty list", where + ".algorithms", node, "algorithms")
    for i, alg in enumerate(algs):
        if not isinstance(alg, str) or alg not in SUPPORTED_ALGORITHMS:
            hint = " ('none' is never accepted)" if str(alg).lower() == "none" else ""
            raise v.error(
                f"unsupported algorithm {alg!r}{hint}; supported: "
                + ", ".join(sorted(SUPPORTED_ALGORITHMS)),
                f"{where}.algorithms[{i}]",
                algs,
                i,
            )
    algorithms = frozenset(algs)
    keys_node = node["keys"]
    if not isinstance(keys_node, list) or not keys_node:
        raise v.error("must be a non-empty list", where + ".keys", node, "keys")
    static: list[VerifyKey] = []
    remotes: list[JwksUriConfig] = []
    for i, raw_entry in enumerate(keys_node):
        k_where = f"{where}.keys[{i}]"
        entry = v.mapping(
            raw_entry,
            k_where,
            optional=("hmacSecret", "publicKeyPem", "jwks", "kid"),
            parent=keys_node,
            key=i,
        )
        kinds = [k for k in ("hmacSecret", "publicKeyPem", "jwks") if k in entry]
        if len(kinds) != 1:
            raise v.error(
                "give exactly one of hmacSecret, publicKeyPem, jwks", k_where, keys_node, i
            )
        kind = kinds[0]
        kid = v.string(entry, "kid", k_where) if "kid" in entry else None
        if kind == "jwks" and kid is not None:
            raise v.error("kid comes from the JWKS itself", k_where + ".kid", entry, "kid")
        before = len(static)
        try:
            if kind == "hmacSecret":
                secret = v.material(entry[kind], f"{k_where}.{kind}", entry, kind)
                static.append(hmac_key(secret, kid=kid))
            elif kind == "publicKeyPem":
                pem = v.material(entry[kind], f"{k_where}.{kind}", entry, kind)
                static.append(pem_public_key(pem, kid=kid))
            else:
                jwks = entry[kind]
                if isinstance(jwks, dict) and "uri" in jwks:
                    remotes.append(_jwks_uri(v, jwks, f"{k_where}.jwks", entry))
                else:
                    raw = v.material(jwks, f"{k_where}.jwks", entry, kind)
                    static.extend(parse_jwks(raw).keys.keys)
        except KeyError_ as exc:
            raise v.error(str(exc), f"{k_where}.{kind}", entry, kind) from None
        for key in static[before:]:
            if not any(key.usable_for(alg) for alg in algorithms):
                raise v.error(
                    f"a {key.family} key is usable by none of the allowed algorithms "
                    f"({', '.join(sorted(algorithms))})",
                    f"{k_where}.{kind}",
                    entry,
                    kind,
                )
    leeway = v.number(node, "leewaySeconds", where, default=0.0, lo=0.0, hi=300.0)
    issuer = node.get("issuer")
    if issuer is not None and (not isinstance(issuer, str) or not issuer):
        raise v.error("must be a non-empty string or null", where + ".issuer", node, "issuer")
    auds = node.get("audiences") or []
    if not isinstance(auds, list) or not all(isinstance(a, str) and a for a in auds):
        raise v.error(
            "must be a list of non-empty strings", where + ".audiences", node, "audiences"
        )
    return JwtConfig(
        algorithms=algorithms,
        static_keys=tuple(static),
        jwks_uris=tuple(remotes),
        leeway_seconds=leeway,
        issuer=issuer,
        audiences=frozenset(auds),
    )


def _jwks_uri(v: _Validator, node: Any, where: str, parent: Any) -> JwksUriConfig:
    node = v.mapping(
        node,
        where,
        required=("uri",),
        optional=("cacheSeconds", "minRefetchSeconds", "timeoutSeconds", "kidMissWaitSeconds"),
        parent=parent,
        key="jwks",
    )
    uri = v.string(node, "uri", where)
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise v.error("must be an http(s) URL", where + ".uri", node, "uri")
    timeout = v.number(node, "timeoutSeconds", where, default=2.0, lo=0.1, hi=60.0)
    return JwksUriConfig(
        uri=uri,
        cache_seconds=v.number(node, "cacheSeconds", where, default=600.0, lo=1.0, hi=86_400.0),
        min_refetch_seconds=v.number(
            node, "minRefetchSeconds", where, default=10.0, lo=0.0, hi=3_600.0
        ),
        timeout_seconds=timeout,
        kid_miss_wait_seconds=v.number(
            node, "kidMissWaitSeconds", where, default=0.1, lo=0.0, hi=timeout
        ),
    )
