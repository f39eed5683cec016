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

from extauthz import claim_metadata
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
from meshplane.validate import Node
from meshplane.yamlconf import config_files, load_yaml, loads_yaml

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
    claims_to_metadata: tuple[str, ...] = ()
    """Verified claims published as dynamic metadata (``extauthz.claim_metadata``)."""


@dataclass(frozen=True)
class ExtAuthzConfig:
    default_policy: str
    policies: Mapping[str, PolicyConfig] = field(default_factory=dict)
    token_cache_size: int = 10_000
    source: str = ""
    key_files: tuple[Path, ...] = ()
    """Key material files read by this load; watched so a rotated Secret reloads."""


class _KeyMaterial:
    """Reads key material for one load, resolving relative files against the config."""

    def __init__(self, path: Path) -> None:
        self.base = path.parent
        self.files: list[Path] = []
        """Key files read, watched so that a rotated Secret reloads."""

    def read(self, node: Node) -> bytes:
        """Secret or key bytes from exactly one of {value, file, env}."""
        spec = node.fields(optional=("value", "file", "env"))
        if len(spec) != 1:
            raise node.error("give exactly one of value, file, env")
        ((kind, ref_node),) = spec
        ref = ref_node.string()
        if kind == "value":
            return ref.encode("utf-8")
        if kind == "env":
            env = os.environ.get(ref)
            if not env:
                raise node.error(f"environment variable {ref} is unset or empty")
            return env.encode("utf-8")
        file = Path(ref)
        file = file if file.is_absolute() else self.base / file
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise ref_node.error(f"cannot read {file}: {exc.strerror}") from None
        self.files.append(file)
        return data


def load_config(path: Path) -> ExtAuthzConfig:
    """Read, validate and freeze the policy file at ``path``.

    ``path`` may also be a directory holding at most one visible YAML file:
    the form a snapshot from the management plane takes on disk
    (``--control-plane``). An empty directory is a config that denies
    everything, so an instance that has never received a snapshot fails
    closed instead of refusing to start.
    """
    if path.is_dir():
        files = config_files(path)
        if not files:
            return ExtAuthzConfig("deny", {}, source=str(path))
        if len(files) > 1:
            names = ", ".join(p.name for p in files)
            raise ConfigError(
                f"a config directory holds one policy file, found {names}", source=str(path)
            )
        path = files[0]
    return _config_of(path, load_yaml(path))


def parse_config(text: str, source: str) -> ExtAuthzConfig:
    """Validate a policy document given as text (``source`` names it in errors).

    The same checks as :func:`load_config`, without a file: what the
    management plane runs on every policy it publishes (``extauthz.contract``).
    A relative ``file`` reference resolves against the current directory.
    """
    return _config_of(Path(source), loads_yaml(text, source=source))


def _config_of(path: Path, doc: Any) -> ExtAuthzConfig:
    keys = _KeyMaterial(path)
    root = Node(doc, source=str(path)).fields(("defaultPolicy",), ("policies", "tokenCacheSize"))
    policies: dict[str, PolicyConfig] = {}
    items = root.present("policies")
    for item in items.items() if items is not None else []:
        policy = _policy(keys, item)
        if policy.name in policies:
            raise item.child("name").error(f"duplicate policy name {policy.name!r}")
        policies[policy.name] = policy
    default_node = root.required("defaultPolicy")
    default = default_node.string()
    if default not in BUILTIN_POLICIES and default not in policies:
        raise default_node.error(f"{default!r} is neither 'allow', 'deny' nor a defined policy")
    cache_size = root.integer("tokenCacheSize", 10_000, lo=0, hi=10_000_000)
    return ExtAuthzConfig(default, policies, cache_size, str(path), tuple(keys.files))


def _policy(keys: _KeyMaterial, node: Node) -> PolicyConfig:
    f = node.fields(
        ("name", "jwt"),
        ("pathClaim", "removeAuthorization", "claimsToHeaders", "claimsToMetadata"),
    )
    name_node = f.required("name")
    name = name_node.string()
    if not _NAME.fullmatch(name) or name in BUILTIN_POLICIES:
        raise name_node.error(
            "must match [A-Za-z0-9][A-Za-z0-9._-]* (at most 63 chars) and not be allow/deny"
        )
    jwt = _jwt(keys, f.required("jwt"))
    path_claim = f.present("pathClaim")
    return PolicyConfig(
        name=name,
        jwt=jwt,
        path_claim=_path_claim(path_claim) if path_claim is not None else None,
        remove_authorization=f.boolean("removeAuthorization"),
        claims_to_headers=_claims_to_headers(f.present("claimsToHeaders")),
        claims_to_metadata=_claims_to_metadata(f.present("claimsToMetadata")),
    )


def _path_claim(node: Node) -> PathClaimConfig:
    f = node.fields(optional=("name", "match"))
    name = f.optional("name")
    match = f.optional("match")
    return PathClaimConfig(
        name.string() if name is not None else "path",
        PathMatch(match.choice(("PREFIX", "SEGMENT")) if match is not None else "PREFIX"),
    )


