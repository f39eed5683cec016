"""Routers generated from the kind registry: CRUD, policy and permissions per kind.

Paths and parameter names come from ``kinds.templates``; every endpoint gets
a real signature (via ``__signature__``) so FastAPI documents each path
parameter, query parameter (the kind's ``route_params`` included) and body
model in the OpenAPI. What differs per kind is in its behaviour
(:mod:`mgmt_api.kinds`); nothing here asks which kind it is.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response
from pydantic import Field, create_model
from pydantic.alias_generators import to_snake

from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.kinds import KINDS, KindDef, templates
from mgmt_api.kinds.base import CREATE, GET, LIST
from mgmt_api.routes import templated as t
from mgmt_api.routes.deps import services
from mgmt_api.schemas import resources as m
from mgmt_api.schemas.base import (
    ApiModel,
    DnsLabel,
    Empty,
    NamespacedName,
    QueryBool,
    with_required_etag,
)

PAGING = (
    inspect.Parameter("page_size", t.KW, annotation=t.PageSize, default=100),
    inspect.Parameter("page_token", t.KW, annotation=t.PageToken, default=""),
    inspect.Parameter("label_selector", t.KW, annotation=t.LabelSelector, default=""),
    inspect.Parameter("name_contains", t.KW, annotation=t.NameContains, default=""),
)
FORCE = inspect.Parameter("force", t.KW, annotation=Annotated[QueryBool, Query()], default=False)


def _list_model(kdef: KindDef) -> type[ApiModel]:
    fields: dict[str, Any] = {
        to_snake(kdef.list_field): (list[kdef.model], ...),  # type: ignore[name-defined]
        "next_page_token": (str, ""),
    }
    return create_model(f"List{kdef.kind}sResponse", __base__=ApiModel, **fields)


def _create_model(kdef: KindDef) -> type[ApiModel]:
    fields: dict[str, Any] = {
        "name": (
            (NamespacedName, Field(description="{namespace}.{name}: two DNS-1123 labels."))
            if kdef.collection in fqnmod.NAMESPACED
            else (DnsLabel, Field(description="Short name, a DNS-1123 label."))
        ),
        to_snake(kdef.body_field): (kdef.model, ...),
    }
    return create_model(f"Create{kdef.kind}Request", __base__=ApiModel, **fields)


def _body(model: type[ApiModel]) -> inspect.Parameter:
    return inspect.Parameter("body", t.KW, annotation=Annotated[model, Body()])


def _options(kdef: KindDef, operation: str, kw: dict[str, Any]) -> dict[str, Any]:
    """The values of the kind's extra query parameters for ``operation``."""
    return {p.name: kw[p.name] for p in kdef.params_for(operation)}


def _extra(kdef: KindDef, operation: str) -> list[inspect.Parameter]:
    return [p.parameter() for p in kdef.params_for(operation)]


def add_kind_routes(router: APIRouter, kdef: KindDef) -> None:
    list_model, create_body = _list_model(kdef), _body(_create_model(kdef))
    for parent_tpl, item_tpl in templates(kdef.kind):
        collection = "/v2/" + (
            f"{parent_tpl}/{kdef.collection}" if parent_tpl not in ("", "rbac") else kdef.collection
        )
        mount = t.Mount(router, "/v2/" + item_tpl, kdef.kind)
        _add_collection(
            mount, kdef, collection, parent_tpl, list_model=list_model, create_body=create_body
        )
        _add_item(mount, kdef, item_tpl)
        _add_policy(mount, kdef.kind, item_tpl)


