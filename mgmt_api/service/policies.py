"""Access policies: one per object, plus the root and RBAC policies.

The root policy lives on the root node (FQN ``""``) and the RBAC policy on
the ``rbac`` node, the parent of every Role, so the same inheritance rule
(root -> ... -> object) covers all three kinds of policy.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine

from mgmt_api import fqn as fqnmod
from mgmt_api.domain import etags, rbac
from mgmt_api.errors import ApiError, Code, invalid, not_found
from mgmt_api.service import authz, validation
from mgmt_api.service.resources import CallContext
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx, write_tx


def _kind_of(fqn: str) -> str:
    if fqn == fqnmod.ROOT:
        return fqnmod.ROOT_KIND
    if fqn == fqnmod.RBAC:
        return fqnmod.RBAC_KIND
    return fqnmod.parse(fqn).kind


class PolicyService:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def get(self, ctx: CallContext, fqn: str) -> dict[str, Any]:
        kind = _kind_of(fqn)
        # Reading who has access to an object is as sensitive as changing it
        # for the global policies; per-object policies need READ.
        needed = rbac.SET_POLICY if fqn in (fqnmod.ROOT, fqnmod.RBAC) else rbac.READ
        with read_tx(self.engine) as conn:
            authz.require(conn, ctx.principal, fqn, kind, needed)
            policy = repo.get_policies(conn, [fqn]).get(fqn)
            if policy is None:
                raise not_found(f"{fqn or 'root'} policy")
            out: dict[str, Any] = {"fqn": fqn, "etag": policy.etag, "allow": policy.allow}
            if policy.description:
                out["description"] = policy.description
            return out

    def put(
        self,
        ctx: CallContext,
        fqn: str,
        allow: list[dict[str, Any]],
        description: str,
        etag: str | None,
    ) -> None:
        kind = _kind_of(fqn)
        if not etag:
            raise invalid("etag", "is required on update; GET the policy and send its etag")
        if fqn == fqnmod.ROOT and not any(
            b.get("role") == rbac.ADMIN_ROLE and b.get("subjects") for b in allow
        ):
            # Without an rbac/admin binding at the root nobody could ever grant
            # anything again; refuse rather than brick the installation.
            raise ApiError(
                Code.FAILED_PRECONDITION,
                "the root policy must keep at least one rbac/admin binding",
            )
        custom = {b.get("role", "") for b in allow} - set(rbac.BUILTIN_ROLES)
        with write_tx(self.engine) as conn:
            revision = repo.bump_revision(conn)
            authz.require(conn, ctx.principal, fqn, kind, rbac.SET_POLICY)
            existing = repo.get_policies(conn, [fqn]).get(fqn)
            if existing is None:
                raise not_found(f"{fqn or 'root'} policy")
            known = {r for r in repo.get_many(conn, sorted(custom)) if r.startswith("rbac/")}
            validation.validate_policy(allow, known)
            if not repo.update_policy_if_etag(
                conn,
                fqn,
                old_etag=etag,
                allow=allow,
                description=description,
                etag=etags.compute(fqn + "#policy", revision),
            ):
                raise ApiError(
                    Code.ABORTED,
                    f"policy of {fqn or 'root'} changed since etag {etag} was read; "
                    "GET it again and retry",
                )
            repo.audit(
                conn,
                organization=fqnmod.org_name(fqn),
                fqn=fqn,
                kind=kind,
                operation="SET_POLICY",
                actor=ctx.principal.fqn,
                message=f"set policy of {fqn or 'root'}",
                properties={"allow": allow},
            )

    def permissions(self, ctx: CallContext, fqn: str) -> list[str]:
        kind = _kind_of(fqn)
        with read_tx(self.engine) as conn:
            if fqn not in (fqnmod.ROOT, fqnmod.RBAC) and not repo.exists(conn, fqn):
                raise not_found(fqn)
            return rbac.sorted_permissions(authz.permissions(conn, ctx.principal, fqn, kind))
