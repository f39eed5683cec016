"""Resource operations behind get, apply, delete and edit.

Kept apart from the CLI wiring so each operation is one function of an
``ApiClient`` and parsed input; errors are refined here with the hint that
names the exact ``meshctl`` command to run next.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from meshctl.client import ApiClient
from meshctl.errors import ApiFailure, Exit, MeshctlError
from meshctl.kinds import Kind, Ref, child_kinds, collection_path, policy_path
from meshctl.manifest import Manifest, desired_body
from meshplane.kinds_contract import Kind as KindName

MAX_PAGE_SIZE = 1000


def get_hint(ref: Ref) -> str:
    return f"meshctl get {ref.kind.name.lower()} {ref.fqn}"


def list_hint(ref: Ref) -> str:
    """The ``meshctl get`` that lists the siblings of ``ref``."""
    flags = "".join(f" {k.flag} {n}" for k, n in ref.parents)
    return f"meshctl get {ref.kind.list_field.lower()}{flags}"


def refine(failure: ApiFailure, ref: Ref | None, *, manifest_etag: bool = False) -> ApiFailure:
    """A command-specific next step for the failures where the generic one is vague."""
    what = get_hint(ref) if ref is not None else "meshctl get policy TARGET"
    if failure.code_name == "ABORTED":
        if manifest_etag:
            return failure.with_hint(
                "the object changed since the etag in your file was read; run "
                f"{what} -o yaml, merge your change and apply again (or drop metadata.etag)"
            )
        return failure.with_hint(f"the object changed since you read it; run {what} and retry")
    if failure.code_name == "NOT_FOUND" and ref is not None:
        return failure.with_hint(f"list what exists with {list_hint(ref)}")
    if failure.code_name == "ALREADY_EXISTS" and ref is not None:
        return failure.with_hint("it exists already; use meshctl apply -f to update it")
    return failure


def get_object(client: ApiClient, ref: Ref, params: dict[str, str] | None = None) -> dict[str, Any]:
    try:
        body: dict[str, Any] = client.get(ref.path, params)
    except ApiFailure as exc:
        raise refine(exc, ref) from None
    return body


def list_objects(
    client: ApiClient,
    kind: Kind,
    parents: tuple[tuple[Kind, str], ...],
    *,
    label_selector: str = "",
    limit: int | None = None,
    extra: dict[str, str] | None = None,
    page_size: int = MAX_PAGE_SIZE,
) -> Iterator[dict[str, Any]]:
    """Every object of the collection, following ``nextPageToken`` until it is empty."""
    path = collection_path(kind, parents)
    token = ""
    seen = 0
    while True:
        params = {"pageSize": str(min(limit - seen, page_size) if limit else page_size)}
        if token:
            params["pageToken"] = token
        if label_selector:
            params["labelSelector"] = label_selector
        params.update(extra or {})
        page = client.get(path, params)
        items = page.get(kind.list_field) if isinstance(page, dict) else None
        for item in items or []:
            if isinstance(item, dict):
                yield item
                seen += 1
                if limit and seen >= limit:
                    return
        token = page.get("nextPageToken", "") if isinstance(page, dict) else ""
        if not token:
            return


@dataclass(frozen=True, slots=True)
class ApplyResult:
    manifest: Manifest
    action: str  # created | configured | unchanged
    obj: dict[str, Any]


def apply_manifest(client: ApiClient, m: Manifest) -> ApplyResult:
    """Create the object if absent, else replace it with a PUT carrying the etag.

    Without ``metadata.etag`` the current etag is read just before the PUT
    (last writer wins only within that short window, and a race in it is
    still refused with ABORTED). With ``metadata.etag`` the file's etag is
    sent, so a change made since the file was produced is never overwritten.
    """
    if m.ref is None:
        return _apply_policy(client, m)
    ref = m.ref
    body = desired_body(ref.kind, m.spec)
    try:
        current: dict[str, Any] | None = client.get(ref.path)
    except ApiFailure as exc:
        if exc.code_name != "NOT_FOUND":
            raise refine(exc, ref) from None
        current = None
    if current is None:
        if m.etag is not None:
            raise MeshctlError(
                f"{ref.fqn} does not exist, but the manifest carries metadata.etag, so it was "
                "read from an object deleted since; remove metadata.etag to create it anew",
                Exit.CONFLICT,
            )
        try:
            created = client.post(
                ref.collection_path, {"name": ref.name, ref.kind.body_field: body}
            )
        except ApiFailure as exc:
            raise refine(exc, ref) from None
        return ApplyResult(m, "created", created)
    if m.etag is None and desired_body(ref.kind, current) == {**dict(ref.kind.defaults), **body}:
        return ApplyResult(m, "unchanged", current)
    etag = m.etag if m.etag is not None else current.get("etag")
    try:
        updated = client.put(ref.path, {**body, "etag": etag})
    except ApiFailure as exc:
        raise refine(exc, ref, manifest_etag=m.etag is not None) from None
    return ApplyResult(m, "configured", updated)


def _policy_state(policy: dict[str, Any]) -> dict[str, Any]:
    """A policy without bookkeeping, with the API's default of no bindings."""
    return {"allow": [], **{k: v for k, v in policy.items() if k not in {"fqn", "etag"}}}


