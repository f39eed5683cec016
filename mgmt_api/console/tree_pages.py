"""The organization tree: organizations, tenants, workspaces, security groups, clusters.

Lists are pages of the API's keyset paging (``pageSize``, ``pageToken``) and
its name search (``nameContains``): a page of 50 clusters costs the same
with 50 or 5,000 in the organization. The UI shows an action only when
``…/permissions`` says the user holds what it needs; the API enforces it
either way.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Response
from fastapi.responses import RedirectResponse

from meshplane.kinds_contract import SHAPES, Kind
from mgmt_api.console import traffic
from mgmt_api.console.api import ApiCallError
from mgmt_api.console.policy_kinds import POLICY_PAGES
from mgmt_api.console.redact import redact_secrets
from mgmt_api.console.status import cluster_verdict, digest
from mgmt_api.console.web import ConsoleRoute, User, signed_in

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
Me = Annotated[User, Depends(signed_in)]
Name = Annotated[str, Path(max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
Search = Annotated[str, Query(alias="q", max_length=63)]
Token = Annotated[str, Query(alias="page", max_length=2048)]
PAGE_SIZE = "50"


def _search_term(text: str) -> str:
    """What the API's name search accepts (names are lower-case)."""
    return "".join(c for c in text.lower() if c.isalnum() or c in "-.")


@router.get("/ui/")
async def organizations(me: Me) -> Response:
    listing = await me.api.get("/v2/organizations", pageSize="200")
    may_create = True
    try:
        await me.api.get("/v2/admin/root/policy")
    except ApiCallError:
        may_create = False  # only root administrators create organizations
    return me.render(
        "organizations.html", orgs=listing.get("organizations", []), may_create=may_create
    )


@router.post("/ui/organizations")
async def create_organization(me: Me) -> Response:
    form = me.form
    name = form.get("name", "").strip()
    body = {
        "name": name,
        "organization": {"displayName": form.get("displayName", "").strip() or None},
    }
    try:
        await me.api.call("POST", "/v2/organizations", body=_drop_none(body))
    except ApiCallError as exc:
        if exc.status in (400, 409):
            listing = await me.api.get("/v2/organizations", pageSize="200")
            return me.render(
                "organizations.html",
                400,
                orgs=listing.get("organizations", []),
                may_create=True,
                create_error=exc.message,
                form=form,
            )
        raise
    return RedirectResponse(f"/ui/o/{name}", status_code=303)


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    return value


@router.get("/ui/o/{org}")
async def organization(me: Me, org: Name, q: Search = "", page: Token = "") -> Response:
    base = f"/v2/organizations/{org}"
    found = await me.api.get(base)
    term = _search_term(q)
    clusters = await me.api.get(
        f"{base}/clusters", pageSize=PAGE_SIZE, pageToken=page, nameContains=term
    )
    tenants = await me.api.get(f"{base}/tenants", pageSize="200")
    perms = await me.api.permissions(base)
    return me.render(
        "organization.html",
        org=org,
        obj=found,
        clusters=clusters.get("clusters", []),
        next_page=clusters.get("nextPageToken", ""),
        page=page,
        q=q,
        tenants=tenants.get("tenants", []),
        perms=perms,
    )


@router.post("/ui/o/{org}/clusters")
async def create_cluster(me: Me, org: Name) -> Response:
    form = me.form
    name = form.get("name", "").strip()
    cluster: dict[str, Any] = {}
    for key in ("displayName", "network", "description"):
        if form.get(key, "").strip():
            cluster[key] = form[key].strip()
    try:
        created = await me.api.call(
            "POST", f"/v2/organizations/{org}/clusters", body={"name": name, "cluster": cluster}
        )
    except ApiCallError as exc:
        if exc.status in (400, 409):
            return me.render("cluster_new.html", 400, org=org, error=exc.message, form=form)
        raise
    return me.render(
        "install_template.html",
        org=org,
        cluster=name,
        template=json.dumps(redact_secrets(created.get("installTemplate") or {}), indent=2),
    )


@router.get("/ui/o/{org}/clusters/new")
async def new_cluster(me: Me, org: Name) -> Response:
    await me.api.get(f"/v2/organizations/{org}")
    return me.render("cluster_new.html", org=org, error="", form={})


@router.get("/ui/o/{org}/c/{cluster}")
async def cluster_page(me: Me, org: Name, cluster: Name) -> Response:
    return await _render_cluster(me, org, cluster)


