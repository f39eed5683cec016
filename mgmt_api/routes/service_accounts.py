"""Service-account keys: ``.../jwks``, ``POST .../keys``, ``DELETE .../keys/{keyId}``.

Mounted at every place a service account lives (an organization's and a
cluster's), from the kind registry's path templates.
"""

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request

from meshplane.kinds_contract import Kind
from mgmt_api.kinds import item_templates
from mgmt_api.kinds.service_account import KEY_ENCODING, KeyView
from mgmt_api.routes import templated as t
from mgmt_api.routes.deps import call_context, services
from mgmt_api.schemas import resources as m
from mgmt_api.schemas.base import Empty


async def _key_id(key_id: Annotated[str, Path(alias="keyId", max_length=64)]) -> str:
    """The key's id; a dependency, so the OpenAPI lists it after the account's path."""
    return key_id


KeyId = Annotated[str, Depends(_key_id)]
KeyEncodingOption = Annotated[t.QueryOptions, Depends(t.query_options([KEY_ENCODING]))]


def _add(router: APIRouter, tpl: str) -> None:
    mount = t.Mount(router, "/v2/" + tpl, Kind.SERVICE_ACCOUNT)
    Account = Annotated[t.ObjectRef, Depends(t.path_ref(tpl))]

    def jwks(request: Request, account: Account) -> m.Jwks:
        accounts = services(request).service_accounts
        return m.Jwks(keys=[dict(k) for k in accounts.jwks(call_context(request), account.fqn)])

    def generate(request: Request, account: Account, options: KeyEncodingOption) -> KeyView:
        accounts = services(request).service_accounts
        return accounts.generate_key(
            call_context(request), account.fqn, str(options[KEY_ENCODING.name])
        )

    def delete_key(request: Request, account: Account, key_id: KeyId) -> Empty:
        services(request).service_accounts.delete_key(call_context(request), account.fqn, key_id)
        return Empty()

    mount.add(
        "/jwks",
        "GET",
        jwks,
        name="GetServiceAccountJwks",
        model=m.Jwks,
        summary="The account's public keys as a JWKS",
    )
    mount.add(
        "/keys",
        "POST",
        generate,
        name="GenerateServiceAccountKey",
        model=m.KeyPair,
        summary="New key pair; the private key is returned once (needs SET_POLICY)",
    )
    mount.add(
        "/keys/{keyId}",
        "DELETE",
        delete_key,
        name="DeleteServiceAccountKey",
        model=Empty,
        summary="Revoke a key (needs SET_POLICY)",
    )


def add_routes(router: APIRouter) -> None:
    for tpl in item_templates(Kind.SERVICE_ACCOUNT):
        _add(router, tpl)
