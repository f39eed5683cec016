"""Proxy diagnostics of a cluster (``/ui/o/{org}/c/{cluster}/diagnostics``).

The page asks ``…/proxytools`` with the signed-in user's token, so the
answers are what the API gives that user: redacted by the agent, limited by
the API's caps, refused without READ (WRITE to set levels).
"""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import RedirectResponse

from mgmt_api.console import diagnostics
from mgmt_api.console.api import ApiCallError
from mgmt_api.console.tree_pages import Name
from mgmt_api.console.web import ConsoleRoute, User, signed_in

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
Me = Annotated[User, Depends(signed_in)]
View = Annotated[str, Query(max_length=16)]
PAGE = "/ui/o/{org}/c/{cluster}/diagnostics"


def _query(request: Request) -> dict[str, str]:
    return {k: v[: diagnostics.MAX_FIELD] for k, v in request.query_params.items()}


@router.get(PAGE)
async def diagnostics_page(
    me: Me, request: Request, org: Name, cluster: Name, view: View = "stats"
) -> Response:
    base = f"/v2/organizations/{org}/clusters/{cluster}"
    await me.api.get(base)  # 404/403 as the cluster page would
    perms = await me.api.permissions(base)
    chosen = diagnostics.VIEWS.get(view, diagnostics.VIEWS["stats"])
    query = _query(request)
    body = diagnostics.request_body(chosen, query)
    answer: Any = None
    error = ""
    if body is not None:
        try:
            answer = await me.api.call("POST", f"{base}/proxytools/{chosen.endpoint}", body=body)
        except ApiCallError as exc:
            error = exc.message
    return me.render(
        "diagnostics.html",
        org=org,
        cluster=cluster,
        perms=perms,
        views=diagnostics.VIEWS,
        view=chosen,
        query=query,
        levels=diagnostics.LEVELS,
        answer=None if answer is None else json.dumps(answer, indent=2),
        error=error,
    )


@router.post(PAGE + "/loggers")
async def set_levels(me: Me, org: Name, cluster: Name) -> Response:
    """A write (POST with CSRF): the API needs WRITE on the cluster and audits it."""
    base = f"/v2/organizations/{org}/clusters/{cluster}"
    body = diagnostics.set_levels_body(me.form)
    back = f"/ui/o/{org}/c/{cluster}/diagnostics?view=loggers"
    if body is None:
        return RedirectResponse(back, status_code=303)
    await me.api.call("PUT", f"{base}/proxytools/loggerlevels", body=body)
    selected: dict[str, str] = {
        k: str(body[k]) for k in ("namespace", "workload", "instance") if k in body
    }
    return RedirectResponse(f"{back}&{urlencode(selected)}", status_code=303)