async def _render_cluster(
    me: User, org: str, cluster: str, status_code: int = 200, delete_error: str = ""
) -> Response:
    base = f"/v2/organizations/{org}/clusters/{cluster}"
    obj = await me.api.get(base)
    perms = await me.api.permissions(base)
    org_perms = await me.api.permissions(f"/v2/organizations/{org}")
    traffic_kind = POLICY_PAGES["traffic"]
    policies = await me.api.get(f"{base}/{traffic_kind.collection}", pageSize="200")
    route, backend = SHAPES[Kind.HTTP_ROUTE], SHAPES[Kind.BACKEND]
    routes = await me.api.get(f"{base}/{route.collection}", pageSize="200")
    backends = await me.api.get(f"{base}/{backend.collection}", pageSize="200")
    onboarding: dict[str, Any] | None
    try:
        onboarding = await me.api.get(f"{base}/onboarding/status")
    except ApiCallError as exc:
        if exc.status != 403:
            raise
        onboarding = None
    status = await _status_or_none(me, f"{base}/status")
    verdict = None if status is None else cluster_verdict(status)
    # The effective trust domain and the mesh namespaces: the server's one view.
    mesh: dict[str, Any] = await me.api.get(f"{base}/workloads")
    return me.render(
        "cluster.html",
        status_code,
        org=org,
        cluster=cluster,
        obj=obj,
        perms=perms,
        org_perms=org_perms,
        policies=policies.get(traffic_kind.list_field, []),
        routes=routes.get(route.list_field, []),
        backends=backends.get(backend.list_field, []),
        route_summary=traffic.route_summary,
        backend_summary=traffic.backend_summary,
        onboarding=onboarding,
        mesh=mesh,
        verdict=verdict,
        status_digest=digest(verdict) if verdict else "",
        status_url=f"/ui/o/{org}/c/{cluster}/status",
        delete_error=delete_error,
        kinds=POLICY_PAGES,
    )


async def _status_or_none(me: User, path: str) -> dict[str, Any] | None:
    """The distribution status, or None when this server runs without distribution."""
    try:
        status: dict[str, Any] = await me.api.get(path)
    except ApiCallError as exc:
        if exc.status == 400:
            return None
        raise
    return status


@router.post("/ui/o/{org}/c/{cluster}/install-template")
async def install_template(me: Me, org: Name, cluster: Name) -> Response:
    """A new key pair for the cluster's agent, as a download (a write: a POST with CSRF).

    Needs SET_POLICY on the organization, which the API checks."""
    obj = await me.api.get(
        f"/v2/organizations/{org}/clusters/{cluster}", includeInstallTemplate="true"
    )
    return Response(
        json.dumps(obj.get("installTemplate") or {}, indent=2),
        media_type="application/json",
        headers={"Content-Disposition": f'attachment; filename="{cluster}-install-template.json"'},
    )


@router.post("/ui/o/{org}/c/{cluster}/protection")
async def protection(me: Me, org: Name, cluster: Name) -> Response:
    path = f"/v2/organizations/{org}/clusters/{cluster}"
    obj = await me.api.get(path)
    obj["deletionProtectionEnabled"] = me.form.get("enabled") == "true"
    obj["etag"] = me.form.get("etag", "")
    await me.api.call("PUT", path, body=obj)
    return RedirectResponse(f"/ui/o/{org}/c/{cluster}", status_code=303)


@router.post("/ui/o/{org}/c/{cluster}/delete")
async def delete_cluster(me: Me, org: Name, cluster: Name) -> Response:
    path = f"/v2/organizations/{org}/clusters/{cluster}"
    if me.form.get("confirm", "") != cluster:
        return await _render_cluster(
            me, org, cluster, 400, "Type the cluster's name to confirm the delete."
        )
    try:
        await me.api.call("DELETE", path)
    except ApiCallError as exc:
        if exc.status == 400:  # deletion protection
            return await _render_cluster(
                me, org, cluster, 400, f"{exc.message}. Turn deletion protection off first."
            )
        raise
    return RedirectResponse(f"/ui/o/{org}", status_code=303)


@router.get("/ui/o/{org}/t/{tenant}")
async def tenant(me: Me, org: Name, tenant: Name) -> Response:
    base = f"/v2/organizations/{org}/tenants/{tenant}"
    obj = await me.api.get(base)
    workspaces = await me.api.get(f"{base}/workspaces", pageSize="200")
    return me.render(
        "tenant.html", org=org, tenant=tenant, obj=obj, workspaces=workspaces.get("workspaces", [])
    )


@router.get("/ui/o/{org}/t/{tenant}/w/{workspace}")
async def workspace(me: Me, org: Name, tenant: Name, workspace: Name) -> Response:
    base = f"/v2/organizations/{org}/tenants/{tenant}/workspaces/{workspace}"
    obj = await me.api.get(base)
    groups = await me.api.get(f"{base}/securitygroups", pageSize="200")
    return me.render(
        "workspace.html",
        org=org,
        tenant=tenant,
        workspace=workspace,
        obj=obj,
        groups=groups.get("securityGroups", []),
    )
