"""Policy publishing end to end: real processes, real sockets (issue 5's scenarios).

``mgmt-api`` (SQLite), ``ratelimit`` on a real redis-server and ``extauthz``
run as CLI subprocesses; the services subscribe with ``--control-plane``.
Policies are written over REST and checked with ShouldRateLimit and Check
calls made exactly as Envoy makes them. The tests run in file order: each
scenario starts from the state the previous one left (scenario 6, which
stops the management plane, runs last).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.auth.v3 import attribute_context_pb2, external_auth_pb2, external_auth_pb2_grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from extauthz.cli import mint_demo_token
from meshplane.control_plane import load_credentials
from meshplane.proto.distribution.v1 import distribution_pb2 as dpb
from meshplane.proto.distribution.v1 import distribution_pb2_grpc as dpb_grpc
from mgmt_api.auth.tokens import sign_service_account
from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.cluster_credentials import private_jwk, write_credential
from tests.support.envoy import get_envoyconfig
from tests.support.net import free_port
from tests.support.processes import Service, wait_until
from tests.support.redis_server import RedisServer

ORG = "e2e"
CLUSTER = "c1"
OTHER = "c2"
BASE = f"/v2/organizations/{ORG}"
CLUSTER_PATH = f"{BASE}/clusters/{CLUSTER}"
POLICY_PATH = f"{CLUSTER_PATH}/backendtrafficpolicies/default.web-limit"
DOMAIN = f"{CLUSTER}/default/web-limit"
ROUTE = "httproute/default/web"
GROUP_PATH = f"{BASE}/tenants/t/workspaces/w/securitygroups/g"
EXTAUTHZ_POLICY = "t.w.g.jwt"  # mgmt_api.compiler.extauthz.policy_name
OTHER_TENANT_POLICY = "t2.w.g.jwt"  # same workspace, group and policy names, other tenant
SECRET = "e2e-hmac-secret-0123456789abcdef"
OK_CODE = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT
T = TypeVar("T")


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        (tmp / "mgmt").mkdir()
        self.mgmt = MgmtServer(data_dir=str(tmp / "mgmt")).start()
        self.admin = self.mgmt.admin()
        self.redis = RedisServer().start()
        self.services: list[Service] = []
        # cluster -> component -> its credentials file
        self.credentials: dict[str, dict[str, Path]] = {}

    def create_cluster(self, name: str) -> None:
        created = ok(self.admin.post(f"{BASE}/clusters", json={"name": name, "cluster": {}}))
        self.credentials[name] = {
            kind: write_credential(created, kind, self.tmp / f"{name}-{kind}-credentials.json")
            for kind in ("agent", "extauthz", "ratelimit")
        }

    def control_plane_args(self, service: str) -> list[str]:
        return [
            "--control-plane",
            f"grpc://127.0.0.1:{self.mgmt.grpc_port}",
            "--cluster",
            f"{ORG}/{CLUSTER}",
            "--credentials",
            str(self.credentials[CLUSTER][service]),
            "--cache-dir",
            str(self.tmp / f"{service}-cache"),
        ]

    def ratelimit(self) -> Service:
        port = getattr(self, "rl_port", None) or free_port()
        self.rl_port = port
        args = ["ratelimit.cli", "serve", "--listen", f"127.0.0.1:{port}"]
        # No local over-limit cache: the scenarios reset counters with FLUSHALL,
        # which a per-process cache of "over until the window ends" would outlive.
        # A generous store timeout: on a loaded machine Redis may answer late,
        # and no scenario here is about the store failing.
        settings = self.tmp / "ratelimit-settings.yaml"
        settings.write_text("localCacheSize: 0\nstoreTimeoutMs: 2000\n")
        args += ["--redis-url", self.redis.url, "--settings", str(settings)]
        args += self.control_plane_args("ratelimit")
        service = Service(args, port, self.tmp / "ratelimit.log").start()
        self.services.append(service)
        return service

    def extauthz(self) -> Service:
        port = getattr(self, "az_port", None) or free_port()
        self.az_port = port
        args = ["extauthz.cli", "serve", "--listen", f"127.0.0.1:{port}"]
        args += self.control_plane_args("extauthz")
        service = Service(args, port, self.tmp / "extauthz.log").start()
        self.services.append(service)
        return service

    def start_services(self) -> None:
        """ratelimit and extauthz, started side by side (each waits for its port)."""
        with ThreadPoolExecutor(2) as pool:
            for started in [pool.submit(self.ratelimit), pool.submit(self.extauthz)]:
                started.result()

    def status(self) -> dict[str, Any]:
        return ok(self.admin.get(f"{CLUSTER_PATH}/status"))  # type: ignore[no-any-return]

    def converged(self, kind: str) -> None:
        """Wait until every instance of ``kind`` ACKed the cluster's desired version,
        then for the workers' 0.1 s poll of the snapshot directory."""

        def done() -> bool:
            status = self.status()
            desired = status["desiredVersions"][kind]
            mine = [i for i in status["instances"] if i["kind"] == kind and i["connected"]]
            return bool(mine) and all(
                i["appliedVersion"] == desired and i["lastResult"] == "ACK" for i in mine
            )

        wait_until(done, 15, f"{kind} to apply the desired snapshot")
        time.sleep(0.4)

    def close(self) -> None:
        for service in self.services:
            service.stop()
        self.admin.close()
        self.mgmt.close()
        self.redis.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    st = Stack(tmp_path_factory.mktemp("e2e"))
    try:
        ok(st.admin.post("/v2/organizations", json={"name": ORG, "organization": {}}))
        st.create_cluster(CLUSTER)
        st.create_cluster(OTHER)
        st.start_services()
        yield st
    finally:
        st.close()


