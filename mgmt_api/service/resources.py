"""Generic CRUD over every kind; what differs per kind is its behaviour (:mod:`mgmt_api.kinds`).

Each operation is one unit of work (:mod:`mgmt_api.store.uow`): the permission
check, the write, the creator's policy, the kind's side effects (a cluster's
agent and key, onboarding) and the audit record commit or roll back together,
and the policy streams hear of it only after the commit.

Deletion protection: a protected object (or one with a protected object below
it) is deleted only with ``force=true``. An update turns protection off only
when the body says ``deletionProtectionEnabled: false``; a body that leaves
the field out keeps the stored value, so a PUT built from an older read (or
by a client that does not know the field) never silently unprotects.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from mgmt_api import access, kinds
from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.domain import listing, rbac
from mgmt_api.errors import ApiError, Code, already_exists, invalid, not_found
from mgmt_api.kinds.base import KindDef, KindSettings, RenderEnv, Write, WriteEnv, create_object
from mgmt_api.schemas.base import ApiModel
from mgmt_api.store import repo
from mgmt_api.store.uow import UnitOfWork

log = logging.getLogger(__name__)

MAX_SCAN = 10_000
_PROTECTION = "deletionProtectionEnabled"


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[dict[str, Any]]
    next_page_token: str


def spec_from(kdef: KindDef, body: ApiModel) -> dict[str, Any]:
    """The storable part of a request body: set fields, minus the output-only ones."""
    data = body.model_dump(by_alias=True, exclude_none=True, mode="json")
    return {k: v for k, v in data.items() if k not in kdef.output_only}


class ResourceService:
    """Create, read, list, update and delete objects of any kind."""

    def __init__(self, uow: UnitOfWork, settings: KindSettings) -> None:
        self.uow = uow
        self.settings = settings

    # ---- rendering -------------------------------------------------------

    def render(
        self, conn: Connection, res: repo.Resource, options: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        env = RenderEnv(conn, self.settings, repo.now_us(), options or {})
        return kinds.get(res.kind).behaviour.render(res, env)

    def _env(self, ctx: CallContext, tx: Any) -> WriteEnv:
        return WriteEnv(tx, ctx.principal, ctx.base_url, self.settings)

    @staticmethod
    def _require_parent(conn: Connection, parent: str) -> None:
        if parent not in (fqnmod.ROOT, fqnmod.RBAC) and not repo.exists(conn, parent):
            raise not_found(parent)

    # ---- create ----------------------------------------------------------

    def create(
        self,
        ctx: CallContext,
        kdef: KindDef,
        parent: str,
        name: str,
        body: ApiModel,
        *,
        options: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        fqnmod.validate_segment(kdef.collection, name, "name")
        fqn = fqnmod.child_fqn(parent, kdef.collection, name)
        behaviour = kdef.behaviour
        write = Write(
            fqn, parent, name, kdef.body_field, spec_from(kdef, body), body, True, options or {}
        )
        behaviour.validate(write)
        behaviour.check_writable(fqn, "create")
        try:
            with self.uow.write(ctx.principal.fqn) as tx:
                env = self._env(ctx, tx)
                access.require(tx.conn, ctx.principal, parent, kdef.kind, rbac.CREATE)
                behaviour.authorize(env, write)
                self._require_parent(tx.conn, parent)
                behaviour.check_references(env, write)
                res = create_object(
                    env, kdef.kind, fqn, write.spec, protected=bool(write.spec.get(_PROTECTION))
                )
                if res is None:
                    raise already_exists(fqn)
                extra = behaviour.after_write(env, write, res)
                out = self.render(tx.conn, res, write.options)
                out.update(extra)
                tx.audit(
                    fqn,
                    kdef.kind,
                    "CREATE",
                    f"created {kdef.kind} {fqn}",
                    **behaviour.audit_properties(write),
                )
        except sa.exc.IntegrityError:
            raise already_exists(fqn) from None
        log.info("created", extra={"fqn": fqn, "kind": kdef.kind, "actor": ctx.principal.fqn})
        return out

    # ---- read ------------------------------------------------------------

    def get(
        self, ctx: CallContext, fqn: str, options: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        options = options or {}
        kind = fqnmod.parse(fqn).kind
        behaviour = kinds.get(kind).behaviour
        if behaviour.read_writes(options):
            return self._get_writing(ctx, fqn, kind, options)
        with self.uow.read() as conn:
            access.require(conn, ctx.principal, fqn, kind, rbac.READ)
            res = repo.get(conn, fqn)
            if res is None:
                raise not_found(fqn)
            return self.render(conn, res, options)

    def _get_writing(
        self, ctx: CallContext, fqn: str, kind: str, options: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A GET whose options make it write (a cluster's install template mints a key)."""
        with self.uow.write(ctx.principal.fqn) as tx:
            access.require(tx.conn, ctx.principal, fqn, kind, rbac.READ)
            res = repo.get(tx.conn, fqn)
            if res is None:
                raise not_found(fqn)
            extra = kinds.get(kind).behaviour.on_read_write(self._env(ctx, tx), res, options)
            out = self.render(tx.conn, res, options)
            out.update(extra)
            return out

    def list_objects(
        self,
        ctx: CallContext,
        kdef: KindDef,
        parent: str,
        *,
        page_size: int,
        page_token: str,
        label_selector: str,
        options: Mapping[str, Any] | None = None,
        name_contains: str = "",
    ) -> ListResult:
        after = listing.decode_token(page_token)
        if after and not after.startswith(parent + "/" if parent else ""):
            raise invalid("pageToken", "belongs to another collection")
        selector = listing.parse_selector(label_selector)
        items: list[dict[str, Any]] = []
        scanned = 0
        with self.uow.read() as conn:
            self._require_parent(conn, parent)
            chunk = max(page_size, 100)
            while True:
                batch = repo.list_children(
                    conn, parent, kdef.kind, after, chunk, name_contains=name_contains
                )
                allowed = access.readable(
                    conn, ctx.principal, parent, [r.fqn for r in batch], kdef.kind
                )
                for i, res in enumerate(batch):
                    after = res.fqn
                    scanned += 1
                    if res.fqn in allowed and listing.matches(res.spec.get("labels"), selector):
                        items.append(self.render(conn, res, options))
                        if len(items) == page_size:
                            more = i + 1 < len(batch) or len(batch) == chunk
                            return ListResult(items, listing.encode_token(after) if more else "")
                if len(batch) < chunk:
                    return ListResult(items, "")
                if scanned >= MAX_SCAN:  # bound the work of a sparse filtered page
                    return ListResult(items, listing.encode_token(after))

    # ---- update ----------------------------------------------------------

    def update(self, ctx: CallContext, fqn: str, body: ApiModel) -> dict[str, Any]:
        parsed = fqnmod.parse(fqn)
        kdef = kinds.get(parsed.kind)
        behaviour = kdef.behaviour
        etag: str = body.etag  # type: ignore[attr-defined]  # required by the update model
        behaviour.check_writable(fqn, "update")
        write = Write(
            fqn, parsed.parent, parsed.name, kdef.body_field, spec_from(kdef, body), body, False
        )
        # What the body cannot say (write-only secrets, synced fields) comes from
        # the stored object; if it changes before the write, the etag check fails.
        with self.uow.read() as conn:
            before = repo.get(conn, fqn)
        if before is not None:
            behaviour.merge_update(before, write)
            if kdef.protectable and _PROTECTION not in write.spec and before.protected:
                write.spec[_PROTECTION] = True
        behaviour.validate(write)
        with self.uow.write(ctx.principal.fqn) as tx:
            env = self._env(ctx, tx)
            access.require(tx.conn, ctx.principal, fqn, kdef.kind, rbac.WRITE)
            behaviour.check_references(env, write)
            behaviour.authorize(env, write)
            res = repo.get(tx.conn, fqn)
            if res is None:
                raise not_found(fqn)
            new_etag = tx.etag(fqn)
            now = repo.now_us()
            protected = bool(write.spec.get(_PROTECTION))
            if not repo.update_if_etag(
                tx.conn,
                fqn,
                etag,
                spec=write.spec,
                protected=protected,
                etag=new_etag,
                update_time=now,
            ):
                raise ApiError(
                    Code.ABORTED,
                    f"{fqn} changed since etag {etag} was read; GET it again and retry",
                    metadata={"fqn": fqn, "etag": res.etag},
                )
            res.spec, res.etag, res.update_time, res.protected = (
                write.spec,
                new_etag,
                now,
                protected,
            )
            extra = behaviour.after_write(env, write, res)
            tx.audit(
                fqn,
                kdef.kind,
                "UPDATE",
                f"updated {kdef.kind} {fqn}",
                **behaviour.audit_properties(write),
            )
            out = self.render(tx.conn, res)
            out.update(extra)
        return out

    # ---- delete ----------------------------------------------------------

    def delete(self, ctx: CallContext, fqn: str, *, force: bool) -> None:
        kind = fqnmod.parse(fqn).kind
        behaviour = kinds.get(kind).behaviour
        behaviour.check_writable(fqn, "delete")
        with self.uow.write(ctx.principal.fqn) as tx:
            access.require(tx.conn, ctx.principal, fqn, kind, rbac.DELETE)
            if not repo.exists(tx.conn, fqn):
                raise not_found(fqn)
            if not force:
                protected = repo.first_protected(tx.conn, fqn)
                if protected is not None:
                    raise ApiError(
                        Code.FAILED_PRECONDITION,
                        f"{protected} has deletionProtectionEnabled; "
                        "clear it first or delete with force=true",
                        metadata={"protectedFqn": protected, "fqn": fqn},
                    )
            behaviour.before_delete(self._env(ctx, tx), fqn)
            count = repo.delete_subtree(tx.conn, fqn)
            tx.audit(
                fqn,
                kind,
                "DELETE",
                f"deleted {kind} {fqn} and {count - 1} children",
                deleted=count,
                force=force,
            )
        log.info("deleted", extra={"fqn": fqn, "count": count, "actor": ctx.principal.fqn})
