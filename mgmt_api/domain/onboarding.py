"""Cluster onboarding: desired versus current namespace states, and selector sync.

Pure functions over plain data; the service calls them inside its
transactions. Current states come from the agent's inventory reports:

- ``PENDING``: no report has arrived since the namespace's desired state was
  set, so the agent cannot have acted on it yet;
- ``ONBOARDED`` / ``OFFBOARDED``: a later report lists the namespace, in the
  desired state;
- ``NOT_FOUND_IN_CLUSTER``: a later report does not list it: the cluster
  has no such namespace.

``lastTransitionTime`` moves only when the current state changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

DESIRED_ONBOARDED = "DESIRED_ONBOARDED"
DESIRED_OFFBOARDED = "DESIRED_OFFBOARDED"
PENDING = "PENDING"
ONBOARDED = "ONBOARDED"
OFFBOARDED = "OFFBOARDED"
NOT_FOUND_IN_CLUSTER = "NOT_FOUND_IN_CLUSTER"

_REACHED = {DESIRED_ONBOARDED: ONBOARDED, DESIRED_OFFBOARDED: OFFBOARDED}


@dataclass(frozen=True, slots=True)
class Report:
    """What the cluster's latest inventory report says: namespaces seen, and when (µs)."""

    namespaces: frozenset[str]
    time_us: int


def onboarded(spec: Mapping[str, Any]) -> list[str]:
    """Names of the config's namespaces whose desired state is onboarded, sorted."""
    return sorted(
        ns["name"] for ns in spec.get("namespaces") or [] if ns["desiredState"] == DESIRED_ONBOARDED
    )


def sync_selector(names: Iterable[str], cluster: str, namespaces: Iterable[str]) -> list[str]:
    """The onboarding workspace's selector names with ``cluster``'s entries replaced.

    Entries of other clusters (and wildcard-cluster entries an admin added)
    are kept in place; ``cluster/ns`` for each onboarded namespace follows.
    """
    kept = [n for n in names if n.partition("/")[0] != cluster]
    return kept + [f"{cluster}/{ns}" for ns in sorted(set(namespaces))]


def statuses(
    spec: Mapping[str, Any],
    previous: Mapping[str, Mapping[str, Any]],
    report: Report | None,
    now_us: int,
) -> dict[str, dict[str, Any]]:
    """Per-namespace status of a config after a config write or a report.

    ``previous`` is the stored result of the last call (name -> status); a
    namespace keeps ``desiredSince`` while its desired state is unchanged, and
    ``lastTransitionTime`` while its current state is.
    """
    out: dict[str, dict[str, Any]] = {}
    for ns in spec.get("namespaces") or []:
        name, desired = ns["name"], ns["desiredState"]
        prev = previous.get(name) or {}
        since = prev["desiredSince"] if prev.get("desiredState") == desired else now_us
        if report is None or report.time_us < since:
            current = PENDING
        elif name in report.namespaces:
            current = _REACHED[desired]
        else:
            current = NOT_FOUND_IN_CLUSTER
        changed = prev.get("currentState") != current
        out[name] = {
            "desiredState": desired,
            "desiredSince": since,
            "currentState": current,
            "lastTransitionTime": now_us if changed else prev["lastTransitionTime"],
        }
    return out
