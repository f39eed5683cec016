"""Routers generated from the kind registry: CRUD, policy and permissions per kind.

Paths and parameter names come from ``kinds.templates``. Every endpoint has a
plain typed signature: the path arrives as a :class:`~mgmt_api.routes.templated.ObjectRef`,
the kind's extra query parameters (its ``route_params``) as a dict and the body as
the kind's model, each through a dependency of :mod:`mgmt_api.routes.templated`
that declares the parameters, so FastAPI documents each one in the OpenAPI.
What differs per kind is in its behaviour (:mod:`mgmt_api.kinds`); nothing
here asks which kind it is.
"""

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from pydantic import Field, create_model
from pydantic.alias_generators import to_snake

from mgmt_api import fqn as fqnmod
from mgmt_api.access import CallContext
from mgmt_api.kinds import KINDS, KindDef, templates
from mgmt_api.kinds.base import CREATE, GET, LIST
from mgmt_api.routes import templated as t
from mgmt_api.routes.deps import call_context, services
from mgmt_api.schemas import resources as m
from mgmt_api.schemas.base import (
    ApiModel,
    DnsLabel,
    Empty,
    NamespacedName,
    QueryBool,
    with_required_etag,
)

Force = Annotated[QueryBool, Query()]


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


def add_kind_routes(router: APIRouter, kdef: KindDef) -> None:
    list_model, create_model = _list_model(kdef), _create_model(kdef)
    for parent_tpl, item_tpl in templates(kdef.kind):
        collection = "/v2/" + (
            f"{parent_tpl}/{kdef.collection}" if parent_tpl not in ("", "rbac") else kdef.collection
        )
        mount = t.Mount(router, "/v2/" + item_tpl, kdef.kind)
        _add_collection(
            mount, kdef, collection, parent_tpl, list_model=list_model, create_model=create_model
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
    create_model: type[ApiModel],
) -> None:
    body_attr = to_snake(kdef.body_field)
    items_attr = to_snake(kdef.list_field)
    Parent = Annotated[t.ObjectRef, Depends(t.path_ref(parent_tpl))]
    ListOptions = Annotated[t.QueryOptions, Depends(t.query_options(kdef.params_for(LIST)))]
    CreateOptions = Annotated[t.QueryOptions, Depends(t.query_options(kdef.params_for(CREATE)))]
    CreateBody = Annotated[ApiModel, Depends(t.json_body(create_model))]

    def list_(
        request: Request,
        parent: Parent,
        options: ListOptions,
        *,
        page_size: t.PageSize = 100,
        page_token: t.PageToken = "",
        label_selector: t.LabelSelector = "",
        name_contains: t.NameContains = "",
    ) -> Response:
        result = services(request).resources.list_objects(
            call_context(request),
            kdef,
            parent.fqn,
            page_size=page_size,
            page_token=page_token,
            label_selector=label_selector,
            options=options,
            name_contains=name_contains,
        )
        # Built without validating again (the items are the kind's models already);
        # both fields count as set, so an empty nextPageToken is still sent.
        fields: dict[str, object] = {
            items_attr: result.items,
            "next_page_token": result.next_page_token,
        }
        return t.model_response(list_model.model_construct(None, **fields))

    def create(
        request: Request, parent: Parent, body: CreateBody, options: CreateOptions
    ) -> Response:
        created = services(request).resources.create(
            call_context(request),
            kdef,
            parent.fqn,
            body.name,  # type: ignore[attr-defined]  # every create model has one
            getattr(body, body_attr),
            options=options,
        )
        return t.model_response(created)

    mount.add(
        "",
        "GET",
        list_,
        name=f"List{kdef.kind}s",
        model=list_model,
        summary=f"List {kdef.kind} objects (paged, label-filterable, name search)",
        collection=collection,
    )
    mount.add(
        "",
        "POST",
        create,
        name=f"Create{kdef.kind}",
        model=kdef.model,
        summary=f"Create a {kdef.kind}; the caller gets rbac/admin on it",
        collection=collection,
    )


def _add_item(mount: t.Mount, kdef: KindDef, tpl: str) -> None:
    Item = Annotated[t.ObjectRef, Depends(t.path_ref(tpl))]
    GetOptions = Annotated[t.QueryOptions, Depends(t.query_options(kdef.params_for(GET)))]
    kind = kdef.kind
    update_model = with_required_etag(kdef.model, f"Update{kind}Request")
    UpdateBody = Annotated[ApiModel, Depends(t.json_body(update_model))]

    def get(request: Request, item: Item, options: GetOptions) -> Response:
        found = services(request).resources.get(call_context(request), item.fqn, options)
        return t.model_response(found)

    def put(request: Request, item: Item, body: UpdateBody) -> Response:
        updated = services(request).resources.update(call_context(request), item.fqn, body)
        return t.model_response(updated)

    def delete(request: Request, item: Item, force: Force = False) -> Empty:
        services(request).resources.delete(call_context(request), item.fqn, force=force)
        return Empty()

    mount.add("", "GET", get, name=f"Get{kind}", model=kdef.model, summary=f"Get a {kind}")
    mount.add(
        "",
        "PUT",
        put,
        name=f"Update{kind}",
        model=kdef.model,
        summary=f"Update a {kind} (etag required; output-only fields ignored)",
    )
    mount.add(
        "",
        "DELETE",
        delete,
        name=f"Delete{kind}",
        model=Empty,
        summary=f"Delete a {kind} and everything below it",
    )


def _add_policy(mount: t.Mount, kind: str, tpl: str) -> None:
    Item = Annotated[t.ObjectRef, Depends(t.path_ref(tpl))]

    def get_policy(request: Request, item: Item) -> m.AccessPolicy:
        return services(request).policies.get(call_context(request), item.fqn)

    def put_policy(
        request: Request, item: Item, body: Annotated[m.SetAccessPolicyRequest, Body()]
    ) -> Empty:
        put_access_policy(request, call_context(request), item.fqn, body)
        return Empty()

    def permissions(request: Request, item: Item) -> m.ResourcePermissions:
        perms = services(request).policies.permissions(call_context(request), item.fqn)
        rules = [{"permissions": perms}] if perms else []
        return m.ResourcePermissions.model_validate({"fqn": item.fqn, "rules": rules})

    mount.add(
        "/policy",
        "GET",
        get_policy,
        name=f"Get{kind}Policy",
        model=m.AccessPolicy,
        summary="Access policy of the object",
    )
    mount.add(
        "/policy",
        "PUT",
        put_policy,
        name=f"Set{kind}Policy",
        model=Empty,
        summary="Replace the access policy (etag required; needs SET_POLICY)",
    )
    mount.add(
        "/permissions",
        "GET",
        permissions,
        name=f"Get{kind}Permissions",
        model=m.ResourcePermissions,
        summary="The caller's permissions on the object",
    )


def put_access_policy(
    request: Request, ctx: CallContext, fqn: str, body: m.SetAccessPolicyRequest
) -> None:
    services(request).policies.put(ctx, fqn, body.allow, body.description or "", body.etag)


def add_routes(router: APIRouter) -> None:
    """Mount every kind's routes on ``router`` (the app's own router: an
    included sub-router would make FastAPI match each request twice)."""
    for kdef in KINDS.values():
        add_kind_routes(router, kdef)
