"""First start: server signing secret, root and RBAC policies, the ``admin`` user.

Runs in one transaction guarded by a marker, so it happens once per store even
if several replicas start together (the loser of the race finds the marker).
"""

from __future__ import annotations

import logging
import secrets
import sys

from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.auth import passwords, tokens
from mgmt_api.domain import rbac
from mgmt_api.store import repo
from mgmt_api.store.uow import SYSTEM, UnitOfWork

log = logging.getLogger(__name__)

ADMIN_FQN = "users/admin"
_MARKER = "bootstrapped"
_SECRET = "session_signing_secret"  # noqa: S105 - the key name, not a secret


def bootstrap(uow: UnitOfWork, admin_password: str | None) -> str:
    """Initialise an empty store; returns the session signing secret."""
    with uow.write(SYSTEM) as tx:
        conn, revision = tx.conn, tx.revision
        if repo.kv_get(conn, _MARKER) is None:
            generated = admin_password is None
            password = admin_password or secrets.token_urlsafe(18)
            repo.insert(
                conn,
                repo.new_resource(
                    ADMIN_FQN,
                    Kind.USER,
                    {"loginName": "admin", "displayName": "Administrator", "sourceType": "MANUAL"},
                    revision=revision,
                    creator=SYSTEM,
                ),
            )
            repo.set_password_hash(conn, ADMIN_FQN, passwords.hash_password(password))
            admin = [rbac.admin_binding("user", ADMIN_FQN)]
            repo.insert_policy(conn, fqnmod.ROOT, admin, tx.etag("#root"))
            repo.insert_policy(conn, fqnmod.RBAC, admin, tx.etag("#rbac"))
            repo.insert_policy(conn, ADMIN_FQN, admin, tx.etag(ADMIN_FQN, "#policy"))
            for role, description in rbac.BUILTIN_DESCRIPTIONS.items():
                name = role.split("/", 1)[1]
                rules = [{"permissions": sorted(r.permissions)} for r in rbac.BUILTIN_ROLES[role]]
                spec = {"displayName": name, "description": description, "rules": rules}
                repo.insert(
                    conn,
                    repo.new_resource(
                        role, Kind.ROLE, spec, revision=revision, creator=SYSTEM, protected=True
                    ),
                )
            repo.kv_put(conn, _SECRET, tokens.new_signing_secret())
            repo.kv_put(conn, _MARKER, "1")
            tx.audit(ADMIN_FQN, Kind.USER, "CREATE", "first start: created admin and root policy")
            if generated:
                # Printed once, on purpose, to the console of the first start; never logged.
                print(
                    f"meshplane: generated password for user 'admin': {password}",
                    file=sys.stderr,
                    flush=True,
                )
            log.info(
                "bootstrapped store", extra={"admin": ADMIN_FQN, "generatedPassword": generated}
            )
        secret = repo.kv_get(conn, _SECRET)
        assert secret is not None
        return secret