def traffic_policy(*limits: tuple[int, str]) -> dict[str, Any]:
    rules = [{"limit": {"requests": n, "unit": unit}} for n, unit in limits]
    return {
        "spec": {
            "targetRef": {"kind": "HTTPRoute", "name": "web"},
            "rateLimit": {"type": "Global", "global": {"rules": rules}},
        }
    }


def should_rate_limit(stack: Stack, rules: int = 1) -> rls_pb2.RateLimitResponse:
    """What Envoy sends for route ``web`` with the compiled actions: one
    descriptor per rule, ``[route node, rule-R-match--1]``."""
    request = rls_pb2.RateLimitRequest(domain=DOMAIN)
    for r in range(rules):
        d = ratelimit_pb2.RateLimitDescriptor()
        d.entries.add(key=ROUTE, value=ROUTE)
        d.entries.add(key=f"rule-{r}-match--1", value=f"rule-{r}-match--1")
        request.descriptors.append(d)
    with grpc.insecure_channel(f"127.0.0.1:{stack.rl_port}") as channel:
        return rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=5)


def headers(response: rls_pb2.RateLimitResponse) -> dict[str, str]:
    return {h.key: h.value for h in response.response_headers_to_add}


def in_one_minute(stack: Stack, scenario: Callable[[], T]) -> T:
    """What ``scenario`` returns, run on empty counters within one minute of the
    clock: a minute that ended midway reset the counters the scenario counts
    on, so it runs again, from the fresh minute (where it fits)."""
    for _ in range(3):
        stack.redis.command("FLUSHALL")
        minute = time.time() // 60
        result = scenario()
        if time.time() // 60 == minute:
            return result
    raise AssertionError("the scenario never ran within one minute")


def test_1_three_per_minute_the_fourth_is_over_limit(stack: Stack) -> None:
    body = {"name": "default.web-limit", "backendTrafficPolicy": traffic_policy((3, "Minute"))}
    ok(stack.admin.post(f"{CLUSTER_PATH}/backendtrafficpolicies", json=body))
    stack.converged("ratelimit")
    policy_status = ok(stack.admin.get(f"{POLICY_PATH}/status"))
    assert [(i["lastResult"], i["upToDate"]) for i in policy_status["instances"]] == [("ACK", True)]
    codes, last_response = in_one_minute(
        stack,
        lambda: (
            [should_rate_limit(stack).overall_code for _ in range(4)],
            should_rate_limit(stack),
        ),
    )
    assert codes == [OK_CODE, OK_CODE, OK_CODE, OVER]
    last = headers(last_response)
    assert last["x-ratelimit-limit"] == "3, 3;w=60"
    assert last["x-ratelimit-remaining"] == "0"
    assert 0 < int(last["x-ratelimit-reset"]) <= 60


