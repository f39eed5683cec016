"""Which Envoy admin endpoints meshplane lets anyone reach: one table, two enforcers.

Envoy's admin API can also stop a proxy (``/quitquitquit``), fail its health
checks, drain its listeners or dump its private keys (``/certs``). The
cluster agent builds only requests this table admits (:mod:`agent.admin`
checks each one against it before sending), and a sidecar exposes only
these paths, with these methods, on its mTLS diagnostics listener
(:func:`meshplane.sidecar_contract.bootstrap` renders its routes from this
table), so a sidecar refuses the rest even if a caller's client were wrong.

Pure data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    method: str
    params: frozenset[str]


# path -> the one method and the query parameters it may carry.
ALLOWED: dict[str, Endpoint] = {
    "/stats": Endpoint("GET", frozenset({"format", "filter", "usedonly"})),
    "/clusters": Endpoint("GET", frozenset({"format"})),
    "/config_dump": Endpoint("GET", frozenset({"resource", "mask", "include_eds"})),
    "/server_info": Endpoint("GET", frozenset()),
    # POST: Envoy refuses GET on /logging (it can change state). Without
    # parameters it lists the levels; ``level`` sets all, ``paths`` named ones.
    "/logging": Endpoint("POST", frozenset({"level", "paths"})),
}

#: The one admin path a sidecar's metrics port serves (to anyone: metrics only).
PROMETHEUS_PATH = "/stats/prometheus"
