"""Rules several kinds share: profile references and namespace selectors."""

from __future__ import annotations

from typing import Any

from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.domain import blame
from mgmt_api.domain.lookup import validate_names
from mgmt_api.errors import invalid
from mgmt_api.kinds.base import Behaviour, Write, WriteEnv
from mgmt_api.schemas.resources import ConfigGenerationMetadata, Meta, NamespaceSelector
from mgmt_api.store import repo


def validate_profile_refs(write: Write) -> None:
    """Each entry of ``profiles`` is a Profile FQN, listed once.

    Whether it exists and may be used from the object is checked in the
    write transaction (:func:`check_profile_refs`).
    """
    seen: set[str] = set()
    for i, ref in enumerate(write.spec.get("profiles") or []):
        field = f"{write.prefix}.profiles[{i}]"
        if fqnmod.parse(ref, field).kind != Kind.PROFILE:
            raise invalid(field, f"{ref!r} is not a profile FQN")
        if ref in seen:
            raise invalid(field, f"{ref!r} is listed twice")
        seen.add(ref)


def check_profile_refs(env: WriteEnv, write: Write) -> None:
    """``profiles`` exist and were created at the object's level or above."""
    refs: list[str] = write.spec.get("profiles") or []
    found = repo.get_many(env.tx.conn, refs)
    for i, ref in enumerate(refs):
        field = f"{write.prefix}.profiles[{i}]"
        if not blame.usable_at(ref, write.fqn):
            raise invalid(
                field,
                f"{ref} is not usable here: a profile is usable at the level it was "
                "created at and below it",
            )
        if ref not in found:
            raise invalid(field, f"{ref} does not exist")


class Selecting(Meta):
    """What workspaces and security groups share: the namespaces they select."""

    namespace_selector: NamespaceSelector | None = None
    deletion_protection_enabled: bool | None = None
    config_generation_metadata: ConfigGenerationMetadata | None = None


def validate_selector(spec: dict[str, Any], prefix: str, *, required: bool) -> None:
    """``namespaceSelector.names``: at least one ``cluster/namespace`` pattern."""
    selector = spec.get("namespaceSelector")
    if selector is None:
        if required:
            raise invalid(f"{prefix}.namespaceSelector", "is required")
        return
    names = selector.get("names") or []
    if not names:
        raise invalid(f"{prefix}.namespaceSelector.names", "needs at least one cluster/namespace")
    validate_names(names, f"{prefix}.namespaceSelector.names")


class ProfiledBehaviour(Behaviour):
    """Organizations, tenants and workspaces: objects profiles attach to."""

    def validate(self, write: Write) -> None:
        validate_profile_refs(write)

    def check_references(self, env: WriteEnv, write: Write) -> None:
        check_profile_refs(env, write)