def test_2_update_to_five_is_enforced(stack: Stack) -> None:
    current = ok(stack.admin.get(POLICY_PATH))
    update = {**traffic_policy((5, "Minute")), "etag": current["etag"]}
    ok(stack.admin.put(POLICY_PATH, json=update))
    stack.converged("ratelimit")
    codes, last = in_one_minute(
        stack,
        lambda: (
            [should_rate_limit(stack).overall_code for _ in range(6)],
            should_rate_limit(stack),
        ),
    )
    assert codes == [OK_CODE] * 5 + [OVER]
    assert headers(last)["x-ratelimit-limit"] == "5, 5;w=60"


def test_3_second_rule_ors_with_the_first_and_both_windows_are_listed(stack: Stack) -> None:
    current = ok(stack.admin.get(POLICY_PATH))
    update = {**traffic_policy((5, "Minute"), (2, "Second")), "etag": current["etag"]}
    ok(stack.admin.put(POLICY_PATH, json=update))
    stack.converged("ratelimit")

    def scenario() -> tuple[list[rls_pb2.RateLimitResponse], list[rls_pb2.RateLimitResponse]]:
        time.sleep(1 - time.time() % 1)  # start of a second: three calls fit in it
        burst = [should_rate_limit(stack, rules=2) for _ in range(3)]
        # One call per second never trips the second rule; the minute rule does.
        paced: list[rls_pb2.RateLimitResponse] = []
        while len(paced) < 8 and (not paced or paced[-1].overall_code != OVER):
            time.sleep(1.05 - time.time() % 1)
            paced.append(should_rate_limit(stack, rules=2))
        return burst, paced

    burst, paced = in_one_minute(stack, scenario)
    assert [r.overall_code for r in burst] == [OK_CODE, OK_CODE, OVER]
    # The per-second rule denied while the minute rule still had room.
    assert [s.code for s in burst[2].statuses] == [OK_CODE, OVER]
    limit_header = headers(burst[0])["x-ratelimit-limit"]
    assert "5;w=60" in limit_header
    assert "2;w=1" in limit_header
    assert paced[-1].overall_code == OVER, "the 5/Minute rule never applied"
    assert [s.code for s in paced[-1].statuses] == [OVER, OK_CODE]


def test_4_delete_makes_traffic_unlimited(stack: Stack) -> None:
    ok(stack.admin.delete(POLICY_PATH))
    stack.converged("ratelimit")
    responses = in_one_minute(stack, lambda: [should_rate_limit(stack) for _ in range(10)])
    assert {r.overall_code for r in responses} == {OK_CODE}


def check(stack: Stack, path: str, token: str | None, policy: str = EXTAUTHZ_POLICY) -> int:
    """One Check as Envoy sends it; returns the gRPC status code in the answer (0 allows)."""
    hdrs = {":method": "GET", ":path": path}
    if token:
        hdrs["authorization"] = f"Bearer {token}"
    http = attribute_context_pb2.AttributeContext.HttpRequest(
        method="GET", path=path, protocol="HTTP/1.1", headers=hdrs
    )
    attributes = attribute_context_pb2.AttributeContext(
        request=attribute_context_pb2.AttributeContext.Request(http=http)
    )
    attributes.context_extensions["meshplane.policy"] = policy
    with grpc.insecure_channel(f"127.0.0.1:{stack.az_port}") as channel:
        stub = external_auth_pb2_grpc.AuthorizationStub(channel)
        response = stub.Check(external_auth_pb2.CheckRequest(attributes=attributes), timeout=5)
    return int(response.status.code)


def jwt_policy(secret: str) -> dict[str, Any]:
    return {
        "jwt": {"algorithms": ["HS256"], "keys": [{"hmacSecret": {"value": secret}}]},
        "pathClaim": {"name": "path", "match": "PREFIX"},
    }


