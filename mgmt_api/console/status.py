""" "Has my change reached the proxies?" as one line and one row per instance (pure).

The distribution status endpoints list every subscribed instance (ratelimit,
extauthz, gateway) with its applied version, ACK/NACK, last contact and
staleness next to the version the current policies compile to for its kind
(``desiredVersions``). A policy's endpoint lists the instances of every kind
the policy reaches (the server owns that mapping; the console never guesses
it), so "Applied on all N instances" counts the gateways too. This turns that
into what a person reads at a glance: a verdict (reached everywhere,
rejected, waiting, nobody subscribed) and per-instance rows with a state
word and the error to fix.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Tone = Literal["ok", "warn", "bad", "wait", "none"]


@dataclass(frozen=True)
class InstanceRow:
    kind: str
    instance: str
    cluster: str
    state: str  # "Applied", "Rejected (NACK)", "Applying", "Stale", "Disconnected"
    tone: Tone
    applied: str  # short version
    desired: str
    error: str
    last_contact: str


@dataclass(frozen=True)
class Verdict:
    tone: Tone
    text: str
    rows: tuple[InstanceRow, ...]
    compile_errors: tuple[str, ...] = ()
    #: What was accepted but cannot work as written (the status's ``warnings``:
    #: a policy targeting a route that does not exist). Applied everywhere with
    #: warnings is amber, never "Applied".
    warnings: tuple[str, ...] = ()


def short(version: str) -> str:
    return version[:12] if version else "none"


def clock_time(stamp: object) -> str:
    """An RFC 3339 last contact as a UTC wall-clock time (stable between polls,
    unlike "3 s ago")."""
    if not isinstance(stamp, str) or not stamp:
        return "never"
    try:
        when = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "unknown"
    return when.astimezone(dt.UTC).strftime("%H:%M:%S UTC")


def instance_row(instance: Mapping[str, Any], desired: str, cluster: str = "") -> InstanceRow:
    applied = str(instance.get("appliedVersion") or "")
    error = str(instance.get("lastError") or "")
    tone: Tone
    if instance.get("stale"):
        state, tone = "Stale: not heard from", "bad"
    elif not instance.get("connected"):
        state, tone = "Disconnected", "bad"
    elif instance.get("lastResult") == "NACK" and instance.get("upToDate") is not True:
        state, tone = "Rejected (NACK)", "bad"
    elif instance.get("upToDate"):
        state, tone = "Applied (ACK)", "ok"
    else:
        state, tone = "Applying…", "wait"
    return InstanceRow(
        kind=str(instance.get("kind", "")),
        instance=str(instance.get("instance", "")),
        cluster=cluster,
        state=state,
        tone=tone,
        applied=short(applied),
        desired=short(desired),
        error=error,
        last_contact=clock_time(instance.get("lastContactTime")),
    )


def verdict(
    rows: Sequence[InstanceRow], compile_errors: Iterable[str] = (), warnings: Iterable[str] = ()
) -> Verdict:
    errors = tuple(compile_errors)
    warned = tuple(warnings)
    if errors:
        return Verdict(
            "bad",
            "The policies do not compile; instances keep their last good version",
            tuple(rows),
            errors,
            warned,
        )
    if not rows:
        return Verdict("none", "No instance has subscribed yet", (), warnings=warned)
    bad = [r for r in rows if r.tone == "bad"]
    waiting = [r for r in rows if r.tone == "wait"]
    total = len(rows)
    if bad:
        nacks = sum(1 for r in bad if r.state.startswith("Rejected"))
        what = f"{nacks} rejected" if nacks else f"{len(bad)} not reachable"
        text = f"Not applied everywhere: {what} of {total} instances"
        return Verdict("bad", text, tuple(rows), warnings=warned)
    if waiting:
        text = f"Applying: {total - len(waiting)} of {total} instances up to date"
        return Verdict("wait", text, tuple(rows), warnings=warned)
    if warned:
        more = f" (and {len(warned) - 1} more)" if len(warned) > 1 else ""
        text = f"Applied with warnings: {warned[0]}{more}"
        return Verdict("warn", text, tuple(rows), warnings=warned)
    return Verdict("ok", f"Applied on all {total} instances", tuple(rows))


def _rows(view: Mapping[str, Any], cluster: str = "") -> list[InstanceRow]:
    """A cluster's instances, each against its own kind's desired version."""
    desired = view.get("desiredVersions") or {}
    return [
        instance_row(i, str(desired.get(i.get("kind"), "")), cluster)
        for i in view.get("instances") or []
    ]


def _errors(view: Mapping[str, Any], prefix: str = "") -> list[str]:
    return [f"{prefix}{k}: {v}" for k, v in (view.get("compileErrors") or {}).items()]


def _warnings(view: Mapping[str, Any]) -> list[str]:
    return [str(w.get("message", "")) for w in view.get("warnings") or [] if isinstance(w, Mapping)]


def cluster_verdict(status: Mapping[str, Any]) -> Verdict:
    """``GET .../clusters/{c}/status``."""
    return verdict(_rows(status), _errors(status), _warnings(status))


def traffic_verdict(status: Mapping[str, Any]) -> Verdict:
    """``GET .../backendtrafficpolicies/{p}/status``: its cluster's instances that carry it."""
    return cluster_verdict(status)


def group_verdict(status: Mapping[str, Any]) -> Verdict:
    """``GET .../settings/{s}/status`` and ``.../extauthzpolicies/{p}/status``: per cluster."""
    rows: list[InstanceRow] = []
    errors: list[str] = []
    for cluster in status.get("clusters") or []:
        name = str(cluster.get("cluster", "")).rsplit("/", 1)[-1]
        rows += _rows(cluster, name)
        errors += _errors(cluster, f"{name}: ")
    return verdict(rows, errors)


def digest(verdict: Verdict) -> str:
    """Identifies what the panel shows: a poll answers 204 while it is unchanged."""
    return hashlib.sha256(repr(verdict).encode()).hexdigest()[:16]
