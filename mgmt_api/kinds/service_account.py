"""ServiceAccount: a non-human principal authenticated by its key pairs.

Creating one mints its first key; the private half is in that response only
(never stored). ``keyEncoding`` (``PEM`` or ``JWK``) chooses how keys are shown.

A key acts as the account, so minting or revoking one is managing the
account's credentials: it needs SET_POLICY (:data:`NEW_KEY`,
:data:`REVOKE_KEY`), on the account, or for a cluster's agent, gateway,
extauthz or ratelimit account on its organization, as the cluster's install
template does (spec 4.7: the agent's key is the organization admins' to hand
out, and so are the other components').
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from fastapi import Query
from pydantic import Field
from sqlalchemy.engine import Connection

from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.auth import keys as keymod
from mgmt_api.domain import cluster_accounts
from mgmt_api.kinds import base
from mgmt_api.schemas.resources import KeyPair, Meta
from mgmt_api.store import repo

KeyEncoding = Annotated[Literal["PEM", "JWK"], Query(alias="keyEncoding")]
KEY_ENCODING = base.RouteParam(
    "key_encoding", KeyEncoding, "PEM", frozenset({base.GET, base.CREATE})
)


def key_scope(sa_fqn: str) -> tuple[str, str]:
    """Where managing ``sa_fqn``'s keys is checked: its organization for one of a
    cluster's accounts (agent, gateway, extauthz, ratelimit: the install template
    hands out their keys, and each opens a stream), else the account."""
    found = cluster_accounts.account_of(sa_fqn)
    if found is not None:
        return fqnmod.parse(found[0]).parent, "Organization"
    return sa_fqn, "ServiceAccount"


def _key_targets(conn: Connection, sa_fqn: str, kind: str) -> list[tuple[str, str]]:
    return [key_scope(sa_fqn)]


_KEY_ON = "the account; a cluster's agent, gateway, extauthz or ratelimit account: its organization"
NEW_KEY = base.AccessGrant(
    "ServiceAccount",
    "new key (POST .../keys; creating the account mints its first)",
    "the key acts as the account",
    on=_KEY_ON,
    targets=_key_targets,
)
REVOKE_KEY = base.AccessGrant(
    "ServiceAccount",
    "revoke a key (DELETE .../keys/{keyId})",
    "takes the account's credential away (a cluster's component would stop)",
    on=_KEY_ON,
    targets=_key_targets,
)


class ServiceAccount(Meta):
    keys: list[KeyPair] | None = Field(default=None, description="Output only.")


def new_key(conn: Connection, owner: str) -> keymod.KeyPair:
    """A new key pair of ``owner``; only its public half is stored."""
    pair = keymod.generate()
    repo.add_key(conn, pair.id, owner, pair.public_jwk)
    return pair


class KeyView(TypedDict):
    """A key as the API shows it (the ``KeyPair`` schema); ``privateKey`` only once."""

    id: str
    publicKey: str
    encoding: str
    privateKey: NotRequired[str]


def key_view(
    key_id: str, jwk: keymod.PublicJwk, encoding: str, private: keymod.KeyPair | None = None
) -> KeyView:
    """A key as the API shows it; with ``private``, the one response that carries it."""
    if encoding == "JWK":
        public = json.dumps(jwk, separators=(",", ":"))
        secret = json.dumps(private.private_jwk, separators=(",", ":")) if private else None
    else:
        public = keymod.public_pem_of(jwk)
        secret = private.private_pem if private else None
    view: KeyView = {"id": key_id, "publicKey": public, "encoding": encoding}
    if secret is not None:
        view["privateKey"] = secret
    return view


class ServiceAccountBehaviour(base.Behaviour):
    route_params = (KEY_ENCODING,)
    grants = (base.revived_by_create("ServiceAccount"), NEW_KEY, REVOKE_KEY)

    def after_write(
        self, env: base.WriteEnv, write: base.Write, res: repo.Resource
    ) -> dict[str, Any]:
        if not write.creating:
            return {}
        # The creator is rbac/admin of the new account, so this refuses only a
        # cluster's account (agent, gateway, extauthz, ratelimit) recreated by
        # someone who is not an org admin.
        NEW_KEY.require(env.tx.conn, env.principal, res.fqn)
        pair = new_key(env.tx.conn, res.fqn)
        encoding = str(write.options.get("key_encoding", "PEM"))
        return {"keys": [key_view(pair.id, pair.public_jwk, encoding, pair)]}

    def render(self, res: repo.Resource, env: base.RenderEnv) -> dict[str, Any]:
        out = base.render_common(res)
        encoding = str(env.options.get("key_encoding", "PEM"))
        out["keys"] = [key_view(k, jwk, encoding) for k, jwk, _ in repo.keys_of(env.conn, res.fqn)]
        return out


KIND = base.KindDef(Kind.SERVICE_ACCOUNT, ServiceAccount, behaviour=ServiceAccountBehaviour())
