"""Where a page sits in the object tree, as breadcrumbs (pure).

One function builds every page's trail from the object's place (organization,
then cluster, or tenant → workspace → security group), so no page can skip a
level: before it, the policy pages of a security group went from the
organization straight to the group.
"""

from __future__ import annotations

Crumb = tuple[str, str]  # (label, href); an empty href is the current page


def trail(
    org: str,
    *,
    cluster: str | None = None,
    tenant: str | None = None,
    workspace: str | None = None,
    group: str | None = None,
    here: str | None = None,
) -> list[Crumb]:
    """Organizations → org → (cluster | tenant → workspace → group), then ``here``.

    Every level is a link; the deepest one is the current page (no link)
    unless ``here`` names a page below it (a section, a policy, "new").
    """
    base = f"/ui/o/{org}"
    items: list[Crumb] = [("Organizations", "/ui/"), (org, base)]
    if cluster is not None:
        items.append((f"cluster {cluster}", f"{base}/c/{cluster}"))
    levels = (
        ("tenant", tenant, "t"),
        ("workspace", workspace, "w"),
        ("security group", group, "g"),
    )
    path = base
    for what, name, segment in levels:
        if name is None:
            break
        path = f"{path}/{segment}/{name}"
        items.append((f"{what} {name}", path))
    if here is None:
        label, _href = items[-1]
        items[-1] = (label, "")
    else:
        items.append((here, ""))
    return items
