"""Redis Cluster mode against a real 3-master cluster: one script call covers
all of a request's keys (they share the domain's hash tag), counting is
exact, keys carry TTLs, different domains spread over the masters, and a
slot that moves to another master (ASK while it migrates, MOVED once it
has) keeps its counts.

The headline test runs with the local cache of empty buckets and without it:
with the cache, the denials hit buckets this process already saw empty and
never reach the script; without it, every decision is the script's.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.crc import key_slot

from ratelimit.buckets import domain_tag
from ratelimit.settings import Settings
from tests.ratelimit.conftest import (
    OK,
    OVER,
    T0,
    FakeClock,
    metric_value,
    request,
    serve_app,
    write_config,
)
from tests.support.redis_server import RedisClusterNodes, redis_cluster

DOMAINS = [f"d{i}" for i in range(12)]


@pytest.fixture(scope="module")
def cluster_module() -> Iterator[RedisClusterNodes]:
    with redis_cluster(3) as nodes:
        yield nodes


@pytest.fixture
def cluster(cluster_module: RedisClusterNodes) -> RedisClusterNodes:
    """The shared cluster, emptied for each test (every run starts at T0)."""
    for port in cluster_module.ports:
        cluster_module.command(port, "flushall")
        cluster_module.command(port, "config", "resetstat")
    return cluster_module


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


@pytest.mark.parametrize("local_cache", [True, False], ids=["local-cache", "no-local-cache"])
async def test_cluster_mode(cluster: RedisClusterNodes, tmp_path: Path, local_cache: bool) -> None:
    for domain in DOMAINS:
        write_config(tmp_path, f"{domain}.yaml", config_text(domain))
    clock = FakeClock()
    settings = Settings(store_timeout=0.5, local_cache_size=100_000 if local_cache else 0)
    hits = metric_value("meshplane_ratelimit_local_cache_hits_total", "")
    written = time.monotonic()
    async with serve_app(tmp_path, redis_url=cluster.url, clock=clock, settings=settings) as svc:
        for domain in DOMAINS:
            req = request(domain, [("client", "a")], [("route", "r")], [("tenant", "t")])
            for i in range(3):
                resp = await svc.call(req)
                assert resp.overall_code == OK
                assert [s.limit_remaining for s in resp.statuses] == [2 - i, 9 - i, 99 - i]
            # With the cache, both denials are its own (the third OK showed the
            # bucket empty); without it, both are the script's.
            for _ in range(2):
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
        # The two denials charged nothing to the hour and day buckets.
        assert [s.limit_remaining for s in resp.statuses] == [2, 6, 96]
    cache_hits = metric_value("meshplane_ratelimit_local_cache_hits_total", "") - hits
    assert cache_hits == (2 * len(DOMAINS) if local_cache else 0)

    keys_per_node = {}
    for port in cluster.ports:
        keys = cluster.command(port, "--scan").split()
        keys_per_node[port] = keys
        for key in keys:
            m = re.search(r"\}:(\d+):(\d+):", key)
            assert m, key
            window, start = int(m[1]), int(m[2])
            # Written at T0, except the new minute's key, written at its start (T0 + 50).
            expected_ms = (start + window - max(T0, start)) * 1000
            ttl_ms = int(cluster.command(port, "pttl", key))
            elapsed_ms = (time.monotonic() - written) * 1000  # after the read: an upper bound
            assert expected_ms - elapsed_ms - 1 <= ttl_ms <= expected_ms, (key, ttl_ms)
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


def _node_ids(cluster: RedisClusterNodes) -> dict[int, str]:
    return {port: cluster.command(port, "cluster", "myid").strip() for port in cluster.ports}


def _owner(cluster: RedisClusterNodes, slot: int) -> int:
    """The port of the master that serves ``slot`` (from CLUSTER NODES)."""
    for line in cluster.command(cluster.ports[0], "cluster", "nodes").splitlines():
        fields = line.split()
        if "master" not in fields[2].split(","):
            continue
        for spec in fields[8:]:
            if spec.startswith("["):  # a migration in progress, not ownership
                continue
            first, _, last = spec.partition("-")
            if int(first) <= slot <= int(last or first):
                return int(fields[1].split("@")[0].rsplit(":", 1)[1])
    raise AssertionError(f"no master serves slot {slot}")


def _errorstat(cluster: RedisClusterNodes, port: int, kind: str) -> int:
    match = re.search(rf"errorstat_{kind}:count=(\d+)", cluster.command(port, "info", "errorstats"))
    return int(match[1]) if match else 0


async def test_a_slot_moving_to_another_master_keeps_its_counts(
    cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    """The client's slot map goes stale when a slot migrates: while the keys
    move, the old master answers ASK (the call is retried on the new one after
    ASKING, where the script is not loaded yet, so NOSCRIPT → EVAL, again via
    ASK); once the slot is reassigned it answers MOVED (the call follows it
    and the map is reloaded). Through both, counting goes on exactly."""
    domain = "moving"
    write_config(tmp_path, "moving.yaml", config_text(domain))
    slot = key_slot(f"{{{domain_tag(domain)}}}".encode())
    source = _owner(cluster, slot)
    target = next(p for p in cluster.ports if p != source)
    ids = _node_ids(cluster)
    req = request(domain, [("client", "a")], [("route", "r")])

    # The readiness probe reloads the slot map too: after its first round,
    # keep it out of the way, so the map is stale when the slot moves.
    async with serve_app(tmp_path, redis_url=cluster.url, probe_interval=3600) as svc:

        async def remaining() -> list[int]:
            resp = await svc.call(req)
            assert resp.overall_code == OK
            return [s.limit_remaining for s in resp.statuses]

        assert await remaining() == [2, 9]
        keys = cluster.command(source, "--scan").split()
        assert len(keys) == 2 and all(key_slot(k.encode()) == slot for k in keys)

        # Migration under way: the keys go to the target; the source answers ASK.
        cluster.command(target, "cluster", "setslot", str(slot), "importing", ids[source])
        cluster.command(source, "cluster", "setslot", str(slot), "migrating", ids[target])
        cluster.command(source, "migrate", "127.0.0.1", str(target), "", "0", "5000", "keys", *keys)
        assert await remaining() == [1, 8]
        assert _errorstat(cluster, source, "ASK") >= 1

        # Migration done: the source answers MOVED to a client with the old map.
        for port in (target, source, *(p for p in cluster.ports if p not in (source, target))):
            cluster.command(port, "cluster", "setslot", str(slot), "node", ids[target])
        moved_before = _errorstat(cluster, source, "MOVED")
        assert await remaining() == [0, 7]
        assert _errorstat(cluster, source, "MOVED") == moved_before + 1
        denied = await svc.call(req)
        assert denied.overall_code == OVER
        assert [s.limit_remaining for s in denied.statuses] == [0, 7]
        # The map was reloaded (in the background): later calls go straight
        # to the new owner.
        await asyncio.sleep(0.2)
        route = await svc.call(request(domain, [("route", "r")]))
        assert [s.limit_remaining for s in route.statuses] == [6]
        assert _errorstat(cluster, source, "MOVED") == moved_before + 1

    assert cluster.command(source, "--scan").split() == []
    assert sorted(cluster.command(target, "--scan").split()) == sorted(keys)
