"""The audit log of an organization: who did what to which FQN, and when.

Every write records its audit entries in its own transaction
(:meth:`mgmt_api.store.uow.Tx.audit`), filed under the organization of the
object written, so this view is exactly the organization's history.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplane import kinds_contract
from meshplane.kinds_contract import Kind
from mgmt_api import access
from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.domain import rbac
from mgmt_api.domain.times import rfc3339
from mgmt_api.errors import invalid, not_found
from mgmt_api.schemas.resources import AuditLog, AuditLogList
from mgmt_api.store import repo
from mgmt_api.store.uow import UnitOfWork


@dataclass(frozen=True)
class AuditFilters:
    """Optional, combined: ``kind`` (any word naming a kind, case-insensitively:
    ``user``, ``BTP``; other kinds, such as the pseudo-kinds of cleanup and
    approvals, exactly), exact ``operation`` and ``triggered_by`` (the actor's
    FQN), and ``fqn_prefix`` (an object and everything below it)."""

    kind: str = ""
    operation: str = ""
    triggered_by: str = ""
    fqn_prefix: str = ""

    def as_store_filters(self) -> dict[str, str]:
        shape = kinds_contract.lookup(self.kind) if self.kind else None
        named = (
            ("kind", shape.kind if shape is not None else self.kind),
            ("operation", self.operation),
            ("triggeredBy", self.triggered_by),
            ("fqnPrefix", self.fqn_prefix),
        )
        return {name: value for name, value in named if value}


class AuditService:
    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow

    def list(
        self,
        ctx: CallContext,
        organization: str,
        *,
        page_size: int,
        page_token: str,
        filters: AuditFilters | None = None,
    ) -> AuditLogList:
        """Newest first (needs READ on the organization)."""
        org_fqn = fqnmod.organization_fqn(organization)
        before: int | None = None
        if page_token:
            if not page_token.isdigit():
                raise invalid("pageToken", "is not a token this server issued")
            before = int(page_token)
        with self.uow.read() as conn:
            access.require(conn, ctx.principal, org_fqn, Kind.ORGANIZATION, rbac.READ)
            if not repo.exists(conn, org_fqn):
                raise not_found(org_fqn)
            wanted = (filters or AuditFilters()).as_store_filters()
            records = repo.list_audit(conn, organization, before, page_size + 1, wanted)
        more = len(records) > page_size
        records = records[:page_size]
        return AuditLogList(
            audit_logs=[
                AuditLog(
                    id=str(r.id),
                    create_time=rfc3339(r.time),
                    kind=r.kind,
                    operation=r.operation,
                    fqn=r.fqn,
                    triggered_by=r.actor,
                    message=r.message,
                    properties=r.properties,
                )
                for r in records
            ],
            next_page_token=str(records[-1].id) if more else "",
        )
