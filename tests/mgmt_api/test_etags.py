"""Optimistic concurrency: etags required, stale ones refused, one winner per race."""

from __future__ import annotations

import threading

import httpx

from tests.mgmt_api.harness import MgmtServer, err, ok


def test_put_requires_the_current_etag(admin: httpx.Client, org: str) -> None:
    path = f"/v2/organizations/{org}/tenants"
    t = ok(admin.post(path, json={"name": "t1", "tenant": {"displayName": "one"}}))
    body = err(admin.put(f"{path}/t1", json={"displayName": "two"}), 400, "INVALID_ARGUMENT")
    assert body["message"].startswith("etag:")
    updated = ok(admin.put(f"{path}/t1", json={"displayName": "two", "etag": t["etag"]}))
    assert updated["etag"] != t["etag"] and updated["displayName"] == "two"
    assert updated["createTime"] == t["createTime"]
    err(admin.put(f"{path}/t1", json={"displayName": "three", "etag": t["etag"]}), 409, "ABORTED")
    assert ok(admin.get(f"{path}/t1"))["displayName"] == "two"
    err(admin.put(f"{path}/nope", json={"etag": t["etag"]}), 404, "NOT_FOUND")


def test_output_only_fields_are_ignored(admin: httpx.Client, org: str) -> None:
    path = f"/v2/organizations/{org}/clusters"
    c = ok(
        admin.post(
            path,
            json={
                "name": "c1",
                "cluster": {
                    "namespaces": [{"name": "evil"}],
                    "state": {"provider": "X"},
                    "fqn": "organizations/x/clusters/y",
                    "installTemplate": {"message": "m", "helm": {}},
                },
            },
        )
    )
    assert c["fqn"] == f"organizations/{org}/clusters/c1"
    got = ok(admin.get(f"{path}/c1"))
    assert got["namespaces"] == [] and "state" not in got and "installTemplate" not in got
    c2 = ok(
        admin.put(
            f"{path}/c1",
            json={
                **got,
                "network": "vpc-1",
                "namespaces": [{"name": "x"}],
                "state": {"provider": "Y"},
                "fqn": "bogus",
            },
        )
    )
    assert c2["network"] == "vpc-1" and c2["namespaces"] == [] and "state" not in c2
    assert c2["fqn"] == f"organizations/{org}/clusters/c1"


def test_concurrent_puts_with_the_same_etag_have_one_winner(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    path = f"/v2/organizations/{org}/tenants"
    for round_ in range(3):
        name = f"race{round_}"
        t = ok(admin.post(path, json={"name": name, "tenant": {}}))
        barrier = threading.Barrier(12)
        statuses: list[int] = []
        lock = threading.Lock()

        def writer(
            i: int,
            etag: str = t["etag"],
            name: str = name,
            barrier: threading.Barrier = barrier,
            lock: threading.Lock = lock,
            statuses: list[int] = statuses,
        ) -> None:
            with server.admin() as c:
                c.get("/v2/organizations")  # warm the connection and the auth cache
                barrier.wait()
                r = c.put(f"{path}/{name}", json={"displayName": f"w{i}", "etag": etag})
            with lock:
                statuses.append(r.status_code)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(12)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert sorted(statuses) == [200] + [409] * 11, statuses
