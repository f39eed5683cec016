"""Policies: list, create, edit (errors beside the field, etag conflicts as a diff),
delete, and the live "has my change reached the proxies?" panel.

One set of handlers serves the three kinds of :mod:`mgmt_api.console.policy_kinds`,
under a cluster (rate limits) or a security group (security settings, JWT
policies). The status panel polls ``…/status?since=DIGEST`` every two
seconds; the answer is 204 (nothing to swap) until what it shows changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response
from fastapi.responses import RedirectResponse

from mgmt_api.console import conflict, forms, mesh
from mgmt_api.console.api import ApiCallError
from mgmt_api.console.policy_kinds import POLICY_PAGES, TEMPLATES, PolicyKind, editable
from mgmt_api.console.status import (
    Verdict,
    cluster_verdict,
    digest,
    group_verdict,
    traffic_verdict,
)
from mgmt_api.console.web import ConsoleRoute, User, signed_in

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
Me = Annotated[User, Depends(signed_in)]
Name = Annotated[str, Path(max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
PolicyName = Annotated[str, Path(max_length=63, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]
Since = Annotated[str, Query(max_length=64)]
CLUSTER_UI = "/ui/o/{org}/c/{cluster}"
GROUP_UI = "/ui/o/{org}/t/{tenant}/w/{workspace}/g/{group}"


@dataclass(frozen=True)
class Parent:
    api: str  # /v2/... of the parent object
    ui: str  # /ui/... of its page
    label: str
    kind: str  # "cluster" | "group"
    org: str
    # Its place below the organization, as navigation.trail takes it.
    place: Mapping[str, str]


def cluster_parent(org: Name, cluster: Name) -> Parent:
    return Parent(
        f"/v2/organizations/{org}/clusters/{cluster}",
        f"/ui/o/{org}/c/{cluster}",
        f"cluster {cluster}",
        "cluster",
        org,
        {"cluster": cluster},
    )


def group_parent(org: Name, tenant: Name, workspace: Name, group: Name) -> Parent:
    api = f"/v2/organizations/{org}/tenants/{tenant}/workspaces/{workspace}/securitygroups/{group}"
    ui = f"/ui/o/{org}/t/{tenant}/w/{workspace}/g/{group}"
    place = {"tenant": tenant, "workspace": workspace, "group": group}
    return Parent(api, ui, f"security group {group}", "group", org, place)


ClusterParent = Annotated[Parent, Depends(cluster_parent)]
GroupParent = Annotated[Parent, Depends(group_parent)]


def _kind(parent: Parent, slug: str) -> PolicyKind:
    kind = POLICY_PAGES.get(slug)
    if kind is None or kind.parent != parent.kind:
        raise HTTPException(404)
    return kind


# ---- status ------------------------------------------------------------------------------


async def policy_verdict(me: User, kind: PolicyKind, path: str) -> Verdict | None:
    try:
        status = await me.api.get(path + "/status")
    except ApiCallError as exc:
        if exc.status == 400:  # distribution off on this server
            return None
        raise
    return traffic_verdict(status) if kind.slug == "traffic" else group_verdict(status)


def status_fragment(me: User, verdict: Verdict | None, url: str, since: str) -> Response:
    if verdict is None:
        return Response(status_code=204)
    current = digest(verdict)
    if since == current:
        return Response(status_code=204)
    return me.render("status_panel.html", verdict=verdict, status_url=url, status_digest=current)


@router.get(CLUSTER_UI + "/status")
async def cluster_status(me: Me, parent: ClusterParent, since: Since = "") -> Response:
    status = await me.api.get(parent.api + "/status")
    return status_fragment(me, cluster_verdict(status), parent.ui + "/status", since)


async def _policy_status(me: User, parent: Parent, slug: str, name: str, since: str) -> Response:
    kind = _kind(parent, slug)
    path = f"{parent.api}/{kind.collection}/{name}"
    url = f"{parent.ui}/{slug}/{name}/status"
    return status_fragment(me, await policy_verdict(me, kind, path), url, since)


@router.get(CLUSTER_UI + "/{slug}/{name}/status")
async def cluster_policy_status(
    me: Me, parent: ClusterParent, slug: str, name: PolicyName, since: Since = ""
) -> Response:
    return await _policy_status(me, parent, slug, name, since)


@router.get(GROUP_UI + "/{slug}/{name}/status")
async def group_policy_status(
    me: Me, parent: GroupParent, slug: str, name: PolicyName, since: Since = ""
) -> Response:
    return await _policy_status(me, parent, slug, name, since)


# ---- the security group page (its settings and JWT policies) ------------------------------


@router.get(GROUP_UI)
async def group_page(me: Me, parent: GroupParent) -> Response:
    obj = await me.api.get(parent.api)
    perms = await me.api.permissions(parent.api)
    lists = {}
    for slug in ("settings", "jwt"):
        kind = POLICY_PAGES[slug]
        body = await me.api.get(f"{parent.api}/{kind.collection}", pageSize="200")
        lists[slug] = body.get(kind.list_field, [])
    return me.render(
        "group.html", parent=parent, obj=obj, perms=perms, lists=lists, kinds=POLICY_PAGES
    )


# ---- form pages --------------------------------------------------------------------------


def _form_state(
    kind: PolicyKind, obj: Mapping[str, Any] | None, values: Mapping[str, str] | None = None
) -> forms.FormState:
    fields = kind.fields(obj)
    return forms.FormState(
        fields, dict(values) if values is not None else forms.from_object(fields, obj or {})
    )


async def _editor(
    me: User,
    parent: Parent,
    kind: PolicyKind,
    *,
    name: str,
    obj: Mapping[str, Any] | None,
    state: forms.FormState,
    status_code: int = 200,
    conflict_with: Mapping[str, Any] | None = None,
    diff: list[conflict.DiffLine] | None = None,
    saved: bool = False,
) -> Response:
    path = f"{parent.api}/{kind.collection}/{name}" if obj else ""
    perms = await me.api.permissions(path if obj else parent.api)
    verdict = await policy_verdict(me, kind, path) if obj else None
    return me.render(
        "policy.html",
        status_code,
        parent=parent,
        kind=kind,
        name=name,
        obj=obj,
        form=state,
        perms=perms,
        verdict=verdict,
        status_url=f"{parent.ui}/{kind.slug}/{name}/status",
        status_digest=digest(verdict) if verdict else "",
        conflict_with=conflict_with,
        diff=diff or [],
        saved=saved,
        local_rules=mesh.local_rules(obj) if kind.slug == "settings" else [],
        local_keys=mesh.local_keys(obj) if kind.slug == "settings" else "",
    )


async def _new(me: User, parent: Parent, slug: str) -> Response:
    kind = _kind(parent, slug)
    await me.api.get(parent.api)
    template = TEMPLATES[slug]
    return await _editor(me, parent, kind, name="", obj=None, state=_form_state(kind, template))


@router.get(CLUSTER_UI + "/{slug}/new")
async def cluster_new(me: Me, parent: ClusterParent, slug: str) -> Response:
    return await _new(me, parent, slug)


@router.get(GROUP_UI + "/{slug}/new")
async def group_new(me: Me, parent: GroupParent, slug: str) -> Response:
    return await _new(me, parent, slug)


def _api_errors(state: forms.FormState, error: ApiCallError, kind: PolicyKind) -> None:
    """An API 400 placed beside the input it names, or above the form."""
    names = [f.name for f in state.fields]
    if error.field:
        relative = forms.relative_field(error.field, kind.body_field)
        target = forms.place_error(relative, names)
        message = forms.error_message(error.message, error.field)
        if target is not None:
            state.errors[target] = message if relative == target else f"{relative}: {message}"
            return
    state.general.append(error.message)


async def _create(me: User, parent: Parent, slug: str) -> Response:
    kind = _kind(parent, slug)
    form = me.form
    name = form.get("name", "").strip()
    state = _form_state(kind, TEMPLATES[slug], form)
    body, local = forms.to_body(state.fields, form, None)
    state.errors.update(local)
    if not name:
        state.errors["name"] = "a name is required"
    if not state.errors:
        try:
            await me.api.call(
                "POST",
                f"{parent.api}/{kind.collection}",
                body={"name": name, kind.body_field: forms.prune(body)},
            )
        except ApiCallError as exc:
            if exc.status not in (400, 409):
                raise
            if exc.field == "name" or exc.status == 409:
                state.errors["name"] = exc.message
            else:
                _api_errors(state, exc, kind)
        else:
            return RedirectResponse(f"{parent.ui}/{slug}/{name}?saved=1", status_code=303)
    state.values["name"] = name
    return await _editor(me, parent, kind, name="", obj=None, state=state, status_code=400)


@router.post(CLUSTER_UI + "/{slug}")
async def cluster_create(me: Me, parent: ClusterParent, slug: str) -> Response:
    return await _create(me, parent, slug)


@router.post(GROUP_UI + "/{slug}")
async def group_create(me: Me, parent: GroupParent, slug: str) -> Response:
    return await _create(me, parent, slug)


async def _view(me: User, parent: Parent, slug: str, name: str, saved: str) -> Response:
    kind = _kind(parent, slug)
    obj = await me.api.get(f"{parent.api}/{kind.collection}/{name}")
    return await _editor(
        me, parent, kind, name=name, obj=obj, state=_form_state(kind, obj), saved=bool(saved)
    )


@router.get(CLUSTER_UI + "/{slug}/{name}")
async def cluster_view(
    me: Me, parent: ClusterParent, slug: str, name: PolicyName, saved: str = ""
) -> Response:
    return await _view(me, parent, slug, name, saved)


@router.get(GROUP_UI + "/{slug}/{name}")
async def group_view(
    me: Me, parent: GroupParent, slug: str, name: PolicyName, saved: str = ""
) -> Response:
    return await _view(me, parent, slug, name, saved)


async def _update(me: User, parent: Parent, slug: str, name: str) -> Response:
    kind = _kind(parent, slug)
    path = f"{parent.api}/{kind.collection}/{name}"
    form = me.form
    current = await me.api.get(path)
    # The form's fields over the object as read; the etag is the one the form was
    # rendered with (or, after a conflict, the one the user chose to overwrite).
    etag = form.get("_overwrite_etag") or form.get("etag", "")
    state = _form_state(kind, current, form)
    body, local = forms.to_body(state.fields, form, editable(current))
    state.errors.update(local)
    body = forms.prune(body)
    if not state.errors:
        try:
            await me.api.call("PUT", path, body={**body, "etag": etag})
        except ApiCallError as exc:
            if exc.status == 409 and exc.reason == "ABORTED":
                mine = {**editable(current), **body}
                return await _editor(
                    me,
                    parent,
                    kind,
                    name=name,
                    obj={**current, "etag": etag},
                    state=state,
                    status_code=409,
                    conflict_with=current,
                    diff=conflict.diff(current, mine),
                )
            if exc.status != 400:
                raise
            _api_errors(state, exc, kind)
        else:
            return RedirectResponse(f"{parent.ui}/{slug}/{name}?saved=1", status_code=303)
    return await _editor(
        me, parent, kind, name=name, obj={**current, "etag": etag}, state=state, status_code=400
    )


@router.post(CLUSTER_UI + "/{slug}/{name}")
async def cluster_update(me: Me, parent: ClusterParent, slug: str, name: PolicyName) -> Response:
    return await _update(me, parent, slug, name)


@router.post(GROUP_UI + "/{slug}/{name}")
async def group_update(me: Me, parent: GroupParent, slug: str, name: PolicyName) -> Response:
    return await _update(me, parent, slug, name)


async def _delete(me: User, parent: Parent, slug: str, name: str) -> Response:
    kind = _kind(parent, slug)
    await me.api.call("DELETE", f"{parent.api}/{kind.collection}/{name}")
    return RedirectResponse(parent.ui, status_code=303)


@router.post(CLUSTER_UI + "/{slug}/{name}/delete")
async def cluster_delete(me: Me, parent: ClusterParent, slug: str, name: PolicyName) -> Response:
    return await _delete(me, parent, slug, name)


@router.post(GROUP_UI + "/{slug}/{name}/delete")
async def group_delete(me: Me, parent: GroupParent, slug: str, name: PolicyName) -> Response:
    return await _delete(me, parent, slug, name)
