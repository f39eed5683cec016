"""Cluster onboarding: desired versus current namespace states, and selector sync.

Pure functions over plain data; the service calls them inside its
transactions. Current states come from what the agent reports about each
namespace (see :func:`reported_onboarded`), never from the desired state:

- ``PENDING``: no report has arrived since the namespace's desired state was
  set, so the agent cannot have acted on it yet;
- ``ONBOARDED`` / ``OFFBOARDED``: a later report lists the namespace and
  says it is (or is not) onboarded, as desired;
- ``FAILED``: a later report lists the namespace in the other state than
  the desired one (``message`` says which): the agent did not apply it;
- ``NOT_FOUND_IN_CLUSTER``: a later report does not list it: the cluster
  has no such namespace.

``lastTransitionTime`` moves only when the current state changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

NamespaceDesiredState = Literal["DESIRED_ONBOARDED", "DESIRED_OFFBOARDED"]
DESIRED_ONBOARDED = "DESIRED_ONBOARDED"
DESIRED_OFFBOARDED = "DESIRED_OFFBOARDED"
PENDING = "PENDING"
ONBOARDED = "ONBOARDED"
OFFBOARDED = "OFFBOARDED"
FAILED = "FAILED"
NOT_FOUND_IN_CLUSTER = "NOT_FOUND_IN_CLUSTER"

# What the onboarding workspace selects when no cluster onboards anything.
# Workspace validation requires at least one selector name, so an emptied
# workspace keeps this one. It is a valid pattern that can never match: a
# cluster name is a DNS-1123 label and cannot contain parentheses.
NOTHING = "(none)/(none)"


@dataclass(frozen=True, slots=True)
class Report:
    """What the cluster's latest inventory report says, and when (µs).

    ``namespaces`` maps each reported namespace to whether the agent reports
    it onboarded.
    """

    namespaces: Mapping[str, bool]
    time_us: int


def reported_onboarded(namespace: Mapping[str, Any]) -> bool:
    """Whether an agent-reported namespace (stored JSON shape) is onboarded.

    The agent's explicit ``onboarded`` flag decides when present. Otherwise
    sidecar injection does, with Istio's precedence: the injection setting
    (``istio.istioInjection``, else the ``istio-injection`` label) when set,
    ``enabled`` meaning onboarded; without one, a revision (``istio.istioRevision``,
    else the ``istio.io/rev`` label) means onboarded.
    """
    if namespace.get("onboarded") is not None:
        return bool(namespace["onboarded"])
    istio = namespace.get("istio") or {}
    labels = namespace.get("labels") or {}
    injection = istio.get("istioInjection") or labels.get("istio-injection")
    if injection:
        return str(injection) == "enabled"
    return bool(istio.get("istioRevision") or labels.get("istio.io/rev"))


def report_of(status: Mapping[str, Any]) -> Report | None:
    """The :class:`Report` in a cluster's stored status; None if it never reported."""
    if "syncTimeUs" not in status:
        return None
    seen = {ns["name"]: reported_onboarded(ns) for ns in status.get("namespaces") or []}
    return Report(seen, int(status["syncTimeUs"]))


def onboarded(spec: Mapping[str, Any]) -> list[str]:
    """Names of the config's namespaces whose desired state is onboarded, sorted."""
    return sorted(
        ns["name"] for ns in spec.get("namespaces") or [] if ns["desiredState"] == DESIRED_ONBOARDED
    )


def sync_selector(
    names: Iterable[str], cluster: str, namespaces: Iterable[str], owned: Iterable[str]
) -> tuple[list[str], list[str]]:
    """The onboarding workspace's selector after ``cluster`` onboards ``namespaces``.

    ``owned`` are the entries the sync added for this cluster earlier (kept
    by the caller). Only those are ever removed: entries an admin added stay,
    even ``{cluster}/...`` ones, and an admin entry that the sync also wants
    stays the admin's (offboarding does not remove it). Returns the new names
    (kept entries in place, then new ``cluster/ns`` entries sorted; the
    :data:`NOTHING` placeholder when empty) and the entries now owned.
    """
    wanted = [f"{cluster}/{ns}" for ns in sorted(set(namespaces))]
    was_owned = set(owned)
    drop = was_owned - set(wanted)
    kept = [n for n in names if n not in drop and n != NOTHING]
    added = [w for w in wanted if w not in kept]
    now_owned = [w for w in wanted if w in was_owned or w in added]
    return (kept + added) or [NOTHING], now_owned


def _current(desired: str, name: str, report: Report | None, since: int) -> tuple[str, str]:
    """(current state, message) of one namespace."""
    if report is None or report.time_us < since:
        return PENDING, "waiting for the agent's next report"
    if name not in report.namespaces:
        return NOT_FOUND_IN_CLUSTER, "the agent does not report this namespace"
    is_onboarded = report.namespaces[name]
    if desired == DESIRED_ONBOARDED:
        if is_onboarded:
            return ONBOARDED, ""
        return FAILED, "desired onboarded, but the agent reports the namespace not onboarded"
    if not is_onboarded:
        return OFFBOARDED, ""
    return FAILED, "desired offboarded, but the agent still reports the namespace onboarded"


class StoredNamespaceStatus(TypedDict):
    """One namespace's entry of a config's stored status (times in microseconds)."""

    desiredState: str
    desiredSince: int
    currentState: str
    lastTransitionTime: int
    message: NotRequired[str]


def statuses(
    spec: Mapping[str, Any],
    previous: Mapping[str, Mapping[str, Any]],
    report: Report | None,
    now_us: int,
) -> dict[str, StoredNamespaceStatus]:
    """Per-namespace status of a config after a config write or a report.

    ``previous`` is the stored result of the last call (name -> status); a
    namespace keeps ``desiredSince`` while its desired state is unchanged, and
    ``lastTransitionTime`` while its current state is.
    """
    out: dict[str, StoredNamespaceStatus] = {}
    for ns in spec.get("namespaces") or []:
        name, desired = ns["name"], ns["desiredState"]
        prev = previous.get(name) or {}
        since = prev["desiredSince"] if prev.get("desiredState") == desired else now_us
        current, message = _current(desired, name, report, since)
        changed = prev.get("currentState") != current
        entry: StoredNamespaceStatus = {
            "desiredState": desired,
            "desiredSince": since,
            "currentState": current,
            "lastTransitionTime": now_us if changed else prev["lastTransitionTime"],
        }
        if message:
            entry["message"] = message
        out[name] = entry
    return out