def security_group(stack: Stack, tenant: str) -> str:
    """Tenant ``tenant`` with workspace ``w`` (every namespace of c1) and group ``g``."""
    ok(stack.admin.post(f"{BASE}/tenants", json={"name": tenant, "tenant": {}}))
    workspace = {"namespaceSelector": {"names": [f"{CLUSTER}/*"]}}
    tenant_path = f"{BASE}/tenants/{tenant}"
    ok(stack.admin.post(f"{tenant_path}/workspaces", json={"name": "w", "workspace": workspace}))
    group = {"configMode": "BRIDGED"}
    ok(
        stack.admin.post(
            f"{tenant_path}/workspaces/w/securitygroups", json={"name": "g", "securityGroup": group}
        )
    )
    return f"{tenant_path}/workspaces/w/securitygroups/g"


def create_setting(stack: Stack) -> None:
    setting = {
        "authorization": {
            "mode": "CLUSTER",
            "http": {"external": {"uri": f"grpc://127.0.0.1:{stack.az_port}", "policy": "jwt"}},
        }
    }
    ok(stack.admin.post(f"{GROUP_PATH}/settings", json={"name": "s", "securitySetting": setting}))


def ext_authz_filters(stack: Stack) -> list[str]:
    config = get_envoyconfig(stack.admin, CLUSTER_PATH)
    return [f["name"] for f in config["httpFilters"] if "ext_authz" in f["name"]]


def test_5_security_setting_and_jwt_policy_with_check(stack: Stack) -> None:
    assert security_group(stack, "t") == GROUP_PATH
    create_setting(stack)
    token = mint_demo_token(SECRET, "/headers", 600)
    assert check(stack, "/headers", token) != 0  # no policy yet: unknown, denied
    ok(
        stack.admin.post(
            f"{GROUP_PATH}/extauthzpolicies",
            json={"name": "jwt", "extAuthzPolicy": jwt_policy(SECRET)},
        )
    )
    stack.converged("extauthz")
    assert check(stack, "/headers", token) == 0
    assert check(stack, "/headers/sub", token) == 0
    assert check(stack, "/get", token) != 0  # the path claim does not grant it
    assert check(stack, "/headers", None) != 0
    assert check(stack, "/headers", token, policy="other") != 0
    assert ext_authz_filters(stack) == ["envoy.filters.http.ext_authz"]

    # Another tenant with the same workspace, group and policy names: its own
    # policy, not a duplicate name that every instance would NACK.
    other_group = security_group(stack, "t2")
    other_secret = SECRET + "-tenant-2"
    ok(
        stack.admin.post(
            f"{other_group}/extauthzpolicies",
            json={"name": "jwt", "extAuthzPolicy": jwt_policy(other_secret)},
        )
    )
    stack.converged("extauthz")
    other_token = mint_demo_token(other_secret, "/headers", 600)
    assert check(stack, "/headers", other_token, policy=OTHER_TENANT_POLICY) == 0
    assert check(stack, "/headers", token, policy=OTHER_TENANT_POLICY) != 0
    assert check(stack, "/headers", other_token) != 0
    assert check(stack, "/headers", token) == 0

    # Update: a new secret; tokens signed with the old one are denied.
    current = ok(stack.admin.get(f"{GROUP_PATH}/extauthzpolicies/jwt"))
    new_secret = SECRET + "-rotated"
    update = {**jwt_policy(new_secret), "etag": current["etag"]}
    ok(stack.admin.put(f"{GROUP_PATH}/extauthzpolicies/jwt", json=update))
    stack.converged("extauthz")
    assert check(stack, "/headers", token) != 0
    new_token = mint_demo_token(new_secret, "/headers", 600)
    assert check(stack, "/headers", new_token) == 0

    # GET -> PUT round trip: the secret comes back redacted, and sending the
    # marker back keeps enforcing the stored secret.
    got = ok(stack.admin.get(f"{GROUP_PATH}/extauthzpolicies/jwt"))
    assert new_secret not in json.dumps(got)
    got["jwt"]["leewaySeconds"] = 1
    ok(stack.admin.put(f"{GROUP_PATH}/extauthzpolicies/jwt", json=got))
    stack.converged("extauthz")
    assert check(stack, "/headers", new_token) == 0

    # Delete the policy: the setting still routes to ext_authz, which denies
    # (the policy is unknown, defaultPolicy deny).
    ok(stack.admin.delete(f"{GROUP_PATH}/extauthzpolicies/jwt"))
    stack.converged("extauthz")
    assert check(stack, "/headers", new_token) != 0
    config = get_envoyconfig(stack.admin, CLUSTER_PATH)
    assert any("does not exist" in w for w in config["warnings"]), config["warnings"]
    assert ext_authz_filters(stack) == ["envoy.filters.http.ext_authz"]
    # Delete the setting: the gateway no longer calls ext_authz at all.
    ok(stack.admin.delete(f"{GROUP_PATH}/settings/s"))
    assert ext_authz_filters(stack) == []
    config = get_envoyconfig(stack.admin, CLUSTER_PATH)
    assert not [r for r in config["routes"] if r["name"].startswith("extauthz:")]
    stack.converged("extauthz")
    assert check(stack, "/headers", new_token) != 0
    assert check(stack, "/headers", other_token, policy=OTHER_TENANT_POLICY) == 0


