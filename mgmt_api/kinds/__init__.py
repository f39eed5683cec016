"""The registry of resource kinds: one module per kind, one table of them all.

Routers, the FQN grammar (:mod:`mgmt_api.fqn`) and the generic CRUD read this
table, so adding a kind is adding its row to the one table of kinds
(:data:`meshplane.kinds_contract.SHAPES`: name, collection, parents, body and
list fields, aliases) and its module here (its model, its
:class:`~mgmt_api.kinds.base.KindDef` and, if it has rules of its own, a
:class:`~mgmt_api.kinds.base.Behaviour`). It then gets CRUD, access policies,
permissions, paging, labels, audit, recursive delete and OpenAPI without
touching anything else; the FQN grammar, meshctl and the console read the
same row. The registry refuses to load if it and the table disagree.
"""

from __future__ import annotations

from meshplane import kinds_contract
from mgmt_api import fqn as fqnmod
from mgmt_api.kinds import (
    backend,
    backend_traffic_policy,
    cluster,
    ext_authz_policy,
    http_route,
    onboarding,
    organization,
    profile,
    role,
    security_group,
    security_setting,
    service_account,
    team,
    tenant,
    user,
    workspace,
)
from mgmt_api.kinds.base import Behaviour, KindDef, KindSettings, RouteParam

__all__ = [
    "KINDS",
    "Behaviour",
    "KindDef",
    "KindSettings",
    "RouteParam",
    "get",
    "item_templates",
    "parent_templates",
    "subject_field",
]

KINDS: dict[str, KindDef] = {
    module.KIND.kind: module.KIND
    for module in (
        organization,
        tenant,
        workspace,
        security_group,
        cluster,
        profile,
        user,
        team,
        service_account,
        backend_traffic_policy,
        http_route,
        backend,
        onboarding,
        security_setting,
        ext_authz_policy,
        role,
    )
}


def _check_against_contract() -> None:
    """Every CRUD kind of the contract has exactly one implementation here."""
    served = {s.kind for s in kinds_contract.CRUD_KINDS}
    if set(KINDS) != served:
        raise RuntimeError(
            f"kind registry and meshplane.kinds_contract disagree: {sorted(set(KINDS) ^ served)}"
        )


_check_against_contract()


def get(kind: str) -> KindDef:
    return KINDS[kind]


def subject_field(kind: str) -> str:
    """The access-policy subject field for a principal of ``kind`` (``user``, ...)."""
    field = KINDS[kind].subject_field if kind in KINDS else None
    if field is None:
        raise ValueError(f"{kind} objects cannot be principals")
    return field


def templates(kind: str) -> list[tuple[str, str]]:
    """(parent template, item template) of every place objects of ``kind`` live.

    Templates are paths without ``/v2/``: the parent's is ``""`` for the root
    and ``"rbac"`` for roles; the item's adds the collection and ``{param}``.
    """
    kdef = KINDS[kind]
    leaf = f"{kdef.collection}/{{{kdef.param}}}"
    out: list[tuple[str, str]] = []
    for parent in kdef.parents:
        if parent == fqnmod.ROOT_KIND:
            out.append(("", leaf))
        elif parent == fqnmod.RBAC_KIND:  # roles: the collection is the parent node
            out.append((fqnmod.RBAC, f"{fqnmod.RBAC}/{{{kdef.param}}}"))
        else:
            out.extend((item, f"{item}/{leaf}") for _, item in templates(parent))
    return out


def item_templates(kind: str) -> list[str]:
    """Every path template (without ``/v2/``) at which objects of ``kind`` live."""
    return [item for _, item in templates(kind)]


def parent_templates(kind: str) -> list[str]:
    """Templates of the parents (``""`` root, ``"rbac"``), aligned with ``item_templates``."""
    return [parent for parent, _ in templates(kind)]
