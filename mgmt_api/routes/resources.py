"""Routers generated from the kind registry: CRUD, policy and permissions per kind.

Paths and parameter names come from ``kinds.item_templates``; every endpoint
gets a real signature (via ``__signature__``) so FastAPI documents each path
parameter, query parameter and body model in the OpenAPI.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response
from pydantic import Field, create_model
from pydantic.alias_generators import to_snake

from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.kinds import KINDS, KindDef, item_templates, parent_templates
from mgmt_api.kinds.base import CREATE, GET, LIST
from mgmt_api.routes.deps import services
from mgmt_api.routes.templated import (
    KW,
    LabelSelector,
    PageSize,
    PageToken,
    endpoint,
    fill,
    json_response,
    operation_id,
    params_of,
    signature,
)
from mgmt_api.schemas import resources as m
from mgmt_api.schemas.base import ApiModel, Empty


def _list_model(kdef: KindDef) -> type[ApiModel]:
    fields: dict[str, Any] = {
        to_snake(kdef.list_field): (list[kdef.model], ...),  # type: ignore[name-defined]
        "next_page_token": (str, ""),
    }
    return create_model(f"List{kdef.kind}sResponse", __base__=ApiModel, **fields)


def _create_model(kdef: KindDef) -> type[ApiModel]:
    fields: dict[str, Any] = {
        "name": (
            str,
            Field(max_length=63, description="{namespace}.{name}: two DNS-1123 labels.")
            if kdef.collection in fqnmod.NAMESPACED
            else Field(max_length=63, description="Short name, a DNS-1123 label."),
        ),
        to_snake(kdef.body_field): (kdef.model, ...),
    }
    return create_model(f"Create{kdef.kind}Request", __base__=ApiModel, **fields)


def add_kind_routes(router: APIRouter, kdef: KindDef) -> None:
    list_model = _list_model(kdef)
    create_model_ = _create_model(kdef)
    body_attr = to_snake(kdef.body_field)
    for parent_tpl, item_tpl in zip(
        parent_templates(kdef.kind), item_templates(kdef.kind), strict=True
    ):
        coll_path = "/v2/" + (
            f"{parent_tpl}/{kdef.collection}"
            if parent_tpl and parent_tpl != "rbac"
            else kdef.collection
        )
        item_path = "/v2/" + item_tpl
        pparams = params_of(parent_tpl)
        iparams = params_of(item_tpl)
        tag = kdef.kind
        _add_collection(
            router,
            kdef,
            path=coll_path,
            parent_tpl=parent_tpl,
            pparams=pparams,
            list_model=list_model,
            create_model_=create_model_,
            body_attr=body_attr,
            tag=tag,
        )
        _add_item(router, kdef, item_path, item_tpl, iparams=iparams, tag=tag)
        _add_policy(router, kdef.kind, item_path, item_tpl, iparams=iparams, tag=tag)


def _options(kdef: KindDef, operation: str, kw: dict[str, Any]) -> dict[str, Any]:
    """The values of the kind's extra query parameters for ``operation``."""
    return {p.name: kw[p.name] for p in kdef.params_for(operation)}


def _extra(kdef: KindDef, operation: str) -> list[inspect.Parameter]:
    return [p.parameter() for p in kdef.params_for(operation)]


def _add_collection(
    router: APIRouter,
    kdef: KindDef,
    *,
    path: str,
    parent_tpl: str,
    pparams: list[str],
    list_model: type[ApiModel],
    create_model_: type[ApiModel],
    body_attr: str,
    tag: str,
) -> None:
    paging = [
        inspect.Parameter("page_size", KW, annotation=PageSize, default=100),
        inspect.Parameter("page_token", KW, annotation=PageToken, default=""),
        inspect.Parameter("label_selector", KW, annotation=LabelSelector, default=""),
    ]

    def list_(**kw: Any) -> Response:
        result = services(kw["request"]).resources.list_objects(
            kw["ctx"],
            kdef,
            fill(parent_tpl, kw),
            page_size=kw["page_size"],
            page_token=kw["page_token"],
            label_selector=kw["label_selector"],
            options=_options(kdef, LIST, kw),
        )
        return json_response(
            {kdef.list_field: result.items, "nextPageToken": result.next_page_token}
        )

    router.add_api_route(
        path,
        endpoint(list_, signature(pparams, *paging, *_extra(kdef, LIST))),
        methods=["GET"],
        response_model=list_model,
        response_model_exclude_none=True,
        operation_id=operation_id(f"List{kdef.kind}s", path, "get"),
        tags=[tag],
        summary=f"List {kdef.kind} objects (paged, label-filterable)",
    )

    body = inspect.Parameter("body", KW, annotation=Annotated[create_model_, Body()])

    def create(**kw: Any) -> Response:
        request_body = kw["body"]
        return json_response(
            services(kw["request"]).resources.create(
                kw["ctx"],
                kdef,
                fill(parent_tpl, kw),
                request_body.name,
                getattr(request_body, body_attr),
                options=_options(kdef, CREATE, kw),
            )
        )

    router.add_api_route(
        path,
        endpoint(create, signature(pparams, body, *_extra(kdef, CREATE))),
        methods=["POST"],
        response_model=kdef.model,
        response_model_exclude_none=True,
        operation_id=operation_id(f"Create{kdef.kind}", path, "post"),
        tags=[tag],
        summary=f"Create a {kdef.kind}; the caller gets rbac/admin on it",
    )


