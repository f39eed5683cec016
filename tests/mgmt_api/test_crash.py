"""kill -9 of the server during a stream of writes: every 200-answered write survives."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import pytest

from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.net import free_port

WRITERS = 4


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_acknowledged_writes_survive_kill_9(
    backend: str, database_factory: Callable[[str], str | None]
) -> None:
    srv = MgmtServer(database_factory(backend)).start()
    try:
        with srv.admin() as admin:
            ok(admin.post("/v2/organizations", json={"name": "crash", "organization": {}}))
            for w in range(WRITERS):
                ok(
                    admin.post(
                        "/v2/organizations/crash/tenants",
                        json={"name": f"w{w}", "tenant": {"displayName": "0"}},
                    )
                )
        created: list[list[str]] = [[] for _ in range(WRITERS)]
        acked: list[int] = [0] * WRITERS
        stop = threading.Event()

        def writer(w: int) -> None:
            with srv.admin() as c:
                etag = ok(c.get(f"/v2/organizations/crash/tenants/w{w}"))["etag"]
                i = 0
                while not stop.is_set():
                    i += 1
                    try:
                        r = c.post(
                            "/v2/organizations/crash/tenants",
                            json={"name": f"w{w}-{i}", "tenant": {}},
                        )
                        if r.status_code == 200:
                            created[w].append(f"w{w}-{i}")
                        r = c.put(
                            f"/v2/organizations/crash/tenants/w{w}",
                            json={"displayName": str(i), "etag": etag},
                        )
                        if r.status_code == 200:
                            acked[w] = i
                            etag = r.json()["etag"]
                    except httpx.HTTPError:
                        return  # the server died mid-request: that write was never acknowledged

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        srv.kill9()
        stop.set()
        for t in threads:
            t.join()
        assert sum(len(c) for c in created) > 10, "too few writes to be a meaningful test"

        srv.port = free_port()  # restart on a fresh port, same store
        srv.start()
        with srv.admin() as admin:
            names = set()
            token = ""
            while True:
                page = ok(
                    admin.get(
                        "/v2/organizations/crash/tenants",
                        params={"pageSize": 1000, "pageToken": token},
                    )
                )
                names |= {t["fqn"].rsplit("/", 1)[1] for t in page["tenants"]}
                token = page["nextPageToken"]
                if not token:
                    break
            for w in range(WRITERS):
                missing = set(created[w]) - names
                assert not missing, f"acknowledged creates lost: {sorted(missing)[:5]}"
                stored = int(ok(admin.get(f"/v2/organizations/crash/tenants/w{w}"))["displayName"])
                assert stored >= acked[w], (w, stored, acked[w])
    finally:
        srv.close()
