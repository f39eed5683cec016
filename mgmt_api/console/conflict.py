"""An etag conflict shown as a diff: what changed since you opened the page (pure).

``PUT`` with a stale etag is a 409 ABORTED. The console never retries it
with the new etag on its own: it shows the object as it is now next to what
you tried to save, as a unified diff of their YAML, and lets you either
reload (take theirs) or save yours over theirs knowingly.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from mgmt_api.console.policy_kinds import editable

LineKind = Literal["add", "del", "ctx", "hunk"]


@dataclass(frozen=True)
class DiffLine:
    kind: LineKind
    text: str


def as_yaml(obj: Mapping[str, Any]) -> str:
    return yaml.safe_dump(editable(obj), sort_keys=True, default_flow_style=False)


def diff(theirs: Mapping[str, Any], yours: Mapping[str, Any]) -> list[DiffLine]:
    """``-`` lines are the current version's, ``+`` lines yours."""
    out: list[DiffLine] = []
    lines = difflib.unified_diff(
        as_yaml(theirs).splitlines(),
        as_yaml(yours).splitlines(),
        "current",
        "yours",
        n=3,
        lineterm="",
    )
    for line in list(lines)[2:]:  # the ---/+++ headers
        if line.startswith("@@"):
            out.append(DiffLine("hunk", line))
        elif line.startswith("+"):
            out.append(DiffLine("add", line))
        elif line.startswith("-"):
            out.append(DiffLine("del", line))
        else:
            out.append(DiffLine("ctx", line))
    return out
