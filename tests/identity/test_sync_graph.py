"""Microsoft Graph sync against a Graph-shaped STAND-IN server.

The real Graph cannot be reached from here; the stand-in reproduces its
paging (absolute ``@odata.nextLink``) and throttling (429/503 + Retry-After).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mgmt_api.identity.config import AzureSyncConfig
from mgmt_api.identity.secrets import SecretRef
from mgmt_api.identity.sync.graph import GraphSource
from mgmt_api.identity.sync.runner import DirectorySync
from mgmt_api.identity.sync.store import InMemoryDirectoryStore
from tests.support.graph_server import CLIENT_ID, CLIENT_SECRET, TENANT, GraphStandIn

ORG = "acme"
USERS: list[dict[str, Any]] = [
    {
        "id": f"u{i}",
        "userPrincipalName": f"user{i}@acme.test",
        "mail": f"user{i}@acme.test",
        "displayName": f"User {i}",
    }
    for i in range(5)
]
GROUPS: list[dict[str, Any]] = [
    {"id": "g-devs", "displayName": "Developers", "description": "All developers"},
    {"id": "g-ops", "displayName": "Operations", "description": None},
    {"id": "g-all", "displayName": "Everyone", "description": None},
]
MEMBERS = {
    "g-devs": ["u0", "u1", "u2"],
    "g-ops": ["u3", "device-not-a-user"],
    "g-all": ["g-devs", "g-ops", "u4"],
}


@pytest.fixture
def graph() -> Iterator[GraphStandIn]:
    with GraphStandIn() as server:
        server.set_directory(USERS, GROUPS, MEMBERS)
        yield server


class RecordingSleep:
    """Records the waits asked for without waiting, so Retry-After is observable but cheap."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def graph_source(
    server: GraphStandIn,
    http: httpx.AsyncClient,
    tmp_path: Path,
    sleep: RecordingSleep,
    max_retry_after_s: float = 120.0,
) -> GraphSource:
    secret = tmp_path / "graph-secret"
    secret.write_text(CLIENT_SECRET)
    config = AzureSyncConfig(
        client_id=CLIENT_ID,
        tenant_id=TENANT,
        client_secret=SecretRef("file", str(secret)),
        graph_base_url=server.base_url,
        authority_base_url=server.base_url,
    )
    return GraphSource(config, http, sleep=sleep, max_retry_after_s=max_retry_after_s)


async def test_graph_sync_follows_next_links_over_every_page(
    graph: GraphStandIn, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    store = InMemoryDirectoryStore()
    result = await DirectorySync(
        ORG, graph_source(graph, http, tmp_path, RecordingSleep()), store, interval_s=60
    ).run_now()
    assert result.ok, result.error
    snap = store.snapshot(ORG, "AZURE")
    assert [u.id for u in snap.users] == ["u0", "u1", "u2", "u3", "u4"]  # 3 pages of 2
    assert snap.users[0].login_name == "user0@acme.test"
    teams = {t.id: t for t in snap.teams}
    assert teams["g-devs"].member_user_ids == {"u0", "u1", "u2"}  # 2 pages of members
    assert teams["g-ops"].member_user_ids == {"u3"}
    assert result.dropped_references == 1  # the device is not a user of the directory
    assert teams["g-all"].member_team_ids == {"g-devs", "g-ops"}
    assert teams["g-all"].member_user_ids == {"u4"}
    user_pages = [p for m, p in graph.state.requests if m == "GET" and p.startswith("/v1.0/users")]
    assert len(user_pages) == 3 and "$skiptoken=4" in user_pages[-1]


async def test_graph_throttling_honours_retry_after(
    graph: GraphStandIn, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    graph.throttle("/v1.0/users", 2, status=429, retry_after="3")
    graph.throttle("/v1.0/groups/g-devs/members", 1, status=503, retry_after="7")
    sleep = RecordingSleep()
    store = InMemoryDirectoryStore()
    result = await DirectorySync(
        ORG, graph_source(graph, http, tmp_path, sleep), store, interval_s=60
    ).run_now()
    assert result.ok, result.error
    assert sleep.waits == [3.0, 3.0, 7.0]
    assert len(store.snapshot(ORG, "AZURE").users) == 5


async def test_throttling_beyond_the_bound_fails_and_keeps_the_last_good_state(
    graph: GraphStandIn, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    store = InMemoryDirectoryStore()
    sync = DirectorySync(
        ORG,
        graph_source(graph, http, tmp_path, RecordingSleep(), max_retry_after_s=60),
        store,
        interval_s=60,
    )
    assert (await sync.run_now()).ok
    before = store.snapshot(ORG, "AZURE")

    graph.set_directory(USERS[:1], [], {})  # would delete almost everything...
    graph.throttle("/v1.0/groups", 1, status=429, retry_after="3600")  # ...but the listing fails
    result = await sync.run_now()
    assert not result.ok and result.error is not None and "3600" in result.error
    assert store.snapshot(ORG, "AZURE") == before
    assert sync.last_success is not None and sync.last_success.ok


async def test_a_failing_page_midway_applies_nothing(
    graph: GraphStandIn, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    store = InMemoryDirectoryStore()
    sync = DirectorySync(
        ORG, graph_source(graph, http, tmp_path, RecordingSleep()), store, interval_s=60
    )
    assert (await sync.run_now()).ok
    before = store.snapshot(ORG, "AZURE")
    graph.set_directory(USERS[:2], GROUPS, MEMBERS)
    graph.break_path("/v1.0/groups/g-ops/members")
    result = await sync.run_now()
    assert not result.ok and "500" in (result.error or "")
    assert store.snapshot(ORG, "AZURE") == before


async def test_next_link_to_another_host_is_not_followed(
    graph: GraphStandIn, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    graph.state.rogue_next_link = True
    store = InMemoryDirectoryStore()
    result = await DirectorySync(
        ORG, graph_source(graph, http, tmp_path, RecordingSleep()), store, interval_s=60
    ).run_now()
    assert not result.ok and "another host" in (result.error or "")
    assert store.snapshot(ORG, "AZURE").users == ()


async def test_wrong_client_secret_is_reported_without_the_secret(
    graph: GraphStandIn, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    source = graph_source(graph, http, tmp_path, RecordingSleep())
    (tmp_path / "graph-secret").write_text("not-the-secret")
    result = await DirectorySync(ORG, source, InMemoryDirectoryStore(), interval_s=60).run_now()
    assert not result.ok
    assert "invalid_client" in (result.error or "") and "not-the-secret" not in (result.error or "")