def test_7_a_policy_the_service_would_refuse_is_never_sent(stack: Stack) -> None:
    """Forced past the API's validation by writing the store directly, as a buggy
    replica or a schema drift would: the management plane validates every snapshot
    with the service's own loader before sending it, so the status shows the
    compile error, no instance is sent (and NACKs) it, and the last good policy
    stays enforced. (A snapshot only the instance can refuse, an unresolvable
    Secret reference, is NACKed: tests/e2e/test_cluster_switches.py.)"""
    create_setting(stack)
    ok(
        stack.admin.post(
            f"{GROUP_PATH}/extauthzpolicies",
            json={"name": "jwt", "extAuthzPolicy": jwt_policy(SECRET + "-rotated")},
        )
    )
    stack.converged("extauthz")
    good = mint_demo_token(SECRET + "-rotated", "/headers", 600)
    assert check(stack, "/headers", good) == 0
    applied = {i["instance"]: i["appliedVersion"] for i in stack.status()["instances"]}
    db = Path(stack.mgmt.data_dir) / "mgmt-api.db"
    fqn = GROUP_PATH.removeprefix("/v2/") + "/extauthzpolicies/jwt"
    with sqlite3.connect(db) as conn:
        (spec_text,) = conn.execute("SELECT spec FROM resources WHERE fqn = ?", (fqn,)).fetchone()
        spec = json.loads(spec_text)
        spec["jwt"]["algorithms"] = ["none"]
        conn.execute("UPDATE resources SET spec = ? WHERE fqn = ?", (json.dumps(spec), fqn))
        conn.execute("UPDATE revision SET value = value + 1 WHERE id = 1")

    def refused() -> dict[str, Any] | None:
        status = stack.status()
        return status if "extauthz" in status.get("compileErrors", {}) else None

    status = wait_until(refused, 15, "the compile error to show in the cluster status")
    assert "algorithm" in status["compileErrors"]["extauthz"]
    assert status["desiredVersions"]["extauthz"] == ""
    for instance in status["instances"]:
        assert instance["lastResult"] != "NACK", instance  # never sent, never NACKed
        assert instance["appliedVersion"] == applied[instance["instance"]]
        if instance["kind"] == "extauthz":
            assert instance["upToDate"] is False
    # The policy's own status says the same, for its cluster.
    own = ok(stack.admin.get(f"{GROUP_PATH}/extauthzpolicies/jwt/status"))
    assert own["policyName"] == EXTAUTHZ_POLICY
    (cluster,) = own["clusters"]
    assert "algorithm" in cluster["compileError"]
    assert check(stack, "/headers", good) == 0  # the last good snapshot is still enforced
    # Repair through the API: the next snapshot is sent and ACKed again.
    current = ok(stack.admin.get(f"{GROUP_PATH}/extauthzpolicies/jwt"))
    repaired = {**jwt_policy(SECRET + "-rotated"), "etag": current["etag"]}
    ok(stack.admin.put(f"{GROUP_PATH}/extauthzpolicies/jwt", json=repaired))
    stack.converged("extauthz")


