"""Routers generated from the kind registry: CRUD, policy and permissions per kind.

Paths and parameter names come from ``kinds.item_templates``; every endpoint
gets a real signature (via ``__signature__``) so FastAPI documents each path
parameter, query parameter and body model in the OpenAPI.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path, Query, Request, Response
from pydantic import Field, create_model
from pydantic.alias_generators import to_snake

from mgmt_api import fqn as fqnmod
from mgmt_api.kinds import KINDS, KindDef, item_templates, parent_templates
from mgmt_api.routes.deps import NAME_PATTERN, call_context, state
from mgmt_api.schemas import resources as m
from mgmt_api.schemas.base import ApiModel, Empty
from mgmt_api.service.resources import CallContext

KW = inspect.Parameter.KEYWORD_ONLY
_PARAM = re.compile(r"{(\w+)}")
# Path parameters of namespaced kinds take ``{namespace}.{name}`` (see fqn.NAMESPACED).
_NAMESPACED_PARAMS = {
    k.param: k.collection for k in KINDS.values() if k.collection in fqnmod.NAMESPACED
}
NAMESPACED_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\.[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

PageSize = Annotated[int, Query(alias="pageSize", ge=1, le=1000, description="Default 100.")]
PageToken = Annotated[str, Query(alias="pageToken", max_length=2048)]
LabelSelector = Annotated[
    str,
    Query(alias="labelSelector", max_length=1024, description="k=v,k2=v2 or k (label present)."),
]
NameContains = Annotated[
    str,
    Query(
        alias="nameContains",
        max_length=63,
        pattern=r"^[a-z0-9.-]*$",
        description="Keep the objects whose name contains this text (a name search).",
    ),
]
KeyEncoding = Annotated[Literal["PEM", "JWK"], Query(alias="keyEncoding")]


def _json(content: Any) -> Response:
    """Serialise a service result directly.

    The service already produces the camelCase wire form; skipping FastAPI's
    response-model re-validation saves a large share of a GET's CPU. The
    models still document the responses, and schemathesis checks conformance.
    """
    return Response(json.dumps(content, separators=(",", ":")), media_type="application/json")


def _params(template: str) -> list[str]:
    return _PARAM.findall(template)


def _fill(template: str, kw: dict[str, Any]) -> str:
    for name in _params(template):
        fqnmod.validate_segment(_NAMESPACED_PARAMS.get(name, ""), kw[name], name)
    return template.format(**{p: kw[p] for p in _params(template)})


def _signature(path_params: list[str], *extra: inspect.Parameter) -> inspect.Signature:
    params = [inspect.Parameter("request", KW, annotation=Request)]
    params += [
        inspect.Parameter(
            p,
            KW,
            annotation=Annotated[str, Path(max_length=63, pattern=NAMESPACED_PATTERN)]
            if p in _NAMESPACED_PARAMS
            else Annotated[str, Path(max_length=63, pattern=NAME_PATTERN)],
        )
        for p in path_params
    ]
    params += list(extra)
    return inspect.Signature(params)


def _endpoint(fn: Callable[..., Any], sig: inspect.Signature) -> Callable[..., Any]:
    """Give ``fn`` a real signature and authenticate before it runs.

    Authentication runs inside the endpoint's worker thread rather than as a
    separate FastAPI dependency: a sync dependency would cost a second
    thread hop per request. The OpenAPI declares the security schemes.
    """

    def endpoint(**kw: Any) -> Any:
        kw["ctx"] = call_context(kw["request"])
        return fn(**kw)

    endpoint.__signature__ = sig  # type: ignore[attr-defined]
    endpoint.__name__ = fn.__name__
    endpoint.__doc__ = fn.__doc__
    return endpoint


def _op(name: str, template: str, method: str) -> str:
    return f"{name}__{method}__{template.replace('/', '_').replace('{', '').replace('}', '')}"


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
        pparams = _params(parent_tpl)
        iparams = _params(item_tpl)
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
    extra = [
        inspect.Parameter("page_size", KW, annotation=PageSize, default=100),
        inspect.Parameter("page_token", KW, annotation=PageToken, default=""),
        inspect.Parameter("label_selector", KW, annotation=LabelSelector, default=""),
        inspect.Parameter("name_contains", KW, annotation=NameContains, default=""),
    ]
    if kdef.kind == "Cluster":
        extra.append(
            inspect.Parameter(
                "fetch_workloads",
                KW,
                annotation=Annotated[bool, Query(alias="fetchWorkloads")],
                default=False,
            )
        )

    def list_(**kw: Any) -> Response:
        parent = _fill(parent_tpl, kw)
        result = state(kw["request"]).resources.list_objects(
            kw["ctx"],
            kdef,
            parent,
            page_size=kw["page_size"],
            page_token=kw["page_token"],
            label_selector=kw["label_selector"],
            fetch_workloads=kw.get("fetch_workloads", False),
            name_contains=kw["name_contains"],
        )
        return _json({kdef.list_field: result.items, "nextPageToken": result.next_page_token})

    router.add_api_route(
        path,
        _endpoint(list_, _signature(pparams, *extra)),
        methods=["GET"],
        response_model=list_model,
        response_model_exclude_none=True,
        operation_id=_op(f"List{kdef.kind}s", path, "get"),
        tags=[tag],
        summary=f"List {kdef.kind} objects (paged, label-filterable, name search)",
    )

    create_extra = [inspect.Parameter("body", KW, annotation=Annotated[create_model_, Body()])]
    if kdef.kind == "ServiceAccount":
        create_extra.append(
            inspect.Parameter("key_encoding", KW, annotation=KeyEncoding, default="PEM")
        )

    def create(**kw: Any) -> Response:
        parent = _fill(parent_tpl, kw)
        body = kw["body"]
        return _json(
            state(kw["request"]).resources.create(
                kw["ctx"],
                kdef,
                parent,
                body.name,
                getattr(body, body_attr),
                key_encoding=kw.get("key_encoding", "PEM"),
            )
        )

    router.add_api_route(
        path,
        _endpoint(create, _signature(pparams, *create_extra)),
        methods=["POST"],
        response_model=kdef.model,
        response_model_exclude_none=True,
        operation_id=_op(f"Create{kdef.kind}", path, "post"),
        tags=[tag],
        summary=f"Create a {kdef.kind}; the caller gets rbac/admin on it",
    )


def _add_item(
    router: APIRouter, kdef: KindDef, path: str, tpl: str, *, iparams: list[str], tag: str
) -> None:
    get_extra: list[inspect.Parameter] = []
    if kdef.kind == "Cluster":
        get_extra = [
            inspect.Parameter(
                "fetch_workloads",
                KW,
                annotation=Annotated[bool, Query(alias="fetchWorkloads")],
                default=False,
            ),
            inspect.Parameter(
                "include_install_template",
                KW,
                annotation=Annotated[
                    bool,
                    Query(
                        alias="includeInstallTemplate",
                        description="Mints a new agent key; needs SET_POLICY on the organization.",
                    ),
                ],
                default=False,
            ),
        ]
    elif kdef.kind == "ServiceAccount":
        get_extra = [inspect.Parameter("key_encoding", KW, annotation=KeyEncoding, default="PEM")]

    def get(**kw: Any) -> Response:
        fqn = _fill(tpl, kw)
        svc = state(kw["request"]).resources
        if kw.get("include_install_template"):
            return _json(
                svc.get_cluster_with_template(
                    kw["ctx"], fqn, fetch_workloads=kw.get("fetch_workloads", False)
                )
            )
        return _json(
            svc.get(
                kw["ctx"],
                fqn,
                fetch_workloads=kw.get("fetch_workloads", False),
                key_encoding=kw.get("key_encoding", "PEM"),
            )
        )

    router.add_api_route(
        path,
        _endpoint(get, _signature(iparams, *get_extra)),
        methods=["GET"],
        response_model=kdef.model,
        response_model_exclude_none=True,
        operation_id=_op(f"Get{kdef.kind}", path, "get"),
        tags=[tag],
        summary=f"Get a {kdef.kind}",
    )

    def put(**kw: Any) -> Response:
        return _json(state(kw["request"]).resources.update(kw["ctx"], _fill(tpl, kw), kw["body"]))

    put_body = inspect.Parameter("body", KW, annotation=Annotated[kdef.model, Body()])
    router.add_api_route(
        path,
        _endpoint(put, _signature(iparams, put_body)),
        methods=["PUT"],
        response_model=kdef.model,
        response_model_exclude_none=True,
        operation_id=_op(f"Update{kdef.kind}", path, "put"),
        tags=[tag],
        summary=f"Update a {kdef.kind} (etag required; output-only fields ignored)",
    )

    force = inspect.Parameter("force", KW, annotation=Annotated[bool, Query()], default=False)

    def delete(**kw: Any) -> dict[str, Any]:
        state(kw["request"]).resources.delete(kw["ctx"], _fill(tpl, kw), force=kw["force"])
        return {}

    router.add_api_route(
        path,
        _endpoint(delete, _signature(iparams, force)),
        methods=["DELETE"],
        response_model=Empty,
        operation_id=_op(f"Delete{kdef.kind}", path, "delete"),
        tags=[tag],
        summary=f"Delete a {kdef.kind} and everything below it",
    )

    if kdef.kind == "ServiceAccount":
        _add_sa_keys(router, path, tpl, iparams)
    if kdef.kind == "Cluster":

        def config(**kw: Any) -> dict[str, Any]:
            return state(kw["request"]).resources.cluster_config(kw["ctx"], _fill(tpl, kw))

        router.add_api_route(
            path + "/config",
            _endpoint(config, _signature(iparams)),
            methods=["POST"],
            response_model=m.ClusterConfig,
            response_model_exclude_none=True,
            operation_id=_op("GetClusterConfig", path, "post"),
            tags=[tag],
            summary="ClusterConfig: the settings the cluster's control plane syncs",
        )


def _add_sa_keys(router: APIRouter, path: str, tpl: str, iparams: list[str]) -> None:
    tag = "ServiceAccount"

    def jwks(**kw: Any) -> dict[str, Any]:
        return {"keys": state(kw["request"]).resources.jwks(kw["ctx"], _fill(tpl, kw))}

    router.add_api_route(
        path + "/jwks",
        _endpoint(jwks, _signature(iparams)),
        methods=["GET"],
        response_model=m.Jwks,
        operation_id=_op("GetServiceAccountJwks", path, "get"),
        tags=[tag],
        summary="The account's public keys as a JWKS",
    )
    enc = inspect.Parameter("key_encoding", KW, annotation=KeyEncoding, default="PEM")

    def generate(**kw: Any) -> dict[str, Any]:
        return state(kw["request"]).resources.generate_key(
            kw["ctx"], _fill(tpl, kw), kw["key_encoding"]
        )

    router.add_api_route(
        path + "/keys",
        _endpoint(generate, _signature(iparams, enc)),
        methods=["POST"],
        response_model=m.KeyPair,
        response_model_exclude_none=True,
        operation_id=_op("GenerateServiceAccountKey", path, "post"),
        tags=[tag],
        summary="New key pair; the private key is returned once (needs SET_POLICY)",
    )
    key_id = inspect.Parameter(
        "key_id", KW, annotation=Annotated[str, Path(alias="keyId", max_length=64)]
    )

    def delete_key(**kw: Any) -> dict[str, Any]:
        state(kw["request"]).resources.delete_key(kw["ctx"], _fill(tpl, kw), kw["key_id"])
        return {}

    router.add_api_route(
        path + "/keys/{keyId}",
        _endpoint(delete_key, _signature(iparams, key_id)),
        methods=["DELETE"],
        response_model=Empty,
        operation_id=_op("DeleteServiceAccountKey", path, "delete"),
        tags=[tag],
        summary="Revoke a key",
    )


def _add_policy(
    router: APIRouter, kind: str, path: str, tpl: str, *, iparams: list[str], tag: str
) -> None:
    def get_policy(**kw: Any) -> dict[str, Any]:
        return state(kw["request"]).policies.get(kw["ctx"], _fill(tpl, kw))

    router.add_api_route(
        path + "/policy",
        _endpoint(get_policy, _signature(iparams)),
        methods=["GET"],
        response_model=m.AccessPolicy,
        response_model_exclude_none=True,
        operation_id=_op(f"Get{kind}Policy", path, "get"),
        tags=[tag],
        summary="Access policy of the object",
    )
    body = inspect.Parameter("body", KW, annotation=Annotated[m.AccessPolicy, Body()])

    def put_policy(**kw: Any) -> dict[str, Any]:
        put_access_policy(kw["request"], kw["ctx"], _fill(tpl, kw), kw["body"])
        return {}

    router.add_api_route(
        path + "/policy",
        _endpoint(put_policy, _signature(iparams, body)),
        methods=["PUT"],
        response_model=Empty,
        operation_id=_op(f"Set{kind}Policy", path, "put"),
        tags=[tag],
        summary="Replace the access policy (etag required; needs SET_POLICY)",
    )

    def permissions(**kw: Any) -> dict[str, Any]:
        fqn = _fill(tpl, kw)
        perms = state(kw["request"]).policies.permissions(kw["ctx"], fqn)
        return {"fqn": fqn, "rules": [{"permissions": perms}] if perms else []}

    router.add_api_route(
        path + "/permissions",
        _endpoint(permissions, _signature(iparams)),
        methods=["GET"],
        response_model=m.ResourcePermissions,
        operation_id=_op(f"Get{kind}Permissions", path, "get"),
        tags=[tag],
        summary="The caller's permissions on the object",
    )


def put_access_policy(request: Request, ctx: CallContext, fqn: str, body: m.AccessPolicy) -> None:
    allow = [b.model_dump(by_alias=True, exclude_none=True) for b in body.allow]
    state(request).policies.put(ctx, fqn, allow, body.description or "", body.etag)


def add_routes(router: APIRouter) -> None:
    """Mount every kind's routes on ``router`` (the app's own router: an
    included sub-router would make FastAPI match each request twice)."""
    for kdef in KINDS.values():
        add_kind_routes(router, kdef)
