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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from mgmt_api import fqn as fqnmod
from mgmt_api.kinds import KINDS
from mgmt_api.routes.deps import Name, NamespacedName, call_context

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


def json_response(content: Any) -> Response:
    """Serialise a service result directly.

    The service already produces the camelCase wire form; skipping FastAPI's
    response-model re-validation saves a large share of a GET's CPU. The
    models still document the responses, and schemathesis checks conformance.
    """
    return Response(json.dumps(content, separators=(",", ":")), media_type="application/json")


def params_of(template: str) -> list[str]:
    return _PARAM.findall(template)


def fill(template: str, kw: dict[str, Any]) -> str:
    for name in params_of(template):
        fqnmod.validate_segment(_NAMESPACED_PARAMS.get(name, ""), kw[name], name)
    return template.format(**{p: kw[p] for p in params_of(template)})


def signature(path_params: list[str], *extra: inspect.Parameter) -> inspect.Signature:
    params = [inspect.Parameter("request", KW, annotation=Request)]
    params += [
        inspect.Parameter(
            p,
            KW,
            annotation=NamespacedName if p in _NAMESPACED_PARAMS else Name,
        )
        for p in path_params
    ]
    params += list(extra)
    return inspect.Signature(params)


def endpoint(fn: Callable[..., Any], sig: inspect.Signature) -> Callable[..., Any]:
    """Give ``fn`` a real signature and the caller's context (``kw["ctx"]``).

    The caller was authenticated before FastAPI read anything of the request
    (:class:`mgmt_api.middleware.Authenticate`); this takes its context from
    the scope. The OpenAPI declares the security schemes.
    """

    def endpoint(**kw: Any) -> Any:
        kw["ctx"] = call_context(kw["request"])
        return fn(**kw)

    endpoint.__signature__ = sig  # type: ignore[attr-defined]
    endpoint.__name__ = fn.__name__
    endpoint.__doc__ = fn.__doc__
    return endpoint


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
        sig: inspect.Signature,
        *,
        name: str,
        model: Any,
        summary: str,
        collection: str | None = None,
    ) -> None:
        """Route ``fn`` (authenticated, with signature ``sig``) at the path + ``suffix``
        (or at ``collection``, for the collection's own routes)."""
        self.router.add_api_route(
            collection or self.path + suffix,
            endpoint(fn, sig),
            methods=[method],
            response_model=model,
            response_model_exclude_none=True,
            operation_id=operation_id(name, collection or self.path, method.lower()),
            tags=[self.tag],
            summary=summary,
        )
