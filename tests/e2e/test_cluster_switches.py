"""The cluster's rate-limit switches reach ``ratelimit`` through its snapshot.

Real processes: ``mgmt-api`` (SQLite), a real redis-server, and ``ratelimit
serve --control-plane`` started *without* ``--redis-url``. The cluster's
``rateLimit`` is changed over REST; ShouldRateLimit calls (as Envoy sends
them) and the Redis keyspace show which store counts. Tests run in file
order, each from the state the previous one left.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from tests.e2e.test_policy_publishing import should_rate_limit, traffic_policy
from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.cluster_credentials import write_credential
from tests.support.net import free_port
from tests.support.processes import Service, wait_until
from tests.support.redis_server import RedisServer

ORG, CLUSTER = "sw", "c1"
CLUSTER_PATH = f"/v2/organizations/{ORG}/clusters/{CLUSTER}"
OK_CODE = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT


class Platform:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.secrets = tmp / "secrets"
        self.secrets.mkdir()
        (tmp / "mgmt").mkdir()
        self.mgmt = MgmtServer(data_dir=str(tmp / "mgmt")).start()
        self.admin = self.mgmt.admin()
        self.redis = RedisServer().start()
        self.service: Service | None = None
        self.port = self.rl_port = free_port()

    def start_ratelimit(self, credentials: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_URL_FILE")}
        env["MESHPLANE_SECRETS_DIR"] = str(self.secrets)
        args = [
            "ratelimit.cli", "serve",
            "--listen", f"127.0.0.1:{self.port}",
            "--control-plane", f"127.0.0.1:{self.mgmt.grpc_port}",
            "--cluster", f"{ORG}/{CLUSTER}",
            "--credentials", str(credentials), "--cache-dir", str(self.tmp / "cache"),
        ]  # fmt: skip
        self.service = Service(args, self.port, self.tmp / "ratelimit.log", env).start()

    def status(self) -> dict[str, Any]:
        return ok(self.admin.get(f"{CLUSTER_PATH}/status"))  # type: ignore[no-any-return]

    def set_rate_limit(self, rate_limit: dict[str, Any]) -> None:
        current = ok(self.admin.get(CLUSTER_PATH))
        ok(self.admin.put(CLUSTER_PATH, json={"rateLimit": rate_limit, "etag": current["etag"]}))

    def converged(self) -> None:
        def done() -> bool:
            status = self.status()
            mine = [i for i in status["instances"] if i["connected"]]
            want = status["desiredVersions"]["ratelimit"]
            return bool(mine) and all(
                i["appliedVersion"] == want and i["lastResult"] != "NACK" for i in mine
            )

        wait_until(done, 15, "ratelimit to apply the cluster's snapshot")
        # The worker reloads the applied snapshot on its next poll and then
        # swaps the store: wait until the decisions show it (see callers).

    def decide(self) -> rls_pb2.RateLimitResponse:
        """The call Envoy makes for route ``web`` (same helper as the publishing e2e)."""
        return should_rate_limit(cast(Any, self))

    def decide_until(
        self, wanted: Callable[[rls_pb2.RateLimitResponse], bool], what: str
    ) -> rls_pb2.RateLimitResponse:
        """The first decision ``wanted`` accepts: the worker applies a new
        snapshot on its next poll, a moment after the ACK."""

        def attempt() -> rls_pb2.RateLimitResponse | None:
            response = self.decide()
            return response if wanted(response) else None

        return wait_until(attempt, 15, what)

    def redis_keys(self) -> int:
        return int(self.redis.command("DBSIZE"))

    def close(self) -> None:
        if self.service is not None:
            self.service.stop()
        self.admin.close()
        self.mgmt.close()
        self.redis.close()


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    p = Platform(tmp_path_factory.mktemp("switches"))
    try:
        ok(p.admin.post("/v2/organizations", json={"name": ORG, "organization": {}}))
        created = ok(
            p.admin.post(f"/v2/organizations/{ORG}/clusters", json={"name": CLUSTER, "cluster": {}})
        )
        credentials = write_credential(created, "ratelimit", p.tmp / "credentials.json")
        body = {"name": "default.web-limit", "backendTrafficPolicy": traffic_policy((1000, "Hour"))}
        ok(p.admin.post(f"{CLUSTER_PATH}/backendtrafficpolicies", json=body))
        p.start_ratelimit(credentials)
        p.converged()
        yield p
    finally:
        p.close()


def limited(response: rls_pb2.RateLimitResponse) -> bool:
    return bool(response.statuses) and response.statuses[0].current_limit.requests_per_unit == 1000


def test_without_switches_it_counts_in_memory(platform: Platform) -> None:
    response = platform.decide_until(limited, "the policy")
    assert response.overall_code == OK_CODE
    assert platform.redis_keys() == 0


def test_switch_to_redis_url_moves_the_counters_into_redis(platform: Platform) -> None:
    platform.set_rate_limit(
        {"backend": {"type": "Redis", "redis": {"url": platform.redis.url}}, "failureMode": "deny"}
    )
    config = ok(platform.admin.post(f"{CLUSTER_PATH}/config"))
    assert config["rateLimit"]["backend"]["redis"]["url"] == platform.redis.url
    platform.converged()

    def counted_in_redis() -> bool:
        return platform.decide().overall_code == OK_CODE and platform.redis_keys() > 0

    wait_until(counted_in_redis, 15, "a decision to count in Redis")


def test_unresolvable_url_ref_is_nacked_and_redis_keeps_counting(platform: Platform) -> None:
    platform.set_rate_limit({"backend": {"redis": {"urlRef": {"name": "missing"}}}})

    def nacked() -> dict[str, Any] | None:
        found = [i for i in platform.status()["instances"] if i["lastResult"] == "NACK"]
        return found[0] if found else None

    instance = wait_until(nacked, 15, "the NACK in the cluster status")
    assert "secret default/missing" in instance["lastError"]
    assert instance["upToDate"] is False
    platform.redis.command("FLUSHALL")
    assert platform.decide().overall_code == OK_CODE
    assert platform.redis_keys() > 0  # the last good store (Redis) still counts


def test_url_ref_resolved_from_the_mounted_secret(platform: Platform) -> None:
    secret = platform.secrets / "mesh" / "redis-url"
    secret.mkdir(parents=True)
    (secret / "url").write_text(platform.redis.url + "\n")
    platform.set_rate_limit(
        {
            "backend": {"redis": {"urlRef": {"name": "redis-url", "namespace": "mesh"}}},
            "failureMode": "deny",
        }
    )
    platform.converged()
    platform.redis.command("FLUSHALL")

    def counted_in_redis() -> bool:
        return platform.decide().overall_code == OK_CODE and platform.redis_keys() > 0

    wait_until(counted_in_redis, 15, "a decision to count in the referenced Redis")


def test_failure_mode_deny_then_allow_with_redis_down(platform: Platform) -> None:
    platform.redis.kill()
    response = platform.decide_until(lambda r: r.overall_code == OVER, "failureMode deny")
    assert response.overall_code == OVER  # deny: Redis cannot answer
    platform.set_rate_limit(
        {
            "backend": {"redis": {"urlRef": {"name": "redis-url", "namespace": "mesh"}}},
            "failureMode": "allow",
        }
    )
    platform.converged()
    wait_until(lambda: platform.decide().overall_code == OK_CODE, 15, "failureMode allow")


def test_redis_disabled_switches_back_to_memory(platform: Platform) -> None:
    platform.set_rate_limit({"redis": {"disabled": True}, "failureMode": "deny"})
    platform.converged()
    # Redis is still down and the mode is deny: only an in-memory store says OK.
    response = platform.decide_until(lambda r: r.overall_code == OK_CODE, "the memory store")
    assert limited(response)
    assert platform.status()["instances"][0]["lastResult"] == "ACK"
