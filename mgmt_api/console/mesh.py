"""The mesh of a cluster as the console shows it (pure): workloads, callers, proxies.

Reads ``GET .../clusters/{c}/workloads`` (each sidecar's identity,
certificate, ADS state and who may call it, as the server computed them)
and the cluster object's agent-reported inventory, and turns them into rows
a person reads: the certificate's expiry as "in 23h", the config state in
the words and tones of the status panel (:func:`mgmt_api.console.status.instance_row`),
the callers as SPIFFE ids. :func:`proxies` is the diagnostics page's picker:
every proxy the cluster's agent serves diagnostics for (gateways and, where
the agent reaches them, sidecars) and every connected sidecar, each marked
with whether its diagnostics can be asked for.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mgmt_api.console.status import InstanceRow, instance_row


def _when(stamp: object) -> dt.datetime | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone(dt.UTC)
    except ValueError:
        return None


def span(seconds: float) -> str:
    """``90`` → ``1m``; the largest whole unit, as people say it."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def expiry(stamp: object, now: dt.datetime) -> tuple[str, str]:
    """(words, tone) of a certificate's ``notAfter``: expired is bad, under an hour waits."""
    when = _when(stamp)
    if when is None:
        return "no certificate recorded", "none"
    left = (when - now).total_seconds()
    if left <= 0:
        return f"expired {span(-left)} ago", "bad"
    return f"in {span(left)} ({when:%Y-%m-%d %H:%M} UTC)", "wait" if left < 3600 else "ok"


def callers(authorization: Mapping[str, Any]) -> tuple[str, ...]:
    """Who may call, one entry a line: SPIFFE ids (``*``: a prefix), or why anyone may."""
    principals = authorization.get("principals")
    if principals is None:
        mode = authorization.get("mode")
        if mode:
            return (f"anyone: mode {mode} checks no identity",)
        return ("anyone: no SecuritySetting selects the namespace",)
    return tuple(str(p) for p in principals) or ("nobody (the mode admits no caller)",)


@dataclass(frozen=True)
class WorkloadRow:
    namespace: str
    service: str
    service_account: str
    spiffe_id: str
    instance: str
    pod: str
    replica: str
    expires: str
    expiry_tone: str
    mode: str
    setting: str
    callers: tuple[str, ...]
    config: InstanceRow | None
    diagnostics: str  # the diagnostics page's query for this sidecar


def workload_rows(view: Mapping[str, Any], now: dt.datetime) -> list[WorkloadRow]:
    desired = str(view.get("desiredVersion") or "")
    out = []
    for w in view.get("workloads") or []:
        authorization = w.get("authorization") or {}
        words, tone = expiry((w.get("certificate") or {}).get("notAfter"), now)
        config = w.get("config")
        out.append(
            WorkloadRow(
                namespace=str(w.get("namespace", "")),
                service=str(w.get("service", "")),
                service_account=str(w.get("serviceAccount", "")),
                spiffe_id=str(w.get("spiffeId", "")),
                instance=str(w.get("instance", "")),
                pod=str(w.get("pod", "")),
                replica=str(w.get("replica", "")),
                expires=words,
                expiry_tone=tone,
                mode=str(authorization.get("mode") or "—"),
                setting=str(authorization.get("setting") or ""),
                callers=callers(authorization),
                config=None if config is None else instance_row(config, desired),
                diagnostics=proxy_key(
                    "sidecar", w.get("namespace"), w.get("service"), w.get("instance")
                ),
            )
        )
    return out


# ---- the diagnostics page's picker -------------------------------------------------


def proxy_key(kind: str, namespace: object, workload: object, instance: object) -> str:
    """One proxy as the picker's value: ``kind:namespace/workload/instance``."""
    return f"{kind}:{namespace}/{workload}/{instance}"


@dataclass(frozen=True)
class Proxy:
    kind: str  # "proxy" (the agent serves it: a gateway, or a reachable sidecar) or "sidecar"
    namespace: str
    workload: str
    instance: str
    served: bool  # whether the cluster's agent serves its diagnostics

    @property
    def key(self) -> str:
        return proxy_key(self.kind, self.namespace, self.workload, self.instance)

    @property
    def label(self) -> str:
        where = f"{self.namespace}/{self.workload} ({self.instance})"
        if self.kind == "sidecar":
            return f"sidecar {where}" + ("" if self.served else ": diagnostics not served")
        return f"proxy {where}"


def agent_proxies(cluster: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(namespace, workload, instance) of every proxy the agent reports: its inventory
    lists each proxy instance as a workload of a service (docs/agent.md), and those are
    what ``…/proxytools`` reaches."""
    return sorted(
        (str(ns.get("name")), str(service.get("name")), str(workload.get("name")))
        for ns in cluster.get("namespaces") or []
        for service in ns.get("services") or []
        for workload in service.get("workloads") or []
    )


def proxies(cluster: Mapping[str, Any], view: Mapping[str, Any] | None) -> list[Proxy]:
    """The picker: the agent's proxies, then each connected sidecar it does not serve."""
    served = agent_proxies(cluster)
    sidecars = {
        (str(w.get("namespace")), str(w.get("service")), str(w.get("instance")))
        for w in (view or {}).get("workloads") or []
    }
    out = [Proxy("sidecar" if p in sidecars else "proxy", *p, served=True) for p in served]
    out += [Proxy("sidecar", *s, served=False) for s in sorted(sidecars - set(served))]
    return out


def chosen(key: str, choices: list[Proxy]) -> Proxy | None:
    """The picked proxy, only if it is one of the choices (never a free-form selector)."""
    return next((p for p in choices if p.key == key), None)


# ---- a SecuritySetting's local JWT rules ----------------------------------------------


def _claims(source: Mapping[str, Any]) -> str:
    jwt = source.get("jwt") or {}
    claims = {k: jwt[k] for k in ("iss", "sub") if jwt.get(k)}
    claims.update(jwt.get("other") or {})
    return ", ".join(f"{k}={v}" for k, v in claims.items()) or "any valid token"


def _target(target: Mapping[str, Any]) -> str:
    methods = " ".join(target.get("methods") or []) or "any method"
    paths = " ".join(target.get("paths") or []) or "any path"
    return f"{methods} {paths}"


def local_rules(setting: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(who, what) of each local JWT rule of a SecuritySetting, for people: a request
    is allowed when a token matching one ``from`` entry asks for one ``to`` entry."""
    local = (((setting or {}).get("authorization") or {}).get("http") or {}).get("local") or {}
    return [
        (
            " or ".join(_claims(s) for s in rule.get("from") or []),
            " or ".join(_target(t) for t in rule.get("to") or []) or "anything",
        )
        for rule in local.get("rules") or []
    ]


def local_keys(setting: Mapping[str, Any] | None) -> str:
    """Where the local rules' keys come from (never the key itself)."""
    local = (((setting or {}).get("authorization") or {}).get("http") or {}).get("local") or {}
    keys = local.get("keys") or {}
    jwks = keys.get("jwks") or {}
    if jwks.get("uri"):
        return f"remote JWKS {jwks['uri']}"
    if jwks.get("value"):
        return "an inline JWKS"
    return "a PEM public key" if keys.get("pem") else ""
