"""The web console for platform admins, served by mgmt-api at ``/ui/`` (docs/console.md).

Server-rendered: Jinja2 templates and htmx (vendored, pinned) for
navigation without full reloads and for the live status panel; a few dozen
lines of our own script for the banners (lost connection, expired session).
Every page is built from the public ``/v2`` API called in-process with the
signed-in user's token (:mod:`mgmt_api.console.api`), so RBAC, validation,
etags and audit are the API's and the console cannot drift from them.

Layers: pure (``session``, ``forms``, ``policy_kinds``, ``status``,
``conflict``, ``navigation``, ``traffic``, ``diagnostics``) → HTTP adapters
(``web`` and the ``*_pages`` routers) → the wiring below, which the
application factory calls once.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import RedirectResponse

from mgmt_api.console import (
    admin_pages,
    auth_pages,
    diagnostics_pages,
    mesh_pages,
    policy_pages,
    tree_pages,
)
from mgmt_api.console.api import InProcessApi
from mgmt_api.console.web import Console


def mount(app: FastAPI, *, signing_secret: str, public_url: str | None) -> None:
    """Serve the console at ``/ui/`` on the app's own port.

    The routers' order matters: fixed cluster actions (``.../delete``,
    ``.../approvals``) before the generic policy paths that would also match.
    """
    app.state.console = Console(InProcessApi(app), signing_secret, public_url)
    app.include_router(auth_pages.router)
    app.include_router(tree_pages.router)
    app.include_router(admin_pages.router)
    app.include_router(diagnostics_pages.router)
    app.include_router(mesh_pages.router)
    app.include_router(policy_pages.router)

    @app.get("/ui", include_in_schema=False)
    def _ui_root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=308)