def _apply_policy(client: ApiClient, m: Manifest) -> ApplyResult:
    """Access policies always exist: apply is a GET for the etag and a PUT."""
    path = policy_path(m.policy_target or "root")
    body = _policy_state(m.spec)
    try:
        current: dict[str, Any] = client.get(path)
        if m.etag is None and _policy_state(current) == body:
            return ApplyResult(m, "unchanged", current)
        client.put(path, {**body, "etag": m.etag if m.etag is not None else current.get("etag")})
        return ApplyResult(m, "configured", client.get(path))
    except ApiFailure as exc:
        raise refine(exc, None, manifest_etag=m.etag is not None) from None


def empty_policy(client: ApiClient, target: str) -> str:
    """Undo an applied access policy: access policies always exist, so "deleting" one is
    emptying it (no bindings, no description), as a PUT may. ``emptied`` or ``unchanged``."""
    path = policy_path(target)
    try:
        current: dict[str, Any] = client.get(path)
        if not current.get("allow") and not current.get("description"):
            return "unchanged"
        client.put(path, {"allow": [], "description": "", "etag": current.get("etag")})
    except ApiFailure as exc:
        raise refine(exc, None) from None
    return "emptied"


def delete_object(client: ApiClient, ref: Ref, *, force: bool) -> None:
    try:
        client.delete(ref.path, {"force": "true"} if force else None)
    except ApiFailure as exc:
        raise refine(exc, ref) from None


#: Kinds whose delete always asks: they carry the live mesh (an organization's
#: clusters, a cluster's gateways, agents and sidecars), children or not.
ALWAYS_CONFIRMED = frozenset({KindName.ORGANIZATION.value, KindName.CLUSTER.value})


def needs_confirmation(client: ApiClient, ref: Ref) -> bool:
    """Whether deleting ``ref`` takes more than itself: an organization or a
    cluster always; another object when any of its child collections holds an
    object (one page of one item each). A child list that cannot be read
    counts as holding some; an object that is gone holds none."""
    if ref.kind.name in ALWAYS_CONFIRMED:
        return True
    below = (*ref.parents, (ref.kind, ref.name))
    for kind in child_kinds(ref):
        try:
            page = client.get(collection_path(kind, below), {"pageSize": "1"})
        except ApiFailure as exc:
            return exc.code_name != "NOT_FOUND"  # unreadable: assume it holds some
        if isinstance(page, dict) and page.get(kind.list_field):
            return True
    return False


def deletion_order(refs: Sequence[Ref]) -> list[Ref]:
    """Each object once, children before their parents (deepest first), the
    manifest's order otherwise: the order that undoes an ``apply -f``."""
    unique = list(dict.fromkeys(refs))
    return sorted(unique, key=lambda r: -len(r.parents))


def delete_all(client: ApiClient, refs: Sequence[Ref], *, force: bool) -> Iterator[tuple[Ref, str]]:
    """Delete ``refs`` in :func:`deletion_order`; yields each with ``deleted`` or ``gone``.

    An object the server no longer has while an ancestor of it is also in the
    list counts as gone, not as an error: the recursive delete of that
    ancestor removes it anyway (an earlier, interrupted ``delete -f`` may have
    taken it already). Any other failure stops, as a single delete would.
    """
    listed = {r.fqn for r in refs}
    for ref in deletion_order(refs):
        try:
            delete_object(client, ref, force=force)
        except ApiFailure as exc:
            ancestors = {ref.fqn.rsplit("/", 2 * i)[0] for i in range(1, len(ref.parents) + 1)}
            if exc.code_name == "NOT_FOUND" and ancestors & listed:
                yield ref, "gone"
                continue
            raise
        yield ref, "deleted"
