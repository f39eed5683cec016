"""Profiles in use: available profiles, blame, and the effective settings of an object.

Profiles themselves are an ordinary kind (:mod:`mgmt_api.kinds.profile`);
this module adds what needs several objects at once. The layers an object's
settings come from are gathered in one place (:func:`settings_layers`), so
``blame`` and what a cluster's control plane syncs (``.../config``) can never
disagree about which mandate wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import Connection

from meshplane.kinds_contract import Kind
from mgmt_api import access
from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.domain import blame as blamemod
from mgmt_api.domain import rbac
from mgmt_api.errors import not_found
from mgmt_api.schemas.profiles import AvailableProfile, BlameEntry, BlameResponse
from mgmt_api.store import repo
from mgmt_api.store.uow import UnitOfWork

PROFILE_LEVELS = (Kind.ORGANIZATION, Kind.TENANT, Kind.WORKSPACE)
# Spec keys that describe the object rather than configure it: not settings.
NOT_SETTINGS = frozenset(
    {"fqn", "etag", "createTime", "updateTime", "displayName", "description", "labels", "profiles"}
)


def _levels(target: str) -> list[str]:
    """The organization, tenant and workspace on the path to ``target``, top down."""
    return [a for a in fqnmod.ancestors(target) if a and fqnmod.parse(a).kind in PROFILE_LEVELS]


def _profile_view(res: repo.Resource) -> AvailableProfile:
    return AvailableProfile(
        fqn=res.fqn,
        display_name=res.spec.get("displayName", ""),
        description=res.spec.get("description", ""),
        level=fqnmod.parse(res.parent).kind.upper(),
    )


@dataclass(frozen=True)
class SettingsLayers:
    """Where an object's settings come from, in the order they apply."""

    refs: list[str]  # the profiles attached on the way down, in order
    missing: list[str]  # of those, the ones that no longer exist
    layers: list[blamemod.Layer]


def settings_layers(conn: Connection, own: repo.Resource) -> SettingsLayers:
    """The profiles attached to each level above and at the object (organization,
    tenant, workspace; a cluster's level is its organization), in the order
    listed there, each profile's defaults then its mandates; last, the
    object's own spec."""
    levels = _levels(own.fqn)
    objects = repo.get_many(conn, levels)
    refs = [r for lv in levels if lv in objects for r in objects[lv].spec.get("profiles") or []]
    profiles = repo.get_many(conn, refs)
    layers: list[blamemod.Layer] = []
    for ref in refs:
        if ref in profiles:
            for section in (blamemod.Section.DEFAULTS, blamemod.Section.MANDATES):
                settings = profiles[ref].spec.get(section.value.lower()) or {}
                layers.append(blamemod.Layer(blamemod.Source(ref, "PROFILE", section), settings))
    settings = {k: v for k, v in own.spec.items() if k not in NOT_SETTINGS}
    layers.append(
        blamemod.Layer(blamemod.Source(own.fqn, "RESOURCE", blamemod.Section.OWN), settings)
    )
    return SettingsLayers(refs, [r for r in refs if r not in profiles], layers)


class ProfileService:
    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow

    @staticmethod
    def _read(conn: Connection, ctx: CallContext, fqn: str) -> repo.Resource:
        access.require(conn, ctx.principal, fqn, fqnmod.parse(fqn).kind, rbac.READ)
        res = repo.get(conn, fqn)
        if res is None:
            raise not_found(fqn)
        return res

    def available(self, ctx: CallContext, fqn: str) -> list[AvailableProfile]:
        """Metadata of every profile usable at ``fqn``: its own and its ancestors'."""
        with self.uow.read() as conn:
            self._read(conn, ctx, fqn)
            return [
                _profile_view(p)
                for level in _levels(fqn)
                for p in repo.all_children(conn, level, Kind.PROFILE)
            ]

    def blame(self, ctx: CallContext, fqn: str) -> BlameResponse:
        """Effective settings of ``fqn`` with provenance (see :func:`settings_layers`)."""
        with self.uow.read() as conn:
            found = settings_layers(conn, self._read(conn, ctx, fqn))
        return BlameResponse(
            fqn=fqn,
            profiles=found.refs,
            missing_profiles=found.missing,
            entries=[BlameEntry.model_validate(e.to_json()) for e in blamemod.blame(found.layers)],
        )
