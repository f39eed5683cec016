"""Data operations over a connection; each runs inside the caller's transaction.

Functions, not a class per table: the service layer composes several of them
in one transaction (create object + its policy + audit record), which is what
keeps those writes atomic.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from mgmt_api import fqn as fqnmod
from mgmt_api.auth.keys import PublicJwk
from mgmt_api.domain import etags
from mgmt_api.domain.rbac import StoredBinding
from mgmt_api.fqn import subtree_bounds
from mgmt_api.store.tables import (
    audit_log,
    credentials,
    policies,
    resources,
    revision,
    sa_keys,
    server_kv,
)


def now_us() -> int:
    return time.time_ns() // 1000


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass(slots=True)
class Resource:
    fqn: str
    parent: str
    kind: str
    name: str
    spec: dict[str, Any]
    status: dict[str, Any]
    etag: str
    protected: bool
    creator: str
    create_time: int
    update_time: int


def new_resource(
    fqn: str,
    kind: str,
    spec: dict[str, Any],
    *,
    revision: int,
    creator: str,
    protected: bool = False,
    parent: str | None = None,
    name: str | None = None,
) -> Resource:
    """A resource about to be inserted: no status yet, the etag of ``revision``,
    created and updated now. ``parent`` and ``name`` come from the FQN unless
    given (an FQN outside the path grammar, such as an approval policy's)."""
    if parent is None or name is None:
        parsed = fqnmod.parse(fqn)
        parent = parsed.parent if parent is None else parent
        name = parsed.name if name is None else name
    now = now_us()
    return Resource(
        fqn=fqn,
        parent=parent,
        kind=kind,
        name=name,
        spec=spec,
        status={},
        etag=etags.compute(fqn, revision),
        protected=protected,
        creator=creator,
        create_time=now,
        update_time=now,
    )


def _row_to_resource(row: Any) -> Resource:
    return Resource(
        fqn=row.fqn,
        parent=row.parent,
        kind=row.kind,
        name=row.name,
        spec=json.loads(row.spec),
        status=json.loads(row.status or "{}"),
        etag=row.etag,
        protected=bool(row.protected),
        creator=row.creator,
        create_time=int(row.create_time),
        update_time=int(row.update_time),
    )


_BUMP = (
    sa.update(revision)
    .where(revision.c.id == 1)
    .values(value=revision.c.value + 1)
    .returning(revision.c.value)
)


def bump_revision(conn: Connection) -> int:
    """Advance the global write revision; call once at the start of a write."""
    row = conn.execute(_BUMP).one()
    return int(row[0])


_REVISION = sa.select(revision.c.value).where(revision.c.id == 1)


def current_revision(conn: Connection) -> int:
    return int(conn.execute(_REVISION).scalar_one())


# ---- resources ---------------------------------------------------------------


# Hot-path statements are built once with bind parameters: building a
# statement per call costs about three times as much as executing it.
_GET = sa.select(resources).where(resources.c.fqn == sa.bindparam("fqn"))
_EXISTS = sa.select(resources.c.fqn).where(resources.c.fqn == sa.bindparam("fqn"))
_GET_MANY = sa.select(resources).where(resources.c.fqn.in_(sa.bindparam("fqns", expanding=True)))
_CHILDREN = (
    sa.select(resources)
    .where(
        resources.c.parent == sa.bindparam("parent"),
        resources.c.kind == sa.bindparam("kind"),
        resources.c.fqn > sa.bindparam("after"),
    )
    .order_by(resources.c.fqn)
    .limit(sa.bindparam("limit"))
)


def get(conn: Connection, fqn: str) -> Resource | None:
    row = conn.execute(_GET, {"fqn": fqn}).first()
    return _row_to_resource(row) if row else None


def find_specs(
    conn: Connection,
    kind: str,
    *,
    parents: Sequence[str] | None = None,
    name: str | None = None,
    spec_contains: str | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """(FQN, spec) of the objects of ``kind`` (under ``parents``, if given) named
    ``name`` or whose lower-cased spec JSON contains ``spec_contains``.

    For lookups across the tree that no index serves (who may log in with this
    email): the spec match is a cheap pre-filter the caller confirms.
    """
    where: list[Any] = [resources.c.kind == kind]
    if parents is not None:
        where.append(resources.c.parent.in_(list(parents)))
    if name is not None:
        where.append(resources.c.name == name)
    if spec_contains is not None:
        where.append(sa.func.lower(resources.c.spec).contains(spec_contains, autoescape=True))
    rows = conn.execute(sa.select(resources.c.fqn, resources.c.spec).where(*where))
    return [(str(r.fqn), json.loads(r.spec)) for r in rows]


def mentioning(conn: Connection, kind: str, text: str) -> list[Resource]:
    """Objects of ``kind`` whose spec or status JSON contains ``text``: a pre-filter
    the caller confirms (which teams still list a deleted member)."""
    rows = conn.execute(
        sa.select(resources)
        .where(
            resources.c.kind == kind,
            sa.or_(
                resources.c.spec.contains(text, autoescape=True),
                resources.c.status.contains(text, autoescape=True),
            ),
        )
        .order_by(resources.c.fqn)
    )
    return [_row_to_resource(r) for r in rows]


def exists(conn: Connection, fqn: str) -> bool:
    return conn.execute(_EXISTS, {"fqn": fqn}).first() is not None


def get_many(conn: Connection, fqns: Sequence[str]) -> dict[str, Resource]:
    if not fqns:
        return {}
    rows = conn.execute(_GET_MANY, {"fqns": list(fqns)})
    return {r.fqn: _row_to_resource(r) for r in rows}


# The same, for a name search (the console's search box): a substring of the
# name, matched in SQL so a search over 5,000 clusters reads only the matches.
_CHILDREN_NAMED = _CHILDREN.where(resources.c.name.like(sa.bindparam("pattern")))


def list_children(
    conn: Connection, parent: str, kind: str, after: str, limit: int, *, name_contains: str = ""
) -> list[Resource]:
    """Up to ``limit`` children of ``kind`` under ``parent``, FQN-ordered after ``after``.

    ``name_contains`` keeps the names holding it; callers pass only DNS-1123
    characters (``[a-z0-9.-]``), so it carries no LIKE wildcard.
    """
    params: dict[str, object] = {"parent": parent, "kind": kind, "after": after, "limit": limit}
    if name_contains:
        rows = conn.execute(_CHILDREN_NAMED, {**params, "pattern": f"%{name_contains}%"})
    else:
        rows = conn.execute(_CHILDREN, params)
    return [_row_to_resource(r) for r in rows]


_PAGE = 500


def all_children(conn: Connection, parent: str, kind: str) -> list[Resource]:
    """Every child of ``kind`` under ``parent``, FQN-ordered (paged through the store).

    Paged so one call never builds an unbounded result set in the driver; the
    callers (cleanup, approvals query, profiles) need the whole collection.
    """
    out: list[Resource] = []
    after = ""
    while True:
        batch = list_children(conn, parent, kind, after, _PAGE)
        out += batch
        if len(batch) < _PAGE:
            return out
        after = batch[-1].fqn


_LOCK = _GET.with_for_update()  # built once: agents' reports take it on every call


def lock(conn: Connection, fqn: str) -> Resource | None:
    """Read the object with a row lock held to the end of the transaction.

    ``SELECT ... FOR UPDATE`` on PostgreSQL: a second writer of the same row
    waits, then reads the committed row. On SQLite (no row locks; SQLAlchemy
    drops the clause) write transactions are already serialised by
    ``BEGIN IMMEDIATE``.
    """
    row = conn.execute(_LOCK, {"fqn": fqn}).first()
    return _row_to_resource(row) if row else None


def first_child_unless_locked(conn: Connection, parent: str, kind: str) -> Resource | None:
    """The first child of ``kind``, locked; None if there is none *or* it is locked.

    ``FOR UPDATE SKIP LOCKED``: for a caller that must never wait on that row
    (waiting could deadlock with a writer that holds it and waits on a row the
    caller holds). The caller must be fine with skipping: the lock holder
    does the work itself.
    """
    stmt = (
        sa.select(resources)
        .where(resources.c.parent == parent, resources.c.kind == kind)
        .order_by(resources.c.fqn)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    row = conn.execute(stmt).first()
    return _row_to_resource(row) if row else None


@dataclass(frozen=True, slots=True)
class Node:
    """An object's place in the tree, without its JSON (cheap to read in bulk)."""

    fqn: str
    parent: str
    kind: str
    protected: bool


def subtree_nodes(conn: Connection, fqn: str) -> list[Node]:
    """Every object strictly below ``fqn``, FQN-ordered: one range scan of the primary key.

    Enough to answer "what does X hold" and "is anything under X protected"
    for many X at once, without reading specs or agent status.
    """
    lo, hi = subtree_bounds(fqn)
    rows = conn.execute(
        sa.select(resources.c.fqn, resources.c.parent, resources.c.kind, resources.c.protected)
        .where(resources.c.fqn > lo, resources.c.fqn < hi)
        .order_by(resources.c.fqn)
    )
    return [Node(str(r.fqn), str(r.parent), str(r.kind), bool(r.protected)) for r in rows]


def child_names(
    conn: Connection,
    parent: str,
    kind: str,
    *,
    after: str,
    limit: int,
    names: Sequence[str] | None = None,
    inclusive: bool = False,
) -> list[tuple[str, str]]:
    """(FQN, name) of up to ``limit`` children after ``after`` (or from it, ``inclusive``),
    FQN-ordered, optionally only those named in ``names``.

    Reads no JSON: a caller can decide which children it needs before paying
    for their spec or status.
    """
    position = resources.c.fqn >= after if inclusive else resources.c.fqn > after
    stmt = sa.select(resources.c.fqn, resources.c.name).where(
        resources.c.parent == parent, resources.c.kind == kind, position
    )
    if names is not None:
        stmt = stmt.where(resources.c.name.in_(list(names)))
    rows = conn.execute(stmt.order_by(resources.c.fqn).limit(limit))
    return [(str(r.fqn), str(r.name)) for r in rows]


def statuses_of(conn: Connection, fqns: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The status JSON (agent-reported data) of each existing object in ``fqns``."""
    if not fqns:
        return {}
    rows = conn.execute(
        sa.select(resources.c.fqn, resources.c.status).where(resources.c.fqn.in_(list(fqns)))
    )
    return {str(r.fqn): json.loads(r.status or "{}") for r in rows}


def insert(conn: Connection, res: Resource) -> bool:
    """Insert; False when the FQN is taken (checked first, then the PK decides)."""
    if exists(conn, res.fqn):
        return False
    conn.execute(
        sa.insert(resources).values(
            fqn=res.fqn,
            parent=res.parent,
            kind=res.kind,
            name=res.name,
            spec=dumps(res.spec),
            status=dumps(res.status),
            etag=res.etag,
            protected=res.protected,
            creator=res.creator,
            create_time=res.create_time,
            update_time=res.update_time,
        )
    )
    return True


_UPDATE_IF_ETAG = (
    sa.update(resources)
    .where(resources.c.fqn == sa.bindparam("b_fqn"), resources.c.etag == sa.bindparam("b_old_etag"))
    .values(
        spec=sa.bindparam("b_spec"),
        protected=sa.bindparam("b_protected"),
        etag=sa.bindparam("b_etag"),
        update_time=sa.bindparam("b_update_time"),
    )
)


def update_if_etag(
    conn: Connection,
    fqn: str,
    old_etag: str,
    *,
    spec: dict[str, Any],
    protected: bool,
    etag: str,
    update_time: int,
) -> bool:
    """Conditional update: applies only if the stored etag is still ``old_etag``.

    The single ``UPDATE ... WHERE etag = :old`` is what makes concurrent PUTs
    with the same etag have exactly one winner: on PostgreSQL the losers block
    on the row lock and then re-check the predicate against the committed row;
    on SQLite writers are serialised by ``BEGIN IMMEDIATE``.
    """
    result = conn.execute(
        _UPDATE_IF_ETAG,
        {
            "b_fqn": fqn,
            "b_old_etag": old_etag,
            "b_spec": dumps(spec),
            "b_protected": protected,
            "b_etag": etag,
            "b_update_time": update_time,
        },
    )
    return result.rowcount == 1


def set_status(conn: Connection, fqn: str, status: dict[str, Any], etag: str) -> None:
    conn.execute(
        sa.update(resources).where(resources.c.fqn == fqn).values(status=dumps(status), etag=etag)
    )


def touch(conn: Connection, fqn: str, etag: str, update_time: int) -> None:
    conn.execute(
        sa.update(resources)
        .where(resources.c.fqn == fqn)
        .values(etag=etag, update_time=update_time)
    )


def _in_subtree(column: Any, fqn: str) -> Any:
    lo, hi = subtree_bounds(fqn)
    return sa.or_(column == fqn, sa.and_(column > lo, column < hi))


def first_protected(conn: Connection, fqn: str) -> str | None:
    """The first protected object in the subtree rooted at ``fqn`` (itself included)."""
    row = conn.execute(
        sa.select(resources.c.fqn)
        .where(_in_subtree(resources.c.fqn, fqn), resources.c.protected == sa.true())
        .order_by(resources.c.fqn)
        .limit(1)
    ).first()
    return str(row[0]) if row else None


def delete_subtree(conn: Connection, fqn: str) -> int:
    """Delete the object, everything below it and their side rows; returns objects deleted."""
    conn.execute(sa.delete(policies).where(_in_subtree(policies.c.fqn, fqn)))
    conn.execute(sa.delete(sa_keys).where(_in_subtree(sa_keys.c.owner, fqn)))
    conn.execute(sa.delete(credentials).where(_in_subtree(credentials.c.fqn, fqn)))
    result = conn.execute(sa.delete(resources).where(_in_subtree(resources.c.fqn, fqn)))
    return int(result.rowcount)


# ---- policies ----------------------------------------------------------------


@dataclass(slots=True)
class Policy:
    fqn: str
    allow: list[StoredBinding]
    description: str
    etag: str


_POLICIES = sa.select(policies).where(policies.c.fqn.in_(sa.bindparam("fqns", expanding=True)))
_KEY = sa.select(sa_keys.c.owner, sa_keys.c.public_jwk).where(sa_keys.c.id == sa.bindparam("id"))
_PASSWORD = sa.select(credentials.c.password_hash).where(credentials.c.fqn == sa.bindparam("fqn"))


def get_policies(conn: Connection, fqns: Iterable[str]) -> dict[str, Policy]:
    rows = conn.execute(_POLICIES, {"fqns": list(fqns)})
    return {r.fqn: Policy(r.fqn, json.loads(r.allow), r.description, r.etag) for r in rows}


def policies_mentioning(conn: Connection, text: str) -> list[Policy]:
    """Policies whose bindings' JSON contains ``text``: a pre-filter the caller confirms
    (who still names a deleted principal)."""
    rows = conn.execute(
        sa.select(policies)
        .where(policies.c.allow.contains(text, autoescape=True))
        .order_by(policies.c.fqn)
    )
    return [Policy(r.fqn, json.loads(r.allow), r.description, r.etag) for r in rows]


def policies_in_subtree(conn: Connection, fqn: str) -> list[Policy]:
    """The policies of ``fqn`` and of every object below it: one range scan."""
    rows = conn.execute(
        sa.select(policies).where(_in_subtree(policies.c.fqn, fqn)).order_by(policies.c.fqn)
    )
    return [Policy(r.fqn, json.loads(r.allow), r.description, r.etag) for r in rows]


def insert_policy(conn: Connection, fqn: str, allow: list[StoredBinding], etag: str) -> None:
    conn.execute(
        sa.insert(policies).values(
            fqn=fqn, allow=dumps(allow), description="", etag=etag, update_time=now_us()
        )
    )


def update_policy_if_etag(
    conn: Connection,
    fqn: str,
    *,
    old_etag: str,
    allow: Sequence[Mapping[str, object]],
    description: str,
    etag: str,
) -> bool:
    """Replace the bindings of ``fqn``'s policy if its etag is still ``old_etag``.

    ``allow`` should be :class:`StoredBinding` rows; it is typed as mappings only
    because kinds/cluster.py still appends its agent binding as a plain literal.
    """
    result = conn.execute(
        sa.update(policies)
        .where(policies.c.fqn == fqn, policies.c.etag == old_etag)
        .values(allow=dumps(allow), description=description, etag=etag, update_time=now_us())
    )
    return result.rowcount == 1


def policies_naming(conn: Connection, subject: str) -> list[str]:
    """FQNs of the objects whose policy has a binding naming ``subject`` (a user,
    team or service-account FQN), root and RBAC nodes included.

    A scan of the policies table (the JSON match is a cheap pre-filter the
    bindings confirm): for the rare writes that create a principal or team.
    """
    needle = json.dumps(subject)
    rows = conn.execute(
        sa.select(policies.c.fqn, policies.c.allow).where(
            policies.c.allow.contains(needle, autoescape=True)
        )
    )
    return sorted(
        str(r.fqn)
        for r in rows
        if any(
            subject in (s.get(k) for k in ("user", "team", "serviceAccount"))
            for b in json.loads(r.allow)
            for s in b.get("subjects") or []
            if isinstance(s, dict)
        )
    )


# ---- service-account keys ----------------------------------------------------


def add_key(conn: Connection, key_id: str, owner: str, public_jwk: PublicJwk) -> None:
    conn.execute(
        sa.insert(sa_keys).values(
            id=key_id, owner=owner, public_jwk=dumps(public_jwk), create_time=now_us()
        )
    )


def get_key(conn: Connection, key_id: str) -> tuple[str, PublicJwk] | None:
    row = conn.execute(_KEY, {"id": key_id}).first()
    return (str(row.owner), json.loads(row.public_jwk)) if row else None


def keys_of(conn: Connection, owner: str) -> list[tuple[str, PublicJwk, int]]:
    rows = conn.execute(
        sa.select(sa_keys)
        .where(sa_keys.c.owner == owner)
        .order_by(sa_keys.c.create_time, sa_keys.c.id)
    )
    return [(str(r.id), json.loads(r.public_jwk), int(r.create_time)) for r in rows]


def delete_key(conn: Connection, owner: str, key_id: str) -> bool:
    result = conn.execute(
        sa.delete(sa_keys).where(sa_keys.c.owner == owner, sa_keys.c.id == key_id)
    )
    return result.rowcount == 1


# ---- credentials -------------------------------------------------------------


def get_password_hash(conn: Connection, fqn: str) -> str | None:
    row = conn.execute(_PASSWORD, {"fqn": fqn}).first()
    return str(row[0]) if row else None


def set_password_hash(conn: Connection, fqn: str, password_hash: str) -> None:
    if (
        conn.execute(
            sa.update(credentials)
            .where(credentials.c.fqn == fqn)
            .values(password_hash=password_hash)
        ).rowcount
        == 0
    ):
        conn.execute(sa.insert(credentials).values(fqn=fqn, password_hash=password_hash))


# ---- audit -------------------------------------------------------------------


@dataclass(slots=True)
class AuditRecord:
    id: int
    fqn: str
    kind: str
    operation: str
    actor: str
    time: int
    message: str
    properties: dict[str, Any]


def audit(
    conn: Connection,
    *,
    organization: str,
    fqn: str,
    kind: str,
    operation: str,
    actor: str,
    message: str,
    properties: dict[str, Any] | None = None,
) -> None:
    conn.execute(
        sa.insert(audit_log).values(
            organization=organization,
            fqn=fqn,
            kind=kind,
            operation=operation,
            actor=actor,
            time=now_us(),
            message=message,
            properties=dumps(properties or {}),
        )
    )


def list_audit(
    conn: Connection,
    organization: str,
    before_id: int | None,
    limit: int,
    filters: dict[str, str] | None = None,
) -> list[AuditRecord]:
    """Newest first; ``before_id`` continues a previous page.

    ``filters``: ``kind`` and ``operation`` (exact), ``triggeredBy`` (exact
    actor FQN) and ``fqnPrefix`` (the object or anything below it).
    """
    stmt = sa.select(audit_log).where(audit_log.c.organization == organization)
    if before_id is not None:
        stmt = stmt.where(audit_log.c.id < before_id)
    for name, value in (filters or {}).items():
        if name == "fqnPrefix":
            stmt = stmt.where(
                sa.or_(
                    audit_log.c.fqn == value,
                    audit_log.c.fqn.startswith(value + "/", autoescape=True),
                )
            )
        else:
            column = {"kind": audit_log.c.kind, "operation": audit_log.c.operation}.get(
                name, audit_log.c.actor
            )
            stmt = stmt.where(column == value)
    stmt = stmt.order_by(audit_log.c.id.desc()).limit(limit)
    return [
        AuditRecord(
            int(r.id),
            r.fqn,
            r.kind,
            r.operation,
            r.actor,
            int(r.time),
            r.message,
            json.loads(r.properties),
        )
        for r in conn.execute(stmt)
    ]


# ---- server key/value --------------------------------------------------------


def kv_get(conn: Connection, key: str) -> str | None:
    row = conn.execute(sa.select(server_kv.c.value).where(server_kv.c.key == key)).first()
    return str(row[0]) if row else None


def kv_put(conn: Connection, key: str, value: str) -> None:
    if (
        conn.execute(
            sa.update(server_kv).where(server_kv.c.key == key).values(value=value)
        ).rowcount
        == 0
    ):
        conn.execute(sa.insert(server_kv).values(key=key, value=value))


def kv_insert_new(conn: Connection, key: str, value: str) -> None:
    """Insert ``key``; raises IntegrityError if it exists (a racing replica won)."""
    conn.execute(sa.insert(server_kv).values(key=key, value=value))


def kv_scan(
    conn: Connection, prefix: str, suffix: str = "", limit: int = 10_000
) -> list[tuple[str, str]]:
    """(key, value) of at most ``limit`` keys starting with ``prefix`` and ending with
    ``suffix`` (both taken literally), by key."""
    stmt = sa.select(server_kv.c.key, server_kv.c.value).where(
        server_kv.c.key.startswith(prefix, autoescape=True)
    )
    if suffix:
        stmt = stmt.where(server_kv.c.key.endswith(suffix, autoescape=True))
    return [(str(k), str(v)) for k, v in conn.execute(stmt.order_by(server_kv.c.key).limit(limit))]


def kv_delete(conn: Connection, keys: list[str]) -> int:
    if not keys:
        return 0
    return int(conn.execute(sa.delete(server_kv).where(server_kv.c.key.in_(keys))).rowcount)


def kv_delete_prefix(conn: Connection, prefix: str) -> int:
    """Delete every key starting with ``prefix`` (taken literally)."""
    stmt = sa.delete(server_kv).where(server_kv.c.key.startswith(prefix, autoescape=True))
    return int(conn.execute(stmt).rowcount)
