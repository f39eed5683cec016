"""Access policies: one per object, plus the root and RBAC policies.

The root policy lives on the root node (FQN ``""``) and the RBAC policy on
the ``rbac`` node, the parent of every Role, so the same inheritance rule
(root -> ... -> object) covers all three kinds of policy.
"""

from __future__ import annotations

from meshplane import kinds_contract
from mgmt_api import access as authz
from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.domain import rbac
from mgmt_api.errors import ApiError, Code, invalid, not_found
from mgmt_api.schemas.resources import AccessPolicy, Binding
from mgmt_api.store import repo
from mgmt_api.store.uow import UnitOfWork


def _stored(binding: Binding) -> rbac.StoredBinding:
    """A binding as stored (and audited): the JSON the API speaks, camelCase, no nulls."""
    return {
        "role": binding.role,
        "subjects": [s.model_dump(by_alias=True, exclude_none=True) for s in binding.subjects],
    }


def validate_bindings(allow: list[rbac.StoredBinding], known_custom_roles: set[str]) -> None:
    """Bindings name an existing role and subjects of the right kind."""
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
            kind = kinds_contract.SUBJECT_KINDS.get(key)
            if parsed.kind != kind:
                raise invalid(f"{field}.{key}", f"{subject[key]!r} is not a {kind} FQN")


class PolicyService:
    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow

    def get(self, ctx: CallContext, fqn: str) -> AccessPolicy:
        kind = authz.node_kind(fqn)
        # Reading who has access to an object is as sensitive as changing it
        # for the global policies; per-object policies need READ.
        needed = rbac.SET_POLICY if fqn in (fqnmod.ROOT, fqnmod.RBAC) else rbac.READ
        with self.uow.read() as conn:
            authz.require(conn, ctx.principal, fqn, kind, needed)
            policy = repo.get_policies(conn, [fqn]).get(fqn)
            if policy is None:
                raise not_found(f"{fqn or 'root'} policy")
            # The stored bindings went through Binding on the way in; validating them
            # here is what the response model did with the dict this used to return.
            return AccessPolicy.model_validate(
                {
                    "fqn": fqn,
                    "etag": policy.etag,
                    "allow": policy.allow,
                    "description": policy.description or None,
                }
            )

    def put(
        self,
        ctx: CallContext,
        fqn: str,
        bindings: list[Binding],
        description: str,
        etag: str,
    ) -> None:
        kind = authz.node_kind(fqn)
        allow = [_stored(b) for b in bindings]
        if not etag:
            raise invalid("etag", "is required on update; GET the policy and send its etag")
        if fqn == fqnmod.ROOT and not rbac.keeps_an_admin(allow):
            # Without an rbac/admin binding at the root nobody could ever grant
            # anything again; refuse rather than brick the installation.
            raise ApiError(
                Code.FAILED_PRECONDITION,
                "the root policy must keep at least one rbac/admin binding",
            )
        custom = {b.get("role", "") for b in allow} - set(rbac.BUILTIN_ROLES)
        with self.uow.write(ctx.principal.fqn) as tx:
            conn = tx.conn
            authz.require(conn, ctx.principal, fqn, kind, rbac.SET_POLICY)
            existing = repo.get_policies(conn, [fqn]).get(fqn)
            if existing is None:
                raise not_found(f"{fqn or 'root'} policy")
            known = {r for r in repo.get_many(conn, sorted(custom)) if r.startswith("rbac/")}
            validate_bindings(allow, known)
            if not repo.update_policy_if_etag(
                conn,
                fqn,
                old_etag=etag,
                allow=allow,
                description=description,
                etag=tx.etag(fqn, "#policy"),
            ):
                raise ApiError(
                    Code.ABORTED,
                    f"policy of {fqn or 'root'} changed since etag {etag} was read; "
                    "GET it again and retry",
                )
            tx.audit(fqn, kind, "SET_POLICY", f"set policy of {fqn or 'root'}", allow=allow)

    def permissions(self, ctx: CallContext, fqn: str) -> list[str]:
        kind = authz.node_kind(fqn)
        with self.uow.read() as conn:
            if fqn not in (fqnmod.ROOT, fqnmod.RBAC) and not repo.exists(conn, fqn):
                raise not_found(fqn)
            return rbac.sorted_permissions(authz.permissions(conn, ctx.principal, fqn, kind))
