"""Helpers for routes generated from the kind registry's path templates.

Every object lives at ``/v2/`` + its FQN, so one template per kind and parent
(``organizations/{organization}/clusters/{cluster}``) gives the paths of all
its routes: the generated CRUD (:mod:`mgmt_api.routes.resources`) and the
extra routes of some kinds (:mod:`mgmt_api.routes.service_accounts`,
:mod:`mgmt_api.routes.clusters`) build their endpoints with these.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Query, Response

from mgmt_api import fqn as fqnmod
from mgmt_api.kinds import KINDS
from mgmt_api.kinds.base import RouteParam
from mgmt_api.routes.deps import Name, NamespacedName
from mgmt_api.schemas.base import ApiModel

KW = inspect.Parameter.KEYWORD_ONLY
_PARAM = re.compile(r"{(\w+)}")
# Path parameters of namespaced kinds take ``{namespace}.{name}`` (see fqn.NAMESPACED).
_NAMESPACED_PARAMS = {
    k.param: k.collection for k in KINDS.values() if k.collection in fqnmod.NAMESPACED
}

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


def model_response(model: ApiModel) -> Response:
    """Serialise a service's result, the model the route documents, with pydantic's
    own JSON: camelCase, and only the fields the service set (a null it set stays;
    a default it did not set stays out, as the stored object has none).

    Not through FastAPI's ``response_model``: it would validate the result
    again and cost a large share of a GET's CPU, for nothing, since the
    service built it as that model. Schemathesis checks conformance.
    """
    return Response(
        model.model_dump_json(by_alias=True, exclude_unset=True), media_type="application/json"
    )


def json_response(content: Any) -> Response:
    """Serialise a service result that is still a plain dict, in its wire form
    (the cluster config): as :func:`model_response`, without FastAPI's re-validation."""
    return Response(json.dumps(content, separators=(",", ":")), media_type="application/json")


def params_of(template: str) -> list[str]:
    return _PARAM.findall(template)


def fill(template: str, kw: Mapping[str, str]) -> str:
    for name in params_of(template):
        fqnmod.validate_segment(_NAMESPACED_PARAMS.get(name, ""), kw[name], name)
    return template.format(**{p: kw[p] for p in params_of(template)})


@dataclass(frozen=True)
class ObjectRef:
    """The FQN a path names (an object, or the parent of a collection), each segment
    validated: what a generated route gets instead of its raw path parameters."""

    fqn: str


def _path_parameter(name: str) -> inspect.Parameter:
    return inspect.Parameter(
        name, KW, annotation=NamespacedName if name in _NAMESPACED_PARAMS else Name
    )


def path_ref(template: str) -> Callable[..., Awaitable[ObjectRef]]:
    """A FastAPI dependency taking ``template``'s path parameters (so the OpenAPI names
    and constrains each one) and giving the :class:`ObjectRef` they fill it into.

    The parameters differ per template, so this one place builds a signature; the
    routes that depend on it have plain, typed ones.
    """

    async def ref(**segments: str) -> ObjectRef:
        return ObjectRef(fill(template, segments))

    ref.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [_path_parameter(p) for p in params_of(template)]
    )
    return ref


#: The values of a kind's extra query parameters (its ``route_params``), by name
#: (what :data:`mgmt_api.kinds.base.QueryOptions` says), as the dict FastAPI fills.
QueryOptions = dict[str, bool | str]


def query_options(params: Iterable[RouteParam]) -> Callable[..., Awaitable[QueryOptions]]:
    """A FastAPI dependency taking a kind's extra query parameters (its
    ``route_params`` for one operation) and giving their values by name."""

    async def options(**values: Any) -> QueryOptions:
        return values

    options.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [p.parameter() for p in params]
    )
    return options


M = TypeVar("M", bound=ApiModel)


def json_body(model: type[M]) -> Callable[..., Awaitable[M]]:
    """A FastAPI dependency reading the JSON body as ``model`` (a model built from the
    kinds table at start-up, so not one a signature could name)."""

    async def body(body: M) -> M:
        return body

    body.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("body", KW, annotation=Annotated[model, Body()])]
    )
    return body


def operation_id(name: str, template: str, method: str) -> str:
    return f"{name}__{method}__{template.replace('/', '_').replace('{', '').replace('}', '')}"


@dataclass(frozen=True)
class Mount:
    """Where a kind's generated routes go: the router, the object's path and tag."""

    router: APIRouter
    path: str  # /v2/ + the item template (the operation ids derive from it)
    tag: str

    def add(
        self,
        suffix: str,
        method: str,
        fn: Callable[..., Any],
        *,
        name: str,
        model: Any,
        summary: str,
        collection: str | None = None,
    ) -> None:
        """Route ``fn`` at the path + ``suffix``
        (or at ``collection``, for the collection's own routes)."""
        self.router.add_api_route(
            collection or self.path + suffix,
            fn,
            methods=[method],
            response_model=model,
            response_model_exclude_none=True,
            operation_id=operation_id(name, collection or self.path, method.lower()),
            tags=[self.tag],
            summary=summary,
        )