def _first_snapshot(stack: Stack, cluster: str, token: str) -> dpb.Snapshot:
    node = dpb.Node(kind="ratelimit", organization=ORG, cluster=cluster, instance="probe")
    with grpc.insecure_channel(f"127.0.0.1:{stack.mgmt.grpc_port}") as channel:
        stub = dpb_grpc.PolicyDistributionStub(channel)  # type: ignore[no-untyped-call]
        stream = stub.StreamSnapshots(
            iter([dpb.SnapshotRequest(node=node)]),
            metadata=[("authorization", f"Bearer {token}")],
            timeout=5,
        )
        snapshot: dpb.Snapshot = next(stream)
        stream.cancel()
        return snapshot


def test_8_a_cluster_a_subscriber_never_gets_cluster_b_policies(stack: Stack) -> None:
    body = {"name": "default.b-only", "backendTrafficPolicy": traffic_policy((1, "Hour"))}
    ok(stack.admin.post(f"{BASE}/clusters/{OTHER}/backendtrafficpolicies", json=body))
    token_a = load_credentials(stack.credentials[CLUSTER]["ratelimit"]).token()
    own = _first_snapshot(stack, CLUSTER, token_a)
    assert all(b"b-only" not in f.content for f in own.files)
    with pytest.raises(grpc.RpcError) as denied:
        _first_snapshot(stack, OTHER, token_a)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    token_b = load_credentials(stack.credentials[OTHER]["ratelimit"]).token()
    theirs = _first_snapshot(stack, OTHER, token_b)
    assert any(b"b-only" in f.content for f in theirs.files)


def test_8b_stream_and_rest_tokens_are_not_interchangeable(stack: Stack) -> None:
    """A stream token (seen on every connect) is no REST credential, and a REST
    token of the same key opens no stream."""
    key = load_credentials(stack.credentials[CLUSTER]["ratelimit"])
    headers = {"authorization": f"Bearer {key.token()}"}
    with stack.mgmt.client(headers=headers) as replayed:
        assert replayed.get(CLUSTER_PATH).status_code == 401
    account = f"organizations/{ORG}/clusters/{CLUSTER}/serviceaccounts/ratelimit"
    rest_token = sign_service_account(private_jwk(key), account, time.time(), 300)
    with stack.mgmt.client(headers={"authorization": f"Bearer {rest_token}"}) as rest:
        # authenticated (not 401), but the account holds no role
        assert rest.get(CLUSTER_PATH).status_code == 403
    with pytest.raises(grpc.RpcError) as denied:
        _first_snapshot(stack, CLUSTER, rest_token)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_6_enforcement_survives_the_management_plane_and_a_restart(stack: Stack) -> None:
    body = {"name": "default.web-limit", "backendTrafficPolicy": traffic_policy((3, "Minute"))}
    ok(stack.admin.post(f"{CLUSTER_PATH}/backendtrafficpolicies", json=body))
    stack.converged("ratelimit")
    stack.mgmt.stop()
    token = mint_demo_token(SECRET + "-rotated", "/headers", 600)

    def enforced_across_a_restart() -> tuple[list[int], int, int]:
        codes = [should_rate_limit(stack).overall_code for _ in range(4)]
        allowed = check(stack, "/headers", token)
        # Restart both services while the management plane is still down.
        for service in list(stack.services):
            service.stop()
            stack.services.remove(service)
        stack.start_services()
        return codes, allowed, should_rate_limit(stack).overall_code

    codes, allowed, after_restart = in_one_minute(stack, enforced_across_a_restart)
    assert codes == [OK_CODE] * 3 + [OVER]
    assert allowed == 0
    assert after_restart == OVER  # same minute, same redis counters
    codes = in_one_minute(stack, lambda: [should_rate_limit(stack).overall_code for _ in range(4)])
    assert codes == [OK_CODE] * 3 + [OVER]
    assert check(stack, "/headers", token) == 0
    assert check(stack, "/get", token) != 0
    assert os.path.islink(stack.tmp / "ratelimit-cache" / "current")