def _add_collection(
    mount: t.Mount,
    kdef: KindDef,
    collection: str,
    parent_tpl: str,
    *,
    list_model: type[ApiModel],
    create_body: inspect.Parameter,
) -> None:
    pparams = t.params_of(parent_tpl)
    body_attr = to_snake(kdef.body_field)

    def list_(**kw: Any) -> Response:
        result = services(kw["request"]).resources.list_objects(
            kw["ctx"],
            kdef,
            t.fill(parent_tpl, kw),
            page_size=kw["page_size"],
            page_token=kw["page_token"],
            label_selector=kw["label_selector"],
            options=_options(kdef, LIST, kw),
            name_contains=kw["name_contains"],
        )
        page = {kdef.list_field: result.items, "nextPageToken": result.next_page_token}
        return t.json_response(page)

    def create(**kw: Any) -> Response:
        body = kw["body"]
        parent = t.fill(parent_tpl, kw)
        options = _options(kdef, CREATE, kw)
        created = services(kw["request"]).resources.create(
            kw["ctx"], kdef, parent, body.name, getattr(body, body_attr), options=options
        )
        return t.json_response(created)

    mount.add(
        "",
        "GET",
        list_,
        t.signature(pparams, *PAGING, *_extra(kdef, LIST)),
        name=f"List{kdef.kind}s",
        model=list_model,
        summary=f"List {kdef.kind} objects (paged, label-filterable, name search)",
        collection=collection,
    )
    mount.add(
        "",
        "POST",
        create,
        t.signature(pparams, create_body, *_extra(kdef, CREATE)),
        name=f"Create{kdef.kind}",
        model=kdef.model,
        summary=f"Create a {kdef.kind}; the caller gets rbac/admin on it",
        collection=collection,
    )


def _add_item(mount: t.Mount, kdef: KindDef, tpl: str) -> None:
    iparams = t.params_of(tpl)

    def get(**kw: Any) -> Response:
        fqn, options = t.fill(tpl, kw), _options(kdef, GET, kw)
        return t.json_response(services(kw["request"]).resources.get(kw["ctx"], fqn, options))

    def put(**kw: Any) -> Response:
        fqn = t.fill(tpl, kw)
        return t.json_response(services(kw["request"]).resources.update(kw["ctx"], fqn, kw["body"]))

    def delete(**kw: Any) -> dict[str, Any]:
        services(kw["request"]).resources.delete(kw["ctx"], t.fill(tpl, kw), force=kw["force"])
        return {}

    kind = kdef.kind
    mount.add(
        "",
        "GET",
        get,
        t.signature(iparams, *_extra(kdef, GET)),
        name=f"Get{kind}",
        model=kdef.model,
        summary=f"Get a {kind}",
    )
    mount.add(
        "",
        "PUT",
        put,
        t.signature(iparams, _body(with_required_etag(kdef.model, f"Update{kind}Request"))),
        name=f"Update{kind}",
        model=kdef.model,
        summary=f"Update a {kind} (etag required; output-only fields ignored)",
    )
    mount.add(
        "",
        "DELETE",
        delete,
        t.signature(iparams, FORCE),
        name=f"Delete{kind}",
        model=Empty,
        summary=f"Delete a {kind} and everything below it",
    )


def _add_policy(mount: t.Mount, kind: str, tpl: str) -> None:
    iparams = t.params_of(tpl)

    def get_policy(**kw: Any) -> dict[str, Any]:
        return services(kw["request"]).policies.get(kw["ctx"], t.fill(tpl, kw))

    def put_policy(**kw: Any) -> dict[str, Any]:
        put_access_policy(kw["request"], kw["ctx"], t.fill(tpl, kw), kw["body"])
        return {}

    def permissions(**kw: Any) -> dict[str, Any]:
        fqn = t.fill(tpl, kw)
        perms = services(kw["request"]).policies.permissions(kw["ctx"], fqn)
        return {"fqn": fqn, "rules": [{"permissions": perms}] if perms else []}

    mount.add(
        "/policy",
        "GET",
        get_policy,
        t.signature(iparams),
        name=f"Get{kind}Policy",
        model=m.AccessPolicy,
        summary="Access policy of the object",
    )
    mount.add(
        "/policy",
        "PUT",
        put_policy,
        t.signature(iparams, _body(m.SetAccessPolicyRequest)),
        name=f"Set{kind}Policy",
        model=Empty,
        summary="Replace the access policy (etag required; needs SET_POLICY)",
    )
    mount.add(
        "/permissions",
        "GET",
        permissions,
        t.signature(iparams),
        name=f"Get{kind}Permissions",
        model=m.ResourcePermissions,
        summary="The caller's permissions on the object",
    )


def put_access_policy(
    request: Request, ctx: CallContext, fqn: str, body: m.SetAccessPolicyRequest
) -> None:
    allow = [b.model_dump(by_alias=True, exclude_none=True) for b in body.allow]
    services(request).policies.put(ctx, fqn, allow, body.description or "", body.etag)


def add_routes(router: APIRouter) -> None:
    """Mount every kind's routes on ``router`` (the app's own router: an
    included sub-router would make FastAPI match each request twice)."""
    for kdef in KINDS.values():
        add_kind_routes(router, kdef)
