"""Proxy diagnostics of a cluster (``/ui/o/{org}/c/{cluster}/diagnostics``).

The page asks ``…/proxytools`` with the signed-in user's token, so the
answers are what the API gives that user: redacted by the agent, limited by
the API's caps, refused without READ (WRITE to set levels). The proxy is
picked from the cluster's known proxies (the agent's and the connected
sidecars, :func:`mgmt_api.console.mesh.proxies`); a sidecar whose
diagnostics the agent does not serve says so instead of a 404.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import RedirectResponse

from mgmt_api.console import diagnostics, mesh
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
    # 404/403 as the cluster page would; the agent's proxies are its reported workloads.
    obj = await me.api.get(base, fetchWorkloads="true")
    perms = await me.api.permissions(base)
    chosen = diagnostics.VIEWS.get(view, diagnostics.VIEWS["stats"])
    query = _query(request)
    choices = mesh.proxies(obj, await _workloads(me, base))
    picked = mesh.chosen(query.get("proxy", ""), choices)
    if picked is not None:
        query.update(namespace=picked.namespace, workload=picked.workload, instance=picked.instance)
    body = diagnostics.request_body(chosen, query) if picked is not None else None
    answer: Any = None
    error = ""
    if picked is not None and not picked.served:
        error = (
            f"The cluster's agent does not serve the diagnostics of sidecar "
            f"{picked.namespace}/{picked.workload} ({picked.instance}) yet: it is connected "
            "and configured (see Workloads), but no agent reaches its admin interface."
        )
        body = None
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
        answers=None if answer is None else diagnostics.readable(chosen, answer),
        error=error,
        choices=choices,
        picked=picked,
    )


async def _workloads(me: User, base: str) -> dict[str, Any] | None:
    """The cluster's sidecars (``.../workloads``), or None when they cannot be read."""
    try:
        view: dict[str, Any] = await me.api.get(f"{base}/workloads")
    except ApiCallError:
        return None
    return view


@router.post(PAGE + "/loggers")
async def set_levels(me: Me, org: Name, cluster: Name) -> Response:
    """A write (POST with CSRF): the API needs WRITE on the cluster and audits it."""
    base = f"/v2/organizations/{org}/clusters/{cluster}"
    body = diagnostics.set_levels_body(me.form)
    back = f"/ui/o/{org}/c/{cluster}/diagnostics?view=loggers"
    if body is None:
        return RedirectResponse(back, status_code=303)
    await me.api.call("PUT", f"{base}/proxytools/loggerlevels", body=body)
    proxy = me.form.get("proxy", "")[: diagnostics.MAX_FIELD]
    return RedirectResponse(f"{back}&{urlencode({'proxy': proxy})}", status_code=303)
