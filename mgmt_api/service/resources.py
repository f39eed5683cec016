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

import pydantic
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from mgmt_api import access, kinds
from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext, Principal
from mgmt_api.compiler import key_material
from mgmt_api.domain import listing, rbac
from mgmt_api.errors import ApiError, Code, already_exists, invalid, not_found
from mgmt_api.kinds import principals
from mgmt_api.kinds.base import (
    KindDef,
    KindSettings,
    QueryOptions,
    RenderEnv,
    Write,
    WriteEnv,
    create_object,
    require_grants,
)
from mgmt_api.schemas.base import ApiModel
from mgmt_api.store import repo
from mgmt_api.store.uow import UnitOfWork

log = logging.getLogger(__name__)

MAX_SCAN = 10_000
_PROTECTION = "deletionProtectionEnabled"


@dataclass(frozen=True, slots=True)
class ListResult:
    """A page of objects of one kind: each an instance of the kind's model."""

    items: list[ApiModel]
    next_page_token: str


def spec_from(kdef: KindDef, body: ApiModel) -> dict[str, Any]:
    """The storable part of a request body: set fields, minus the output-only ones."""
    data = body.model_dump(by_alias=True, exclude_none=True, mode="json")
    return {k: v for k, v in data.items() if k not in kdef.output_only}


def _not_its_schema(res: repo.Resource, exc: pydantic.ValidationError) -> ApiError:
    """A stored object its model refuses (written around the API, or before a
    model grew stricter without a migration): a 500 that names the object and
    the fields, logged without the values (pydantic's own message quotes them)."""
    fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})
    log.error(
        "stored object does not match its kind's schema",
        extra={"fqn": res.fqn, "kind": res.kind, "fields": fields},
    )
    return ApiError(
        Code.INTERNAL,
        f"stored {res.kind} {res.fqn} does not match its schema (fields: {', '.join(fields)})",
        metadata={"fqn": res.fqn},
    )


def _restore_secrets(kdef: KindDef, stored: repo.Resource, write: Write) -> None:
    """The markers a GET returned, put back as the stored secrets they fingerprint."""
    try:
        restored = key_material.restore(write.spec, stored.spec, kdef.behaviour.secrets)
    except key_material.UnknownMarker as exc:
        raise invalid(
            f"{write.prefix}.{exc.field}",
            "is a redacted value that matches none of this object's stored secrets; "
            "send the secret itself",
        ) from None
    write.spec.clear()
    write.spec.update(restored)


def _refuse_markers(kdef: KindDef, write: Write) -> None:
    """A marker left in a body (a create, or one copied from another object):
    storing it would make the marker the secret."""
    field = key_material.first_marker(write.spec, kdef.behaviour.secrets)
    if field is not None:
        raise invalid(
            f"{write.prefix}.{field}",
            "is a redacted value; send the secret itself (a marker is only accepted "
            "on an update of the object it was read from)",
        )


