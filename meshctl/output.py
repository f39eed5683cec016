"""Rendering of objects for humans (table) and programs (YAML/JSON manifests)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from meshctl.errors import Exit, MeshctlError
from meshctl.kinds import Kind
from meshctl.manifest import dump, to_manifest

FORMATS = ("table", "yaml", "json")


def check_format(fmt: str, allowed: tuple[str, ...] = FORMATS) -> str:
    """``fmt`` when it is one of ``allowed`` (an ``--output`` value), else a usage error."""
    if fmt not in allowed:
        raise MeshctlError(f"--output must be one of {', '.join(allowed)}", Exit.USAGE)
    return fmt


def age(stamp: Any, now: datetime) -> str:
    """RFC 3339 time -> a short age like ``5m`` or ``3d`` (``-`` when unknown)."""
    if not isinstance(stamp, str):
        return "-"
    try:
        then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    seconds = max(0, int((now - then.astimezone(UTC)).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def table(rows: Sequence[Sequence[str]], headers: Sequence[str]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [list(headers), *rows]
    ]
    return "\n".join(lines) + "\n"


def object_table(kind: Kind, objects: Sequence[Mapping[str, Any]], now: datetime) -> str:
    """NAME, PARENT, DISPLAY NAME, AGE: enough to find an object and copy its FQN."""
    rows = []
    for obj in objects:
        fqn = str(obj.get("fqn", ""))
        parent, _, name = fqn.rpartition(f"{kind.collection}/")
        rows.append(
            [
                name or "-",
                parent.rstrip("/") or "-",
                str(obj.get("displayName") or ""),
                age(obj.get("createTime"), now),
            ]
        )
    if not rows:
        return f"No {kind.list_field} found.\n"
    return table(rows, ["NAME", "PARENT", "DISPLAY NAME", "AGE"])


def render_objects(
    kind: Kind, objects: Sequence[Mapping[str, Any]], fmt: str, *, as_list: bool
) -> str:
    if fmt == "table":
        return object_table(kind, objects, datetime.now(UTC))
    return dump([to_manifest(kind, o) for o in objects], fmt, as_list=as_list)
