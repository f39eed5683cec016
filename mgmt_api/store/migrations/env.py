"""Alembic environment: always driven programmatically by ``store.engine.migrate``.

The caller hands over an open connection in ``config.attributes``; there is no
alembic.ini and no URL here, so the same code runs from any working directory.
"""

from __future__ import annotations

from alembic import context

from mgmt_api.store.tables import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
