"""Service-account keys: ``.../jwks``, ``POST .../keys``, ``DELETE .../keys/{keyId}``.

Mounted at every place a service account lives (an organization's and a
cluster's), from the kind registry's path templates.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

from fastapi import APIRouter, Path

from mgmt_api.kinds import item_templates
from mgmt_api.kinds.service_account import KEY_ENCODING
from mgmt_api.routes.deps import services
from mgmt_api.routes.templated import KW, endpoint, fill, operation_id, params_of, signature
from mgmt_api.schemas import resources as m
from mgmt_api.schemas.base import Empty

TAG = "ServiceAccount"


def _add(router: APIRouter, tpl: str) -> None:
    path = "/v2/" + tpl
    iparams = params_of(tpl)

    def jwks(**kw: Any) -> dict[str, Any]:
        return {"keys": services(kw["request"]).service_accounts.jwks(kw["ctx"], fill(tpl, kw))}

    router.add_api_route(
        path + "/jwks",
        endpoint(jwks, signature(iparams)),
        methods=["GET"],
        response_model=m.Jwks,
        operation_id=operation_id("GetServiceAccountJwks", path, "get"),
        tags=[TAG],
        summary="The account's public keys as a JWKS",
    )

    def generate(**kw: Any) -> dict[str, Any]:
        return services(kw["request"]).service_accounts.generate_key(
            kw["ctx"], fill(tpl, kw), kw["key_encoding"]
        )

    router.add_api_route(
        path + "/keys",
        endpoint(generate, signature(iparams, KEY_ENCODING.parameter())),
        methods=["POST"],
        response_model=m.KeyPair,
        response_model_exclude_none=True,
        operation_id=operation_id("GenerateServiceAccountKey", path, "post"),
        tags=[TAG],
        summary="New key pair; the private key is returned once (needs SET_POLICY)",
    )
    key_id = inspect.Parameter(
        "key_id", KW, annotation=Annotated[str, Path(alias="keyId", max_length=64)]
    )

    def delete_key(**kw: Any) -> dict[str, Any]:
        services(kw["request"]).service_accounts.delete_key(kw["ctx"], fill(tpl, kw), kw["key_id"])
        return {}

    router.add_api_route(
        path + "/keys/{keyId}",
        endpoint(delete_key, signature(iparams, key_id)),
        methods=["DELETE"],
        response_model=Empty,
        operation_id=operation_id("DeleteServiceAccountKey", path, "delete"),
        tags=[TAG],
        summary="Revoke a key",
    )


def add_routes(router: APIRouter) -> None:
    for tpl in item_templates("ServiceAccount"):
        _add(router, tpl)
