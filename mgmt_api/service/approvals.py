"""Approval policies on organizations and clusters: storage, permissions, audit.

The policy of a resource is one row of the generic ``resources`` table, kind
``ApprovalPolicy``, at ``{resource}/approvals/policy``: deleting the resource
deletes (and so revokes) its policy through the ordinary recursive delete,
and every write gets an etag from the global revision like any object.

Each operation has its own permission, expressed in the existing RBAC
machinery as a (kind, permission) pair checked on the resource, so custom
roles can grant exactly one operation (``types: [{kinds: [...]}]``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from meshplane.kinds_contract import Kind
from mgmt_api import access as authz
from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.domain import approvals as ap
from mgmt_api.domain import rbac
from mgmt_api.domain.times import rfc3339
from mgmt_api.errors import ApiError, Code, invalid, not_found, permission_denied
from mgmt_api.schemas.approvals import AccessCheckResponse, ApprovalPolicy
from mgmt_api.store import repo
from mgmt_api.store.uow import Tx, UnitOfWork

POLICY_KIND = Kind.APPROVAL_POLICY
POLICY_NAME = "policy"
TARGET_KINDS = (Kind.ORGANIZATION, Kind.CLUSTER)


@dataclass(frozen=True, slots=True)
class Operation:
    """One approval operation: its permission name and the RBAC check behind it."""

    name: str
    kind: str
    permission: str


READ_POLICY = Operation("ReadApprovalPolicy", POLICY_KIND, rbac.READ)
CREATE_POLICY = Operation("CreateApprovalPolicy", POLICY_KIND, rbac.CREATE)
WRITE_POLICY = Operation("WriteApprovalPolicy", POLICY_KIND, rbac.WRITE)
DELETE_POLICY = Operation("DeleteApprovalPolicy", POLICY_KIND, rbac.DELETE)
REQUEST_ACCESS = Operation("WriteApprovalPolicyAccessRequest", "ApprovalAccessRequest", rbac.WRITE)
DELETE_REQUEST = Operation(
    "DeleteApprovalPolicyAccessRequest", "ApprovalAccessRequest", rbac.DELETE
)
APPROVE_ACCESS = Operation("WriteApprovalPolicyApproveAccess", "ApprovalApprovedAccess", rbac.WRITE)
ADD_APPROVED = Operation(
    "CreateApprovalPolicyApprovedAccess", "ApprovalApprovedAccess", rbac.CREATE
)
DELETE_APPROVED = Operation(
    "DeleteApprovalPolicyApprovedAccess", "ApprovalApprovedAccess", rbac.DELETE
)
CHECK_ACCESS = Operation("CheckApprovalPolicyAccess", "ApprovalAccessCheck", rbac.READ)
OPERATIONS: tuple[Operation, ...] = (
    READ_POLICY,
    CREATE_POLICY,
    WRITE_POLICY,
    DELETE_POLICY,
    REQUEST_ACCESS,
    DELETE_REQUEST,
    APPROVE_ACCESS,
    ADD_APPROVED,
    DELETE_APPROVED,
    CHECK_ACCESS,
)


def policy_fqn(resource: str) -> str:
    return f"{resource}/approvals/{POLICY_NAME}"


def _allowed_on(
    conn: Connection, ctx: CallContext, targets: list[str]
) -> dict[str, dict[str, frozenset[str]]]:
    """The caller's permissions per approval kind on each target, in two queries.

    The policies on every target's path and the custom roles they bind are
    read once for all targets, instead of a full permission check per target
    and kind (what ``authz.permissions`` would cost).
    """
    paths = {t: fqnmod.ancestors(t) for t in targets}
    stored = repo.get_policies(conn, sorted({n for path in paths.values() for n in path}))
    allows = {t: [stored[n].allow for n in path if n in stored] for t, path in paths.items()}
    subjects = ctx.principal.subjects
    names = rbac.referenced_roles([a for each in allows.values() for a in each], subjects)
    roles: dict[str, tuple[rbac.Rule, ...]] = {
        n: rbac.BUILTIN_ROLES[n] for n in names if n in rbac.BUILTIN_ROLES
    }
    custom = [n for n in names if n not in rbac.BUILTIN_ROLES and n.startswith("rbac/")]
    roles.update({f: rbac.rules_from_spec(r.spec) for f, r in repo.get_many(conn, custom).items()})
    kinds = sorted({op.kind for op in OPERATIONS})
    return {
        t: {k: rbac.effective_permissions(allows[t], subjects, roles, k) for k in kinds}
        for t in targets
    }


def _require(conn: Connection, ctx: CallContext, resource: str, op: Operation) -> None:
    if op.permission not in authz.permissions(conn, ctx.principal, resource, op.kind):
        raise permission_denied(op.name, resource, op.kind)


def _render(res: repo.Resource, resource: str, *, details: bool = True) -> ApprovalPolicy:
    """The stored policy as the API shows it (validated as the response model was)."""
    out: dict[str, Any] = {"resource": resource, "mode": res.spec["mode"]}
    if details:
        out.update({k: v for k, v in res.spec.items() if k != "mode"})
    out.update(
        etag=res.etag, createTime=rfc3339(res.create_time), updateTime=rfc3339(res.update_time)
    )
    return ApprovalPolicy.model_validate(out)


def same_resource(given: str | None, resource: str, field: str) -> None:
    if given is not None and given != resource:
        raise invalid(field, f"{given!r} differs from the path's resource {resource!r}")


@dataclass(frozen=True, slots=True)
class Transition:
    """A state-table transition: its permission, pure step and audit record."""

    operation: Operation
    step: Callable[[ap.Policy, ap.Access], ap.Policy]
    audit: str
    message: str  # formatted with subject, permissions, on (the resource)


TRANSITIONS: dict[str, Transition] = {
    "requested:add": Transition(
        REQUEST_ACCESS,
        ap.add_request,
        "ADD_ACCESS_REQUEST",
        "{subject} requested {permissions} on {on}",
    ),
    "requested:approve": Transition(
        APPROVE_ACCESS,
        ap.approve_request,
        "APPROVE_ACCESS_REQUEST",
        "approved {permissions} for {subject} on {on}",
    ),
    "requested:delete": Transition(
        DELETE_REQUEST,
        lambda p, a: ap.delete_request(p, a.subject),
        "DELETE_ACCESS_REQUEST",
        "withdrew the access request of {subject} on {on}",
    ),
    "approved:add": Transition(
        ADD_APPROVED,
        ap.add_approved,
        "ADD_APPROVED_ACCESS",
        "granted {permissions} to {subject} on {on}",
    ),
    "approved:delete": Transition(
        DELETE_APPROVED,
        lambda p, a: ap.delete_approved(p, a.subject),
        "DELETE_APPROVED_ACCESS",
        "revoked the approved access of {subject} on {on}",
    ),
}


class ApprovalService:
    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow

    @staticmethod
    def _target(conn: Connection, resource: str) -> None:
        if not repo.exists(conn, resource):
            raise not_found(resource)

    # ---- policy --------------------------------------------------------

    def get(self, ctx: CallContext, resource: str) -> ApprovalPolicy:
        with self.uow.read() as conn:
            _require(conn, ctx, resource, READ_POLICY)
            self._target(conn, resource)
            res = repo.get(conn, policy_fqn(resource))
            if res is None:
                raise not_found(f"{resource} approval policy")
            return _render(res, resource)

    def set_policy(
        self,
        ctx: CallContext,
        resource: str,
        mode: ap.Mode,
        *,
        metadata: dict[str, Any] | None,
        etag: str | None,
    ) -> None:
        """Create the policy or change its mode and metadata.

        The requested and approved lists are never set here (the route
        refuses them): each change of those has its own operation, permission
        and audit record, which SetPolicy would otherwise bypass.
        """
        fqn = policy_fqn(resource)
        with self.uow.write(ctx.principal.fqn) as tx:
            conn = tx.conn
            existing = repo.get(conn, fqn)
            _require(conn, ctx, resource, WRITE_POLICY if existing else CREATE_POLICY)
            self._target(conn, resource)
            current = ap.Policy.from_json(existing.spec) if existing else None
            if etag and etag != (existing.etag if existing else None):
                raise ApiError(
                    Code.ABORTED,
                    f"{resource} approval policy changed since etag {etag} was read",
                    metadata={"fqn": resource},
                )
            policy = ap.set_policy(current, mode, metadata=metadata)
            if existing is None:
                repo.insert(
                    conn,
                    repo.new_resource(
                        fqn,
                        POLICY_KIND,
                        dict(policy.to_json()),
                        revision=tx.revision,
                        creator=ctx.principal.fqn,
                        parent=resource,  # approval-policy FQNs are not in the path grammar
                        name=POLICY_NAME,
                    ),
                )
            else:
                self._store(tx, existing, policy)
            _audit(
                tx,
                resource,
                "SET_APPROVAL_POLICY",
                f"approval policy of {resource} set to mode {mode.value}",
                mode=mode.value,
                created=existing is None,
            )

    def delete_policy(self, ctx: CallContext, resource: str, *, force: bool) -> None:
        """Revoke every approval and stop accepting requests.

        ``force`` is accepted for the reference's signature: the policy owns no
        internal, deletion-protected objects here, so it changes nothing.
        """
        with self.uow.write(ctx.principal.fqn) as tx:
            conn = tx.conn
            _require(conn, ctx, resource, DELETE_POLICY)
            self._target(conn, resource)
            existing = repo.get(conn, policy_fqn(resource))
            if existing is None:
                raise not_found(f"{resource} approval policy")
            repo.delete_subtree(conn, existing.fqn)
            revoked = [a["subject"] for a in existing.spec.get("approved") or []]
            _audit(
                tx,
                resource,
                "DELETE_APPROVAL_POLICY",
                f"approval policy of {resource} deleted; {len(revoked)} approvals revoked",
                revoked=revoked,
                force=force,
            )

    # ---- access requests and approvals ----------------------------------

    def transition(self, ctx: CallContext, resource: str, name: str, access: ap.Access) -> None:
        """Run the transition ``name`` (a path suffix such as ``requested:add``).

        For the two deletes only ``access.subject`` matters.
        """
        tr = TRANSITIONS[name]
        with self.uow.write(ctx.principal.fqn) as tx:
            conn = tx.conn
            _require(conn, ctx, resource, tr.operation)
            self._target(conn, resource)
            existing = repo.get(conn, policy_fqn(resource))
            if existing is None:  # no policy: no approval requests are accepted
                raise not_found(f"{resource} approval policy")
            try:
                policy = tr.step(ap.Policy.from_json(existing.spec), access)
            except ap.ApprovalError as exc:
                raise ApiError(Code.NOT_FOUND, exc.message) from None
            self._store(tx, existing, policy)
            props: dict[str, str | list[str]] = {
                "subject": access.subject,
                "mode": policy.mode.value,
            }
            if access.permissions:
                props["permissions"] = list(access.permissions)
            message = tr.message.format(
                subject=access.subject, permissions=", ".join(access.permissions), on=resource
            )
            _audit(tx, resource, tr.audit, message, **props)

    @staticmethod
    def _store(tx: Tx, existing: repo.Resource, policy: ap.Policy) -> None:
        repo.update_if_etag(
            tx.conn,
            existing.fqn,
            existing.etag,
            spec=dict(policy.to_json()),
            protected=False,
            etag=tx.etag(existing.fqn),
            update_time=repo.now_us(),
        )

    # ---- reads -----------------------------------------------------------

    def check(
        self, ctx: CallContext, resource: str, subject: str, permission: str
    ) -> AccessCheckResponse:
        with self.uow.read() as conn:
            _require(conn, ctx, resource, CHECK_ACCESS)
            self._target(conn, resource)
            res = repo.get(conn, policy_fqn(resource))
            if res is None:
                raise not_found(f"{resource} approval policy")
            policy = ap.Policy.from_json(res.spec)
            decision = ap.check(policy, subject, permission)
            return AccessCheckResponse.model_validate(
                {"allowed": decision.allowed, "mode": policy.mode.value, "reason": decision.reason}
            )

    def query(
        self,
        ctx: CallContext,
        resource: str,
        *,
        types: list[str],
        details: bool,
        permissions: bool,
    ) -> list[ApprovalPolicy]:
        """The policies of ``resource`` and, for an organization, of its clusters,
        that the caller may read (ReadApprovalPolicy).

        Permission comes before existence, as everywhere: a caller who may not
        read policies at ``resource`` gets the same empty answer whether it
        exists or not (a missing organization has no clusters to show), and
        only a caller who may read there learns that it does not exist (404).
        """
        wanted = set(types or TARGET_KINDS)
        with self.uow.read() as conn:
            targets = [resource]
            if Kind.CLUSTER in wanted and fqnmod.cluster_of(resource) is None:
                # An organization's query includes its clusters' policies.
                targets += [c.fqn for c in repo.all_children(conn, resource, Kind.CLUSTER)]
            allowed = _allowed_on(conn, ctx, targets)
            if READ_POLICY.permission in allowed[resource][READ_POLICY.kind]:
                self._target(conn, resource)
            readable = [
                t
                for t in targets
                if fqnmod.parse(t).kind in wanted
                and READ_POLICY.permission in allowed[t][READ_POLICY.kind]
            ]
            stored = repo.get_many(conn, [policy_fqn(t) for t in readable])
            out: list[ApprovalPolicy] = []
            for target in readable:
                res = stored.get(policy_fqn(target))
                if res is None:
                    continue
                item = _render(res, target, details=details)
                if permissions:
                    item.allowed_operations = [
                        op.name for op in OPERATIONS if op.permission in allowed[target][op.kind]
                    ]
                out.append(item)
            return out


def _audit(tx: Tx, resource: str, op: str, message: str, **props: Any) -> None:
    """Audited like every resource write, on the organization or cluster."""
    tx.audit(resource, POLICY_KIND, op, message, **props)