class ResourceService:
    """Create, read, list, update and delete objects of any kind."""

    def __init__(self, uow: UnitOfWork, settings: KindSettings) -> None:
        self.uow = uow
        self.settings = settings

    # ---- rendering -------------------------------------------------------

    def render(
        self,
        conn: Connection,
        res: repo.Resource,
        options: QueryOptions | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> ApiModel:
        """The object as its kind's model, with the fields only this response carries.

        The one place a rendered object becomes the model (the kinds' render
        hooks build plain dicts), so every response the service gives is an
        instance of the model the OpenAPI documents, checked by it: a field the
        model lacks or a value it refuses fails here, not in a client.
        """
        kdef = kinds.get(res.kind)
        env = RenderEnv(conn, self.settings, repo.now_us(), options or {})
        # Key material reads back as markers; ``extra`` (a new key, shown once) never does.
        rendered = key_material.redact(kdef.behaviour.render(res, env), kdef.behaviour.secrets)
        rendered.update(extra or {})
        try:
            return kdef.model.model_validate(rendered)
        except pydantic.ValidationError as exc:
            raise _not_its_schema(res, exc) from None

    def _env(self, ctx: CallContext, tx: Any) -> WriteEnv:
        return WriteEnv(tx, ctx.principal, ctx.base_url, self.settings)

    # ---- create ----------------------------------------------------------

    def create(
        self,
        ctx: CallContext,
        kdef: KindDef,
        parent: str,
        name: str,
        body: ApiModel,
        *,
        options: QueryOptions | None = None,
    ) -> ApiModel:
        fqnmod.validate_segment(kdef.collection, name, "name")
        fqn = fqnmod.child_fqn(parent, kdef.collection, name)
        behaviour = kdef.behaviour
        write = Write(
            fqn, parent, name, kdef.body_field, spec_from(kdef, body), body, True, options or {}
        )
        _refuse_markers(kdef, write)
        behaviour.validate(write)
        behaviour.check_writable(fqn, "create")
        try:
            with self.uow.write(ctx.principal.fqn) as tx:
                env = self._env(ctx, tx)
                access.require(tx.conn, ctx.principal, parent, kdef.kind, rbac.CREATE)
                require_grants(env, behaviour.grants, write, None)
                behaviour.authorize(env, write)
                res, extra = store_create(env, kdef, write)
                out = self.render(tx.conn, res, write.options, extra)
        except sa.exc.IntegrityError:
            raise already_exists(fqn) from None
        log.info("created", extra={"fqn": fqn, "kind": kdef.kind, "actor": ctx.principal.fqn})
        return out

    # ---- read ------------------------------------------------------------

    def get(self, ctx: CallContext, fqn: str, options: QueryOptions | None = None) -> ApiModel:
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
        self, ctx: CallContext, fqn: str, kind: str, options: QueryOptions
    ) -> ApiModel:
        """A GET whose options make it write (a cluster's install template mints a key)."""
        with self.uow.write(ctx.principal.fqn) as tx:
            access.require(tx.conn, ctx.principal, fqn, kind, rbac.READ)
            res = repo.get(tx.conn, fqn)
            if res is None:
                raise not_found(fqn)
            extra = kinds.get(kind).behaviour.on_read_write(self._env(ctx, tx), res, options)
            return self.render(tx.conn, res, options, extra)

    def list_objects(
        self,
        ctx: CallContext,
        kdef: KindDef,
        parent: str,
        *,
        page_size: int,
        page_token: str,
        label_selector: str,
        options: QueryOptions | None = None,
        name_contains: str = "",
    ) -> ListResult:
        after = listing.decode_token(page_token)
        if after and not after.startswith(parent + "/" if parent else ""):
            raise invalid("pageToken", "belongs to another collection")
        selector = listing.parse_selector(label_selector)
        items: list[ApiModel] = []
        scanned = 0
        with self.uow.read() as conn:
            _require_parent(conn, parent)
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

    def update(self, ctx: CallContext, fqn: str, body: ApiModel) -> ApiModel:
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
            _restore_secrets(kdef, before, write)
            behaviour.merge_update(before, write)
            if kdef.protectable and _PROTECTION not in write.spec and before.protected:
                write.spec[_PROTECTION] = True
        _refuse_markers(kdef, write)
        behaviour.validate(write)
        with self.uow.write(ctx.principal.fqn) as tx:
            env = self._env(ctx, tx)
            access.require(tx.conn, ctx.principal, fqn, kdef.kind, rbac.WRITE)
            current = repo.get(tx.conn, fqn)
            if current is None:
                raise not_found(fqn)
            require_grants(env, behaviour.grants, write, current.spec)
            behaviour.check_references(env, write)
            behaviour.authorize(env, write)
            res, extra = store_update(env, kdef, write, etag)
            out = self.render(tx.conn, res, extra=extra)
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
            count = store_delete(self._env(ctx, tx), fqn, kind, force=force)
        log.info("deleted", extra={"fqn": fqn, "count": count, "actor": ctx.principal.fqn})


# ---- the stored part of each write, shared with the platform's own writes -------------------


def store_create(
    env: WriteEnv, kdef: KindDef, write: Write, *, creator_is_admin: bool = True, why: str = ""
) -> tuple[repo.Resource, dict[str, Any]]:
    """Create after the permission checks: parent, references, insert, ``after_write``, audit.

    Returns the stored object and the fields only the response carries.
    """
    behaviour = kdef.behaviour
    _require_parent(env.tx.conn, write.parent)
    behaviour.check_references(env, write)
    res = create_object(
        env,
        kdef.kind,
        write.fqn,
        write.spec,
        protected=bool(write.spec.get(_PROTECTION)),
        creator_is_admin=creator_is_admin,
    )
    if res is None:
        raise already_exists(write.fqn)
    extra = behaviour.after_write(env, write, res)
    env.tx.audit(
        write.fqn,
        kdef.kind,
        "CREATE",
        f"created {kdef.kind} {write.fqn}{why}",
        **behaviour.audit_properties(write),
    )
    return res, extra