def _add_item(
    router: APIRouter, kdef: KindDef, path: str, tpl: str, *, iparams: list[str], tag: str
) -> None:
    def get(**kw: Any) -> Response:
        return json_response(
            services(kw["request"]).resources.get(kw["ctx"], fill(tpl, kw), _options(kdef, GET, kw))
        )

    router.add_api_route(
        path,
        endpoint(get, signature(iparams, *_extra(kdef, GET))),
        methods=["GET"],
        response_model=kdef.model,
        response_model_exclude_none=True,
        operation_id=operation_id(f"Get{kdef.kind}", path, "get"),
        tags=[tag],
        summary=f"Get a {kdef.kind}",
    )

    def put(**kw: Any) -> Response:
        return json_response(
            services(kw["request"]).resources.update(kw["ctx"], fill(tpl, kw), kw["body"])
        )

    put_body = inspect.Parameter("body", KW, annotation=Annotated[kdef.model, Body()])
    router.add_api_route(
        path,
        endpoint(put, signature(iparams, put_body)),
        methods=["PUT"],
        response_model=kdef.model,
        response_model_exclude_none=True,
        operation_id=operation_id(f"Update{kdef.kind}", path, "put"),
        tags=[tag],
        summary=f"Update a {kdef.kind} (etag required; output-only fields ignored)",
    )

    force = inspect.Parameter("force", KW, annotation=Annotated[bool, Query()], default=False)

    def delete(**kw: Any) -> dict[str, Any]:
        services(kw["request"]).resources.delete(kw["ctx"], fill(tpl, kw), force=kw["force"])
        return {}

    router.add_api_route(
        path,
        endpoint(delete, signature(iparams, force)),
        methods=["DELETE"],
        response_model=Empty,
        operation_id=operation_id(f"Delete{kdef.kind}", path, "delete"),
        tags=[tag],
        summary=f"Delete a {kdef.kind} and everything below it",
    )


def _add_policy(
    router: APIRouter, kind: str, path: str, tpl: str, *, iparams: list[str], tag: str
) -> None:
    def get_policy(**kw: Any) -> dict[str, Any]:
        return services(kw["request"]).policies.get(kw["ctx"], fill(tpl, kw))

    router.add_api_route(
        path + "/policy",
        endpoint(get_policy, signature(iparams)),
        methods=["GET"],
        response_model=m.AccessPolicy,
        response_model_exclude_none=True,
        operation_id=operation_id(f"Get{kind}Policy", path, "get"),
        tags=[tag],
        summary="Access policy of the object",
    )
    body = inspect.Parameter("body", KW, annotation=Annotated[m.AccessPolicy, Body()])

    def put_policy(**kw: Any) -> dict[str, Any]:
        put_access_policy(kw["request"], kw["ctx"], fill(tpl, kw), kw["body"])
        return {}

    router.add_api_route(
        path + "/policy",
        endpoint(put_policy, signature(iparams, body)),
        methods=["PUT"],
        response_model=Empty,
        operation_id=operation_id(f"Set{kind}Policy", path, "put"),
        tags=[tag],
        summary="Replace the access policy (etag required; needs SET_POLICY)",
    )

    def permissions(**kw: Any) -> dict[str, Any]:
        fqn = fill(tpl, kw)
        perms = services(kw["request"]).policies.permissions(kw["ctx"], fqn)
        return {"fqn": fqn, "rules": [{"permissions": perms}] if perms else []}

    router.add_api_route(
        path + "/permissions",
        endpoint(permissions, signature(iparams)),
        methods=["GET"],
        response_model=m.ResourcePermissions,
        operation_id=operation_id(f"Get{kind}Permissions", path, "get"),
        tags=[tag],
        summary="The caller's permissions on the object",
    )


def put_access_policy(request: Request, ctx: CallContext, fqn: str, body: m.AccessPolicy) -> None:
    allow = [b.model_dump(by_alias=True, exclude_none=True) for b in body.allow]
    services(request).policies.put(ctx, fqn, allow, body.description or "", body.etag)


def add_routes(router: APIRouter) -> None:
    """Mount every kind's routes on ``router`` (the app's own router: an
    included sub-router would make FastAPI match each request twice)."""
    for kdef in KINDS.values():
        add_kind_routes(router, kdef)
