"""Redis Cluster mode against a real 3-master cluster: one script call covers
all of a request's keys (they share the domain's hash tag), counting is
exact, keys carry TTLs, and different domains spread over the masters."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ratelimit.conftest import OK, OVER, T0, FakeClock, request, serve_app, write_config
from tests.support.redis_server import RedisClusterNodes, redis_cluster

DOMAINS = [f"d{i}" for i in range(12)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterNodes]:
    with redis_cluster(3) as nodes:
        yield nodes


def config_text(domain: str) -> str:
    return f"""\
domain: {domain}
descriptors:
  - key: client
    rate_limit: {{unit: minute, requests_per_unit: 3}}
  - key: route
    rate_limit: {{unit: hour, requests_per_unit: 10}}
  - key: tenant
    rate_limit: {{unit: day, requests_per_unit: 100}}
"""


async def test_cluster_mode(cluster: RedisClusterNodes, tmp_path: Path) -> None:
    for domain in DOMAINS:
        write_config(tmp_path, f"{domain}.yaml", config_text(domain))
    clock = FakeClock()
    async with serve_app(tmp_path, redis_url=cluster.url, clock=clock) as svc:
        for domain in DOMAINS:
            req = request(domain, [("client", "a")], [("route", "r")], [("tenant", "t")])
            for i in range(3):
                resp = await svc.call(req)
                assert resp.overall_code == OK
                assert [s.limit_remaining for s in resp.statuses] == [2 - i, 9 - i, 99 - i]
            denied = await svc.call(req)
            assert denied.overall_code == OVER
            assert [(s.code, s.limit_remaining) for s in denied.statuses] == [
                (OVER, 0),
                (OK, 7),
                (OK, 97),
            ]
        clock.advance(50)  # next minute: the client bucket refills, the day goes on
        resp = await svc.call(
            request(DOMAINS[0], [("client", "a")], [("route", "r")], [("tenant", "t")])
        )
        assert [s.limit_remaining for s in resp.statuses] == [2, 6, 96]

    keys_per_node = {}
    for port in cluster.ports:
        keys = cluster.command(port, "--scan").split()
        keys_per_node[port] = keys
        for key in keys:
            m = re.search(r"\}:(\d+):(\d+):", key)
            assert m, key
            ttl_ms = int(cluster.command(port, "pttl", key))
            assert 0 < ttl_ms <= (int(m[1]) + int(m[2]) - T0) * 1000
    # 3 keys per domain, plus a new minute window for the last call.
    assert sum(len(k) for k in keys_per_node.values()) == len(DOMAINS) * 3 + 1
    # Twelve domains spread over more than one master.
    assert sum(1 for keys in keys_per_node.values() if keys) >= 2
    # All keys of one domain live on one master (they share a slot).
    for keys in keys_per_node.values():
        tags = {k.split("}")[0] for k in keys}
        for other in keys_per_node.values():
            if other is not keys:
                assert not tags & {k.split("}")[0] for k in other}