def store_update(
    env: WriteEnv, kdef: KindDef, write: Write, etag: str, *, why: str = ""
) -> tuple[repo.Resource, dict[str, Any]]:
    """Update after the checks: compare-and-set on ``etag``, ``after_write``, audit."""
    fqn = write.fqn
    res = repo.get(env.tx.conn, fqn)
    if res is None:
        raise not_found(fqn)
    new_etag = env.tx.etag(fqn)
    now = repo.now_us()
    protected = bool(write.spec.get(_PROTECTION))
    if not repo.update_if_etag(
        env.tx.conn,
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
    res.spec, res.etag, res.update_time, res.protected = write.spec, new_etag, now, protected
    extra = kdef.behaviour.after_write(env, write, res)
    env.tx.audit(
        fqn,
        kdef.kind,
        "UPDATE",
        f"updated {kdef.kind} {fqn}{why}",
        **kdef.behaviour.audit_properties(write),
    )
    return res, extra


def store_delete(env: WriteEnv, fqn: str, kind: str, *, force: bool, why: str = "") -> int:
    """Delete after the checks: ``before_delete``, the principals it takes along
    forgotten everywhere (:mod:`mgmt_api.kinds.principals`), the recursive delete, audit.
    Returns how many objects went."""
    kinds.get(kind).behaviour.before_delete(env, fqn)
    forgotten = principals.forget(env.tx, fqn, kind)
    count = repo.delete_subtree(env.tx.conn, fqn)
    env.tx.audit(
        fqn,
        kind,
        "DELETE",
        f"deleted {kind} {fqn} and {count - 1} children{why}",
        deleted=count,
        force=force,
        **forgotten,
    )
    return count


def _require_parent(conn: Connection, parent: str) -> None:
    if parent not in (fqnmod.ROOT, fqnmod.RBAC) and not repo.exists(conn, parent):
        raise not_found(parent)


# ---- the platform's own writes (the directory sync) ----------------------------------------


def system_principal(actor: str) -> Principal:
    """Who the platform writes as: ``actor`` (``system:directory-sync``), subject of nothing."""
    return Principal(actor, "user", frozenset())


def _system_write(
    kdef: KindDef, fqn: str, fields: ApiModel, *, creating: bool, base: Mapping[str, object]
) -> Write:
    """A write the platform makes, checked as a client's body would be.

    ``fields`` is the kind's model (built, so its types and bounds are checked)
    holding the fields the platform sets, which may be the ones it owns
    (``sourceType``); they replace those of ``base``. Then the same hooks run.
    """
    if not isinstance(fields, kdef.model):
        raise TypeError(f"a {kdef.kind} write needs a {kdef.model.__name__}")
    parsed = fqnmod.parse(fqn)
    fqnmod.validate_segment(kdef.collection, parsed.name, "name")
    set_fields = fields.model_dump(
        by_alias=True, exclude_unset=True, exclude_none=True, mode="json"
    )
    spec = {**base, **set_fields}
    kdef.model.model_validate(spec)  # the whole spec, the stored fields included
    # The platform sends no write-only field (a password): ``fields`` holds none.
    return Write(fqn, parsed.parent, parsed.name, kdef.body_field, spec, fields, creating)


def system_create(
    env: WriteEnv, kind: str, fqn: str, fields: ApiModel, *, why: str
) -> repo.Resource:
    """Create as the platform: every hook but ``authorize`` (there is no caller to
    authorize); the object gets an empty policy, so it inherits its parent's."""
    kdef = kinds.get(kind)
    write = _system_write(kdef, fqn, fields, creating=True, base={})
    kdef.behaviour.validate(write)
    kdef.behaviour.check_writable(fqn, "create")
    if repo.exists(env.tx.conn, fqn):  # e.g. a local user of the same name: never taken over
        raise already_exists(fqn)
    res, _ = store_create(env, kdef, write, creator_is_admin=False, why=why)
    return res


def system_update(
    env: WriteEnv, stored: repo.Resource, fields: ApiModel, *, why: str
) -> repo.Resource:
    """Set the fields given in ``fields`` of ``stored`` as the platform (the others keep
    their stored values), through the hooks (as :func:`system_create`)."""
    kdef = kinds.get(stored.kind)
    write = _system_write(kdef, stored.fqn, fields, creating=False, base=stored.spec)
    kdef.behaviour.check_writable(stored.fqn, "update")
    kdef.behaviour.merge_update(stored, write)
    if kdef.protectable and _PROTECTION not in write.spec and stored.protected:
        write.spec[_PROTECTION] = True
    kdef.behaviour.validate(write)
    kdef.behaviour.check_references(env, write)
    res, _ = store_update(env, kdef, write, stored.etag, why=why)
    return res


def system_delete(env: WriteEnv, fqn: str, *, why: str) -> int:
    """Delete as the platform, with the same rule as a client's delete (:func:`store_delete`)."""
    kind = fqnmod.parse(fqn).kind
    kinds.get(kind).behaviour.check_writable(fqn, "delete")
    return store_delete(env, fqn, kind, force=False, why=why)
