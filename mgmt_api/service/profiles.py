"""Profiles in use: reference checks, available profiles and blame (spec §4.6).

Profiles themselves are an ordinary kind (``mgmt_api.kinds``); this module
adds what needs several objects at once. It imports nothing from
``mgmt_api.service.resources`` at run time because that module calls
:func:`check_references` inside its write transactions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine

from mgmt_api import fqn as fqnmod
from mgmt_api.domain import blame as blamemod
from mgmt_api.domain import rbac
from mgmt_api.errors import invalid, not_found
from mgmt_api.service import authz
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx

if TYPE_CHECKING:
    from mgmt_api.service.resources import CallContext

PROFILE_LEVELS = ("Organization", "Tenant", "Workspace")
# Spec keys that describe the object rather than configure it: not settings.
NOT_SETTINGS = frozenset(
    {"fqn", "etag", "createTime", "updateTime", "displayName", "description", "labels", "profiles"}
)


def check_references(conn: Connection, fqn: str, spec: dict[str, Any], prefix: str) -> None:
    """``profiles`` of the object at ``fqn`` exist and were created at its level or above."""
    refs: list[str] = spec.get("profiles") or []
    found = repo.get_many(conn, refs)
    for i, ref in enumerate(refs):
        field = f"{prefix}.profiles[{i}]"
        if not blamemod.usable_at(ref, fqn):
            raise invalid(
                field,
                f"{ref} is not usable here: a profile is usable at the level it was "
                "created at and below it",
            )
        if ref not in found:
            raise invalid(field, f"{ref} does not exist")


def _levels(target: str) -> list[str]:
    """The organization, tenant and workspace on the path to ``target``, top down."""
    return [a for a in fqnmod.ancestors(target) if a and fqnmod.parse(a).kind in PROFILE_LEVELS]


def _profile_view(res: repo.Resource) -> dict[str, Any]:
    return {
        "fqn": res.fqn,
        "displayName": res.spec.get("displayName", ""),
        "description": res.spec.get("description", ""),
        "level": fqnmod.parse(res.parent).kind.upper(),
    }


class ProfileService:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @staticmethod
    def _read(conn: Connection, ctx: CallContext, fqn: str) -> repo.Resource:
        authz.require(conn, ctx.principal, fqn, fqnmod.parse(fqn).kind, rbac.READ)
        res = repo.get(conn, fqn)
        if res is None:
            raise not_found(fqn)
        return res

    def available(self, ctx: CallContext, fqn: str) -> list[dict[str, Any]]:
        """Metadata of every profile usable at ``fqn``: its own and its ancestors'."""
        with read_tx(self.engine) as conn:
            self._read(conn, ctx, fqn)
            return [
                _profile_view(p)
                for level in _levels(fqn)
                for p in repo.all_children(conn, level, "Profile")
            ]

    def blame(self, ctx: CallContext, fqn: str) -> dict[str, Any]:
        """Effective settings of ``fqn`` with provenance.

        Layers: the profiles attached to each level above and at the object
        (organization, tenant, workspace; a cluster's level is its
        organization), in the order listed there, each profile's defaults then
        its mandates; last, the object's own spec.
        """
        with read_tx(self.engine) as conn:
            own = self._read(conn, ctx, fqn)
            levels = _levels(fqn)
            objects = repo.get_many(conn, levels)
            refs = [
                r for lv in levels if lv in objects for r in objects[lv].spec.get("profiles") or []
            ]
            profiles = repo.get_many(conn, refs)
        layers: list[blamemod.Layer] = []
        for ref in refs:
            if ref in profiles:
                for section in (blamemod.Section.DEFAULTS, blamemod.Section.MANDATES):
                    settings = profiles[ref].spec.get(section.value.lower()) or {}
                    layers.append(
                        blamemod.Layer(blamemod.Source(ref, "PROFILE", section), settings)
                    )
        settings = {k: v for k, v in own.spec.items() if k not in NOT_SETTINGS}
        layers.append(
            blamemod.Layer(blamemod.Source(fqn, "RESOURCE", blamemod.Section.OWN), settings)
        )
        return {
            "fqn": fqn,
            "profiles": refs,
            "missingProfiles": [r for r in refs if r not in profiles],
            "entries": [e.to_json() for e in blamemod.blame(layers)],
        }
