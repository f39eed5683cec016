"""Service-account keys: mint, revoke, publish (``.../keys``, ``.../jwks``).

A new key's private half is returned once and never stored. Minting and
revoking need what :data:`~mgmt_api.kinds.service_account.NEW_KEY` and
``REVOKE_KEY`` say (SET_POLICY: a key is a credential that acts as the
account). Deleting a key revokes it at once: every request, and every open
policy or agent stream, re-checks that its key still exists.
"""

from __future__ import annotations

from meshplane.kinds_contract import Kind
from mgmt_api import access
from mgmt_api.access import CallContext
from mgmt_api.auth.keys import PublicJwk
from mgmt_api.domain import rbac
from mgmt_api.errors import not_found
from mgmt_api.kinds.service_account import NEW_KEY, REVOKE_KEY, KeyView, key_view, new_key
from mgmt_api.store import repo
from mgmt_api.store.uow import UnitOfWork

KIND = Kind.SERVICE_ACCOUNT


class ServiceAccountService:
    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow

    def generate_key(self, ctx: CallContext, sa_fqn: str, encoding: str) -> KeyView:
        with self.uow.write(ctx.principal.fqn) as tx:
            NEW_KEY.require(tx.conn, ctx.principal, sa_fqn)
            if not repo.exists(tx.conn, sa_fqn):
                raise not_found(sa_fqn)
            pair = new_key(tx.conn, sa_fqn)
            tx.audit(sa_fqn, KIND, "GENERATE_KEY", f"new key {pair.id}", keyId=pair.id)
            return key_view(pair.id, pair.public_jwk, encoding, pair)

    def delete_key(self, ctx: CallContext, sa_fqn: str, key_id: str) -> None:
        with self.uow.write(ctx.principal.fqn) as tx:
            REVOKE_KEY.require(tx.conn, ctx.principal, sa_fqn)
            if not repo.delete_key(tx.conn, sa_fqn, key_id):
                raise not_found(f"{sa_fqn}/keys/{key_id}")
            tx.audit(sa_fqn, KIND, "DELETE_KEY", f"revoked key {key_id}", keyId=key_id)

    def jwks(self, ctx: CallContext, sa_fqn: str) -> list[PublicJwk]:
        with self.uow.read() as conn:
            access.require(conn, ctx.principal, sa_fqn, KIND, rbac.READ)
            if not repo.exists(conn, sa_fqn):
                raise not_found(sa_fqn)
            return [jwk for _, jwk, _ in repo.keys_of(conn, sa_fqn)]