def _claims_to_headers(node: Node | None) -> tuple[ClaimHeader, ...]:
    headers: list[ClaimHeader] = []
    for item in node.items() if node is not None else []:
        entry = item.fields(("claim", "header"))
        claim = entry.required("claim").string()
        header_node = entry.required("header")
        header = header_node.string().lower()
        if not _HEADER.fullmatch(header) or header in _RESERVED_HEADERS:
            raise header_node.error("must be a plain lower-case header name, not a reserved one")
        if header.startswith("x-ext-authz-"):
            raise header_node.error("x-ext-authz-* headers are reserved")
        headers.append(ClaimHeader(claim, header))
    if node is not None and len({h.header for h in headers}) != len(headers):
        raise node.error("duplicate header")
    return tuple(headers)


def _claims_to_metadata(node: Node | None) -> tuple[str, ...]:
    """Claim names to publish: bounded in number and length, each once."""
    if node is None:
        return ()
    items = node.items()
    if len(items) > claim_metadata.MAX_CLAIMS:
        raise node.error(f"at most {claim_metadata.MAX_CLAIMS} claims can be published")
    names: list[str] = []
    for item in items:
        name = item.string()
        if not claim_metadata.NAME_PATTERN.fullmatch(name):
            raise item.error(
                f"a claim name is 1 to {claim_metadata.MAX_NAME_CHARS} visible ASCII characters"
            )
        if name in names:
            raise item.error(f"duplicate claim {name!r}")
        names.append(name)
    return tuple(names)


def _jwt(keys: _KeyMaterial, node: Node) -> JwtConfig:
    f = node.fields(("algorithms", "keys"), ("leewaySeconds", "issuer", "audiences"))
    algorithms = _algorithms(f.required("algorithms"))
    keys_node = f.required("keys")
    entries = keys_node.items()
    if not entries:
        raise keys_node.error("must be a non-empty list")
    static: list[VerifyKey] = []
    remotes: list[JwksUriConfig] = []
    for entry in entries:
        _key(keys, entry, algorithms, static, remotes)
    issuer = f.present("issuer")
    audiences = f.present("audiences")
    return JwtConfig(
        algorithms=algorithms,
        static_keys=tuple(static),
        jwks_uris=tuple(remotes),
        leeway_seconds=f.number("leewaySeconds", 0.0, lo=0.0, hi=300.0),
        issuer=issuer.string() if issuer is not None else None,
        audiences=frozenset(
            a.string() for a in (audiences.items() if audiences is not None else [])
        ),
    )


def _algorithms(node: Node) -> frozenset[str]:
    items = node.items()
    if not items:
        raise node.error("must be a non-empty list")
    for item in items:
        alg = item.value
        if not isinstance(alg, str) or alg not in SUPPORTED_ALGORITHMS:
            hint = " ('none' is never accepted)" if str(alg).lower() == "none" else ""
            raise item.error(
                f"unsupported algorithm {alg!r}{hint}; supported: "
                + ", ".join(sorted(SUPPORTED_ALGORITHMS))
            )
    return frozenset(item.value for item in items)


def _key(
    keys: _KeyMaterial,
    node: Node,
    algorithms: frozenset[str],
    static: list[VerifyKey],
    remotes: list[JwksUriConfig],
) -> None:
    """One ``keys`` entry: a static key (appended to ``static``) or a remote JWKS."""
    entry = node.fields(optional=("hmacSecret", "publicKeyPem", "jwks", "kid"))
    kinds = [k for k in ("hmacSecret", "publicKeyPem", "jwks") if k in entry]
    if len(kinds) != 1:
        raise node.error("give exactly one of hmacSecret, publicKeyPem, jwks")
    kind = kinds[0]
    material = entry.node.child(kind)
    kid_node = entry.optional("kid")
    kid = kid_node.string() if kid_node is not None else None
    if kind == "jwks" and kid_node is not None:
        raise kid_node.error("kid comes from the JWKS itself")
    before = len(static)
    try:
        if kind == "hmacSecret":
            static.append(hmac_key(keys.read(material), kid=kid))
        elif kind == "publicKeyPem":
            static.append(pem_public_key(keys.read(material), kid=kid))
        elif isinstance(material.value, dict) and "uri" in material.value:
            remotes.append(_jwks_uri(material))
        else:
            static.extend(parse_jwks(keys.read(material)).keys.keys)
    except KeyError_ as exc:
        raise material.error(str(exc)) from None
    for key in static[before:]:
        if not any(key.usable_for(alg) for alg in algorithms):
            raise material.error(
                f"a {key.family} key is usable by none of the allowed algorithms "
                f"({', '.join(sorted(algorithms))})"
            )


def _jwks_uri(node: Node) -> JwksUriConfig:
    f = node.fields(
        ("uri",), ("cacheSeconds", "minRefetchSeconds", "timeoutSeconds", "kidMissWaitSeconds")
    )
    timeout = f.number("timeoutSeconds", 2.0, lo=0.1, hi=60.0)
    return JwksUriConfig(
        uri=f.required("uri").url(),
        cache_seconds=f.number("cacheSeconds", 600.0, lo=1.0, hi=86_400.0),
        min_refetch_seconds=f.number("minRefetchSeconds", 10.0, lo=0.0, hi=3_600.0),
        timeout_seconds=timeout,
        kid_miss_wait_seconds=f.number("kidMissWaitSeconds", 0.1, lo=0.0, hi=timeout),
    )
