"""A global limit as quotas (RLQS) across three real gateways under skewed load.

One stack (tests/support/gateway.py): mgmt-api, a redis-server, ``ratelimit``
subscribed to mgmt-api, an upstream Envoy, and three gateway Envoys configured
over ADS. A BackendTrafficPolicy rule of ``LIMIT`` requests a second in
``mode: quota`` compiles to a ``rate_limit_quota`` filter on every gateway:
each enforces the token bucket the service assigned it and reports its usage
every 5 s. The service runs with an assignment TTL and a staleness of 10 s
(``quota.*`` settings) rather than 15: two reports, still more than one
report's gap, so the TTL and staleness phases take less time. Load is open
loop (a paced request schedule per gateway), so a gateway's demand is what it
is offered whatever it admits.

What the documentation promises (docs/ratelimit.md, "Global limits as quotas"):
the admitted total stays within 10% of the limit with one gateway taking 80%
of the traffic, no gateway with demand starves, a gateway that leaves hands
its share back and one that joins gets one, and while the service is down each
gateway keeps its share until the assignment's TTL passes, then enforces the
whole limit on its own, and gets a share again once the service is back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from mgmt_api.compiler.envoy_config import RATELIMIT_CLUSTER
from tests.support.gateway import Gateway, GatewayStack

LIMIT = 60  # requests a second, across all gateways
#: Offered load (requests a second): the big gateway more than the limit alone, the
#: small ones a demand their share covers; big + 2 small = 100, 80% on the big one.
BIG = 80
SMALL = 10
#: The assignment TTL and staleness (ratelimit's ``quota.*`` settings), and Envoy's
#: report interval (ratelimit.quota.allocation.REPORT_INTERVAL).
TTL = 10
REPORT = 5
#: The skewed run: two reports for the shares to settle, then the measured window.
SETTLE = 2 * REPORT
WINDOW = 20


@dataclass(frozen=True)
class Hit:
    at: float  # seconds since the run started
    gateway: str
    status: int


def drive(rates: dict[Gateway, float], seconds: float) -> list[Hit]:
    """Offer each gateway ``rate`` requests a second for ``seconds``, open loop: a
    request is sent at its slot whatever the answers were (slots more than a
    second late are skipped, so a stalled client does not send a burst)."""
    hits: list[Hit] = []
    lock = threading.Lock()
    start = time.monotonic()

    def run(gateway: Gateway, rate: float) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{gateway.port}", timeout=10) as client:
            slot = 0
            while True:
                due = start + slot / rate
                now = time.monotonic()
                if due - start >= seconds:
                    return
                if due > now:
                    time.sleep(due - now)
                elif now - due > 1.0:
                    slot += int((now - due) * rate)
                    continue
                status = client.get("/").status_code
                with lock:
                    hits.append(Hit(due - start, gateway.instance, status))
                slot += 1

    threads = [threading.Thread(target=run, args=item) for item in rates.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return hits


def admitted(
    hits: list[Hit], gateway: str | None = None, since: float = 0, until: float = 1e9
) -> int:
    return sum(
        1
        for h in hits
        if h.status == 200 and (gateway is None or h.gateway == gateway) and since <= h.at < until
    )


def offered(hits: list[Hit], gateway: str, since: float = 0) -> int:
    return sum(1 for h in hits if h.gateway == gateway and since <= h.at)


def quota_streams(gateway: Gateway) -> int:
    """The gateway's open streams to ratelimit: its quota stream, once connected
    (the gateway has no exact-path rule, so nothing else uses the cluster)."""
    name = f"cluster.{RATELIMIT_CLUSTER}.upstream_rq_active"
    stats = gateway.envoy.admin("GET", f"/stats?filter=^{name}$").text
    return int(stats.partition(": ")[2] or 0)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayStack]:
    st = GatewayStack(
        Path(tmp_path_factory.mktemp("quota")),
        ratelimit_settings=f"quota: {{assignmentTtlSeconds: {TTL}, staleAfterSeconds: {TTL}}}\n",
    )
    try:
        st.backend("default.app")
        st.route("default.web", "/")
        rule = {"limit": {"requests": LIMIT, "unit": "Second"}, "mode": "quota"}
        policy = {
            "spec": {
                "targetRef": {"kind": "HTTPRoute", "name": "web"},
                "rateLimit": {"type": "Global", "global": {"rules": [rule]}},
            }
        }
        st.put("backendtrafficpolicies", "default.web-quota", "backendTrafficPolicy", policy)
        for _ in range(3):
            st.gateway()
        st.converged()
        yield st
    finally:
        st.close()


@pytest.mark.timeout(300)  # the stack's start (up to 2 min on a loaded machine) + 30 s of load
def test_skewed_load_admits_the_limit_and_starves_no_gateway(stack: GatewayStack) -> None:
    big, small, other = stack.gateways[:3]
    # 80% of the traffic on one gateway; 100 a second offered for a limit of 60.
    hits = drive({big: BIG, small: SMALL, other: SMALL}, SETTLE + WINDOW)
    # Once the shares have settled (two reports): LIMIT * WINDOW = 1200 expected, from
    # 2000 offered; the bound of 10% is 120 requests, two seconds of the limit. Each
    # small gateway is offered 300 requests in all, as many as before in 60 s at 5 a
    # second: it is admitted about 0.87 of them, with a binomial sigma of about 0.02,
    # so 0.8 is 3.5 sigmas away (at 5 a second for 30 s, 150 requests, it was about
    # 0.84 with a sigma of 0.03, and one gateway in six fell below 0.8).
    total = admitted(hits, since=SETTLE)
    print(  # the figure docs/ratelimit.md quotes (pytest -s)
        f"admitted {total} of {sum(1 for h in hits if h.at >= SETTLE)} in the {WINDOW} s"
        f" after {SETTLE} s (limit {LIMIT * WINDOW}); {admitted(hits)} of {len(hits)} in all;"
        " per gateway, all and after settling "
        + ", ".join(
            f"{g.instance} {admitted(hits, g.instance)}/{offered(hits, g.instance)}"
            f" {admitted(hits, g.instance, since=SETTLE)}/{offered(hits, g.instance, SETTLE)}"
            for g in (big, small, other)
        )
    )
    assert abs(total - LIMIT * WINDOW) <= 0.1 * LIMIT * WINDOW, total
    # While they settle, newcomers pass for a round trip: not more than 10% over either.
    assert admitted(hits) <= 1.1 * LIMIT * (SETTLE + WINDOW), admitted(hits)
    for gateway in (small, other):  # their demand (SMALL a second) fits their share
        assert admitted(hits, gateway.instance) >= 0.8 * offered(hits, gateway.instance)
    # Once the shares have settled, the big gateway takes the rest.
    settled = admitted(hits, big.instance, since=SETTLE)
    assert settled >= 0.8 * (LIMIT - 2 * SMALL) * WINDOW, settled
    assert any(h.status == 429 for h in hits if h.gateway == big.instance)
    # A quota refusal says why, as every denial does (docs/observability.md).
    with httpx.Client(base_url=f"http://127.0.0.1:{big.port}", timeout=10) as client:
        refused = next(
            r for r in (client.get("/") for _ in range(10 * LIMIT)) if r.status_code == 429
        )
    assert refused.headers["x-meshplane-denied"] == "ratelimit over_quota", refused.headers
    assert refused.headers["x-decision-id"], refused.headers


@pytest.mark.timeout(240)
def test_a_gateway_that_leaves_hands_its_share_back_and_one_that_joins_gets_one(
    stack: GatewayStack,
) -> None:
    big = stack.gateways[0]
    joined = stack.gateway()
    stack.converged()
    hits = drive({big: BIG, joined: BIG}, 2 * REPORT + 4)
    # Both have demand: both get a share, and together no more than the limit.
    late = 2 * REPORT
    assert admitted(hits, joined.instance, since=late) >= 0.25 * LIMIT * 4
    assert admitted(hits, big.instance, since=late) >= 0.25 * LIMIT * 4
    assert admitted(hits, since=late) <= 1.1 * LIMIT * 4
    joined.stop()
    stack.gateways.remove(joined)
    # Its share is given back once it is stale (TTL) and the big gateway reports.
    hits = drive({big: BIG}, TTL + 2 * REPORT + 3)
    tail = TTL + 2 * REPORT
    assert admitted(hits, big.instance, since=tail) >= 0.85 * LIMIT * 3


@pytest.mark.timeout(240)
def test_while_the_service_is_down_shares_hold_then_each_gateway_enforces_the_whole_limit(
    stack: GatewayStack,
) -> None:
    big, small, other = stack.gateways[:3]
    # Every gateway holds an assignment of the bucket (a bucket first used while the
    # service is down is let through, as no_assignment_behavior says) and the
    # shares have settled: the big gateway's is below the whole limit.
    drive({big: BIG, small: SMALL, other: SMALL}, 2 * REPORT)
    service = stack.services[0]  # ratelimit
    assert service.proc is not None
    service.proc.kill()  # not a planned stop: no TTL-0 goodbye
    service.proc.wait(10)
    hits = drive({big: BIG, small: SMALL, other: SMALL}, TTL + 8)
    # Until the TTL passes, the last shares hold: the sum stays near the limit.
    assert admitted(hits, since=1, until=TTL - REPORT) <= 1.1 * LIMIT * (TTL - REPORT - 1)
    # Then the fallback: the big gateway alone admits the whole limit.
    assert admitted(hits, big.instance, since=TTL + 3) >= 0.85 * LIMIT * 5
    service.start()
    # Back: the gateways reconnect at their next report (within REPORT seconds)...
    drive({big: BIG, small: SMALL, other: SMALL}, REPORT + 2)
    assert [quota_streams(g) for g in (big, small, other)] == [1, 1, 1]
    # ...and get shares again: no longer the whole limit each.
    hits = drive({big: BIG, small: SMALL, other: SMALL}, 5)
    assert admitted(hits) <= 1.1 * LIMIT * 5
    assert admitted(hits, big.instance) <= 0.9 * LIMIT * 5
