"""Approvals inbox (organization and cluster), audit log with filters, dashboards.

Approvals: requests waiting (approve as asked, approve with changed
permissions, or delete) and approvals granted (revoke), plus the policy's
mode. Each action is one ``/v2/.../approvals/...`` call with the user's
token; the API's permissions decide (and the UI hides) who may do what.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Response
from fastapi.responses import RedirectResponse

from meshplane.kinds_contract import Kind
from mgmt_api.console.api import ApiCallError
from mgmt_api.console.web import ConsoleRoute, User, signed_in

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
Me = Annotated[User, Depends(signed_in)]
Name = Annotated[str, Path(max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
Filter = Annotated[str, Query(max_length=512)]
MODES = ("UNRESTRICTED", "ALLOW_REQUESTED", "REQUIRE_APPROVAL")


def _target(org: str, cluster: str | None) -> tuple[str, str, str]:
    """(API path, console path, label) of the resource whose approvals these are."""
    if cluster:
        return (
            f"/v2/organizations/{org}/clusters/{cluster}",
            f"/ui/o/{org}/c/{cluster}/approvals",
            f"cluster {cluster}",
        )
    return f"/v2/organizations/{org}", f"/ui/o/{org}/approvals", f"organization {org}"


async def _inbox(
    me: User, org: str, cluster: str | None, *, status_code: int = 200, error: str = ""
) -> Response:
    api, ui, label = _target(org, cluster)
    await me.api.get(api)
    policy: dict[str, Any] | None
    try:
        policy = await me.api.get(api + "/approvals")
    except ApiCallError as exc:
        if exc.status != 404:
            raise
        policy = None
    # Which actions to show: the approval operations' own kinds (docs/api.md, "Approvals").
    kinds = {
        "request": "ApprovalAccessRequest",
        "approved": "ApprovalApprovedAccess",
        "policy": Kind.APPROVAL_POLICY,
    }
    perms = await me.api.permissions(api)
    return me.render(
        "approvals.html",
        status_code,
        org=org,
        cluster=cluster,
        label=label,
        ui=ui,
        policy=policy,
        perms=perms,
        kinds=kinds,
        modes=MODES,
        error=error,
    )


@router.get("/ui/o/{org}/approvals")
async def org_approvals(me: Me, org: Name) -> Response:
    return await _inbox(me, org, None)


@router.get("/ui/o/{org}/c/{cluster}/approvals")
async def cluster_approvals(me: Me, org: Name, cluster: Name) -> Response:
    return await _inbox(me, org, cluster)


def _permissions(text: str) -> list[str]:
    return [p.strip() for p in text.replace("\n", ",").split(",") if p.strip()]


async def _act(me: User, org: str, cluster: str | None, action: str) -> Response:
    api, ui, _ = _target(org, cluster)
    form = me.form
    subject = form.get("subject", "").strip()
    try:
        if action == "approve":
            access = {"subject": subject, "permissions": _permissions(form.get("permissions", ""))}
            await me.api.call("POST", api + "/approvals/requested:approve", body={"access": access})
        elif action == "reject":
            await me.api.call(
                "POST", api + "/approvals/requested:delete", body={"subject": subject}
            )
        elif action == "revoke":
            await me.api.call("POST", api + "/approvals/approved:delete", body={"subject": subject})
        elif action == "request":
            access = {"subject": subject, "permissions": _permissions(form.get("permissions", ""))}
            await me.api.call("POST", api + "/approvals/requested:add", body={"access": access})
        elif action == "policy":
            # SetPolicy sets the mode (and metadata) only; the lists have their own calls.
            body: dict[str, str] = {"mode": form.get("mode", "")}
            if form.get("etag"):
                body["etag"] = form["etag"]
            await me.api.call("POST", api + "/approvals", body=body)
        else:
            return Response(status_code=404)
    except ApiCallError as exc:
        if exc.status in (400, 404, 409):
            return await _inbox(me, org, cluster, status_code=exc.status, error=exc.message)
        raise
    return RedirectResponse(ui, status_code=303)


@router.post("/ui/o/{org}/approvals/{action}")
async def org_act(me: Me, org: Name, action: Name) -> Response:
    return await _act(me, org, None, action)


@router.post("/ui/o/{org}/c/{cluster}/approvals/{action}")
async def cluster_act(me: Me, org: Name, cluster: Name, action: Name) -> Response:
    return await _act(me, org, cluster, action)


@router.get("/ui/o/{org}/audit")
async def audit(  # noqa: PLR0917 - one parameter per filter
    me: Me,
    org: Name,
    kind: Filter = "",
    operation: Filter = "",
    actor: Filter = "",
    fqn: Filter = "",
    page: Annotated[str, Query(max_length=32)] = "",
) -> Response:
    filters = {"kind": kind, "operation": operation, "triggeredBy": actor, "fqnPrefix": fqn}
    error = ""
    try:
        body = await me.api.get(
            f"/v2/organizations/{org}/auditlogs", pageSize="50", pageToken=page, **filters
        )
    except ApiCallError as exc:
        if exc.status != 400:
            raise
        body, error = {"auditLogs": [], "nextPageToken": ""}, exc.message
    return me.render(
        "audit.html",
        org=org,
        records=body.get("auditLogs", []),
        next_page=body.get("nextPageToken", ""),
        filters={"kind": kind, "operation": operation, "actor": actor, "fqn": fqn},
        page=page,
        error=error,
    )


@router.get("/ui/dashboards")
async def dashboards(me: Me) -> Response:
    body = await me.api.get("/v2/dashboards")
    return me.render("dashboards.html", dashboards=body.get("dashboards", []))


@router.get("/ui/dashboards/{name}")
async def download(me: Me, name: Name) -> Response:
    response = await me.api.raw(f"/v2/dashboards/{name}")
    return Response(
        response.body,
        media_type="application/json",
        headers={"Content-Disposition": f'attachment; filename="{name}.json"'},
    )
