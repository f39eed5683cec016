""" "Has my change reached the proxies?" as one line and one row per instance (pure).

The distribution status endpoints list every subscribed ratelimit and
extauthz instance with its applied version, ACK/NACK, last contact and
staleness next to the version the current policies compile to. This turns
that into what a person reads at a glance: a verdict (reached everywhere,
rejected, waiting, nobody subscribed) and per-instance rows with a state
word and the error to fix.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Tone = Literal["ok", "bad", "wait", "none"]


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


def short(version: str) -> str:
    return version[:12] if version else "none"


def clock_time(epoch: float) -> str:
    """Last contact as a UTC wall-clock time (stable between polls, unlike "3 s ago")."""
    if not epoch:
        return "never"
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%H:%M:%S UTC")


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
        last_contact=clock_time(float(instance.get("lastContactTime") or 0)),
    )


def verdict(rows: Sequence[InstanceRow], compile_errors: Iterable[str] = ()) -> Verdict:
    errors = tuple(compile_errors)
    if errors:
        return Verdict(
            "bad",
            "The policies do not compile; instances keep their last good version",
            tuple(rows),
            errors,
        )
    if not rows:
        return Verdict("none", "No instance has subscribed yet", ())
    bad = [r for r in rows if r.tone == "bad"]
    waiting = [r for r in rows if r.tone == "wait"]
    total = len(rows)
    if bad:
        nacks = sum(1 for r in bad if r.state.startswith("Rejected"))
        what = f"{nacks} rejected" if nacks else f"{len(bad)} not reachable"
        return Verdict("bad", f"Not applied everywhere: {what} of {total} instances", tuple(rows))
    if waiting:
        return Verdict(
            "wait", f"Applying: {total - len(waiting)} of {total} instances up to date", tuple(rows)
        )
    return Verdict("ok", f"Applied on all {total} instances", tuple(rows))


def cluster_verdict(status: Mapping[str, Any]) -> Verdict:
    """``GET .../clusters/{c}/status``."""
    desired = status.get("desiredVersions") or {}
    rows = [
        instance_row(i, str(desired.get(i.get("kind"), ""))) for i in status.get("instances") or []
    ]
    errors = [f"{k}: {v}" for k, v in (status.get("compileErrors") or {}).items()]
    return verdict(rows, errors)


def traffic_verdict(status: Mapping[str, Any]) -> Verdict:
    """``GET .../backendtrafficpolicies/{p}/status``."""
    desired = str(status.get("desiredVersion") or "")
    return verdict([instance_row(i, desired) for i in status.get("instances") or []])


def group_verdict(status: Mapping[str, Any]) -> Verdict:
    """``GET .../settings/{s}/status`` and ``.../extauthzpolicies/{p}/status``: per cluster."""
    rows: list[InstanceRow] = []
    errors: list[str] = []
    for cluster in status.get("clusters") or []:
        name = str(cluster.get("cluster", "")).rsplit("/", 1)[-1]
        desired = str(cluster.get("desiredVersion") or "")
        rows += [instance_row(i, desired, name) for i in cluster.get("instances") or []]
        if cluster.get("compileError"):
            errors.append(f"{name}: {cluster['compileError']}")
    return verdict(rows, errors)


def digest(verdict: Verdict) -> str:
    """Identifies what the panel shows: a poll answers 204 while it is unchanged."""
    return hashlib.sha256(repr(verdict).encode()).hexdigest()[:16]
