"""ExtAuthzPolicy objects → the ext_authz server's config file (docs/extauthz.md).

The management API stores each policy as one entry of the ext_authz file's
``policies`` list without its ``name``; this module names them, assembles the
file a cluster's ext_authz instances load, and validates a single policy with
extauthz's own loader so the API accepts exactly what the server will.

Key material must be inline (``value``) or fetched (``jwks.uri``): a
``file``/``env`` reference would be resolved on whichever host happens to
load it (the management plane when validating, every ext_authz host when
enforcing), so the same object could be valid here and NACKed there.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, TypedDict, cast

import yaml

from extauthz import contract
from meshplane.config_error import ConfigError
from mgmt_api import fqn as fqnmod

FILE_NAME = contract.FILE_NAME
DEFAULT_POLICY = "deny"
MAX_NAME = 63
_MATERIAL_KEYS = ("hmacSecret", "publicKeyPem", "jwks")


class StoredPolicy(TypedDict, total=False):
    """An ExtAuthzPolicy as stored: an entry of the ext_authz file's ``policies``
    without its name. ``jwt`` stays free-form JSON by design: it is ext_authz's own
    JWT configuration, whose shape ext_authz's loader owns (:func:`validate_policy`)."""

    jwt: dict[str, Any]
    pathClaim: dict[str, str]  # {name, match}
    removeAuthorization: bool
    claimsToHeaders: list[dict[str, str]]
    #: "local" | "external": where gateways enforce it (:mod:`mgmt_api.compiler.local_jwt`);
    #: not part of extauthz's file.
    enforcement: str


class PolicyEntry(StoredPolicy, total=False):
    """One entry of the ext_authz file's ``policies``, as rendered for a cluster."""

    name: str
    claimsToMetadata: list[str]


def policy_name(group_fqn: str, name: str) -> str:
    """Deterministic ext_authz policy name: ``{tenant}.{workspace}.{group}.{policy}``.

    Envoy selects it with the ``meshplane.policy`` context extension, so it
    must be stable across snapshots, and it must be unique in a cluster's
    ext_authz file, whose loader refuses a duplicate name (the whole snapshot
    would be NACKed). Every segment of the group's FQN that can differ
    between two groups reaching the same cluster is in the name: the tenant,
    the workspace and the group, then the policy. Each is a DNS-1123 label
    (no dot), so joining them with dots is unambiguous, and the result matches
    ext_authz's ``[A-Za-z0-9][A-Za-z0-9._-]*``. Names longer than ext_authz's
    63-character limit keep a readable prefix and a digest of the full FQN.
    """
    group = fqnmod.parse(group_fqn, "group")
    owners = (group.name_in("tenants"), group.name_in("workspaces"))
    full = ".".join([*(n for n in owners if n is not None), group.name, name])
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(f"{group_fqn}/{name}".encode()).hexdigest()[:10]
    return f"{full[: MAX_NAME - 11]}-{digest}"


def policy_entry(name: str, spec: StoredPolicy, claims: tuple[str, ...] = ()) -> PolicyEntry:
    """The ``policies[]`` entry for a stored ExtAuthzPolicy spec.

    ``claims`` are the verified claims the policy publishes as dynamic
    metadata, compiled from the cluster's BackendTrafficPolicies
    (:mod:`mgmt_api.compiler.identity_limits`), never stored with the policy.
    """
    entry: PolicyEntry = {"name": name, "jwt": spec["jwt"]}
    if spec.get("pathClaim") is not None:
        entry["pathClaim"] = spec["pathClaim"]
    if spec.get("removeAuthorization") is not None:
        entry["removeAuthorization"] = spec["removeAuthorization"]
    if spec.get("claimsToHeaders") is not None:
        entry["claimsToHeaders"] = spec["claimsToHeaders"]
    if claims:
        entry["claimsToMetadata"] = list(claims)
    return entry


def render_file(
    policies: list[tuple[str, StoredPolicy]],
    published: Mapping[str, tuple[str, ...]] | None = None,
) -> bytes:
    """The whole ext_authz config: ``defaultPolicy: deny`` plus ``policies``.

    Deny by default because a route that selects no (or an unknown) policy
    must not be let through just because the cluster has no matching rule.
    ``published``: policy name → the claims it publishes as dynamic metadata.
    """
    claims = published or {}
    doc = {
        "defaultPolicy": DEFAULT_POLICY,
        "policies": [
            policy_entry(name, spec, claims.get(name, ())) for name, spec in sorted(policies)
        ],
    }
    return yaml.safe_dump(doc, sort_keys=False).encode()


def _inline_only(spec: dict[str, Any]) -> None:
    keys = (spec.get("jwt") or {}).get("keys")
    if not isinstance(keys, list):
        return  # the loader reports the shape
    for i, key in enumerate(keys):
        if not isinstance(key, dict):
            continue
        for kind in _MATERIAL_KEYS:
            ref = key.get(kind)
            if isinstance(ref, dict):
                for forbidden in ("file", "env"):
                    if forbidden in ref:
                        raise ConfigError(
                            f"{forbidden} references are not allowed in a published policy; "
                            "give the key inline (value) or as jwks.uri",
                            field=f"jwt.keys[{i}].{kind}.{forbidden}",
                        )


def validate_policy(spec: dict[str, Any]) -> None:
    """Load ``spec`` as the only policy of an ext_authz config; raise ConfigError.

    The error's ``field`` is relative to the policy (``jwt.algorithms[1]``).
    """
    _inline_only(spec)
    try:
        # Unchecked input: the loader is what checks its shape against StoredPolicy's.
        contract.parse_config(render_file([("policy", cast(StoredPolicy, spec))]))
    except ConfigError as exc:
        field = exc.field or ""
        for prefix in ("policies[0].", "policies[0]"):
            if field.startswith(prefix):
                field = field[len(prefix) :]
                break
        raise ConfigError(exc.message, field=field or None) from None
