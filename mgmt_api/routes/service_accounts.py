"""Service-account keys: ``.../jwks``, ``POST .../keys``, ``DELETE .../keys/{keyId}``.

Mounted at every place a service account lives (an organization's and a
cluster's), from the kind registry's path templates.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

from fastapi import APIRouter, Path

from meshplane.kinds_contract import Kind
from mgmt_api.kinds import item_templates
from mgmt_api.kinds.service_account import KEY_ENCODING
from mgmt_api.routes import templated as t
from mgmt_api.routes.deps import services
from mgmt_api.schemas import resources as m
from mgmt_api.schemas.base import Empty

KEY_ID = inspect.Parameter(
    "key_id", t.KW, annotation=Annotated[str, Path(alias="keyId", max_length=64)]
)


def _add(router: APIRouter, tpl: str) -> None:
    iparams = t.params_of(tpl)
    mount = t.Mount(router, "/v2/" + tpl, Kind.SERVICE_ACCOUNT)

    def jwks(**kw: Any) -> dict[str, Any]:
        return {"keys": services(kw["request"]).service_accounts.jwks(kw["ctx"], t.fill(tpl, kw))}

    def generate(**kw: Any) -> dict[str, Any]:
        accounts = services(kw["request"]).service_accounts
        return accounts.generate_key(kw["ctx"], t.fill(tpl, kw), kw["key_encoding"])

    def delete_key(**kw: Any) -> dict[str, Any]:
        accounts = services(kw["request"]).service_accounts
        accounts.delete_key(kw["ctx"], t.fill(tpl, kw), kw["key_id"])
        return {}

    mount.add(
        "/jwks",
        "GET",
        jwks,
        t.signature(iparams),
        name="GetServiceAccountJwks",
        model=m.Jwks,
        summary="The account's public keys as a JWKS",
    )
    mount.add(
        "/keys",
        "POST",
        generate,
        t.signature(iparams, KEY_ENCODING.parameter()),
        name="GenerateServiceAccountKey",
        model=m.KeyPair,
        summary="New key pair; the private key is returned once (needs SET_POLICY)",
    )
    mount.add(
        "/keys/{keyId}",
        "DELETE",
        delete_key,
        t.signature(iparams, KEY_ID),
        name="DeleteServiceAccountKey",
        model=Empty,
        summary="Revoke a key (needs SET_POLICY)",
    )


def add_routes(router: APIRouter) -> None:
    for tpl in item_templates(Kind.SERVICE_ACCOUNT):
        _add(router, tpl)
