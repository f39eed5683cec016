"""The one write path: transaction, revision bump, audit and after-commit notification.

Every writer of the management plane (resources, access policies, approvals,
cleanup, inventory reports, identity and directory sync, the first-start
bootstrap) goes through :meth:`UnitOfWork.write`. Written once, the order of
those steps cannot differ between writers:

1. ``BEGIN`` (``IMMEDIATE`` on SQLite: writers queue instead of deadlocking);
2. bump the global revision (it serialises writers on PostgreSQL too, and
   yields the etag of everything this transaction writes);
3. the caller's writes, and its audit records through :meth:`Tx.audit`;
4. on PostgreSQL, ``NOTIFY meshplane_revision`` inside the transaction, so
   other replicas hear about the commit exactly when it becomes visible
   (:mod:`mgmt_api.store.notify`);
5. ``COMMIT``, then tell this process's listeners the new revision (the
   policy streams): never before the commit, never for a rolled-back write.

Writes that must not move the revision (agent inventory reports, one-time
login state) pass ``bump=False``: they still get one transaction and the
audit, but wake nobody, because nothing compiled from the store reads them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from opentelemetry.trace import Span, SpanKind, Tracer
from sqlalchemy.engine import Connection, Engine

from meshplane.tracing import child_span
from mgmt_api import fqn as fqnmod
from mgmt_api.domain import etags
from mgmt_api.store import repo
from mgmt_api.store.engine import read_tx, write_tx
from mgmt_api.store.notify import REVISION_CHANNEL

log = logging.getLogger(__name__)

#: The actor of writes no principal asked for (bootstrap, directory sync).
SYSTEM = "SYSTEM"

_NOTIFY = sa.text("SELECT pg_notify(:channel, :payload)")


class CommitListeners:
    """Who in this process hears about committed revisions (thread-safe).

    Called from whichever thread committed; a listener must hand the revision
    over to its own loop (``call_soon_threadsafe``) and return quickly.
    """

    def __init__(self) -> None:
        self._listeners: list[Callable[[int], None]] = []
        self._lock = threading.Lock()

    def subscribe(self, listener: Callable[[int], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[int], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def committed(self, revision: int) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(revision)
            except Exception:  # one broken listener must not fail the write's caller
                log.exception("commit listener failed", extra={"revision": revision})


@dataclass
class Tx:
    """One write transaction: its connection, its revision and who is writing."""

    conn: Connection
    revision: int
    actor: str
    audited: int = field(default=0)

    def etag(self, fqn: str, salt: str = "") -> str:
        """A new etag for ``fqn`` (``salt`` tells an object's side rows apart)."""
        return etags.compute(fqn + salt, self.revision)

    def audit(self, fqn: str, kind: str, operation: str, message: str, **properties: Any) -> None:
        """One audit record of this transaction, filed under ``fqn``'s organization."""
        repo.audit(
            self.conn,
            organization=fqnmod.org_name(fqn),
            fqn=fqn,
            kind=kind,
            operation=operation,
            actor=self.actor,
            message=message,
            properties=properties,
        )
        self.audited += 1


class UnitOfWork:
    """Opens read and write transactions on the store; see the module docstring."""

    def __init__(self, engine: Engine, listeners: CommitListeners | None = None) -> None:
        self.engine = engine
        self.listeners = listeners or CommitListeners()
        self._notify = engine.dialect.name == "postgresql"
        #: Set by the wiring when tracing is on: each transaction under a
        #: sampled request is one CLIENT span (never one per statement; no SQL
        #: text or values, so nothing a row holds reaches a trace).
        self.tracer: Tracer | None = None

    def _span(self, name: str) -> AbstractContextManager[Span | None]:
        attributes = {"db.system": self.engine.dialect.name}
        return child_span(self.tracer, name, attributes, kind=SpanKind.CLIENT)

    @contextmanager
    def write(self, actor: str, *, bump: bool = True) -> Iterator[Tx]:
        """A write transaction; see the module docstring for what it guarantees.

        Its span ends at the commit: the commit listeners (the publish to
        the streams) run after it, as its sibling under the request's span."""
        with self._span("mgmt-api db write") as span:
            with write_tx(self.engine) as conn:
                revision = repo.bump_revision(conn) if bump else repo.current_revision(conn)
                tx = Tx(conn, revision, actor)
                yield tx
                if bump and self._notify:
                    conn.execute(_NOTIFY, {"channel": REVISION_CHANNEL, "payload": str(revision)})
            if span is not None:
                span.set_attributes(
                    {"meshplane.revision": revision, "meshplane.audited": tx.audited}
                )
        if bump:
            self.listeners.committed(revision)

    @contextmanager
    def write_rows(self) -> Iterator[Connection]:
        """A write transaction for bookkeeping rows outside the object tree.

        Pending logins, one-time codes, used provider tokens, sync run logs:
        short-lived rows that nothing compiles from and nobody audits, so they
        neither move the revision nor wake anyone.
        """
        with self._span("mgmt-api db write"), write_tx(self.engine) as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only transaction (one snapshot of the store)."""
        with self._span("mgmt-api db read"), read_tx(self.engine) as conn:
            yield conn

    def current_revision(self) -> int:
        with read_tx(self.engine) as conn:
            return repo.current_revision(conn)
