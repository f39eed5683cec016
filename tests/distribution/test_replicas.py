"""Two mgmt-api replicas on one real PostgreSQL: a write on one reaches the other's streams.

Each commit sends ``NOTIFY``; every replica ``LISTEN``s and wakes its policy
streams. The replicas run with the safety-net poll set to an hour
(``MESHPLANE_REVISION_POLL``), so a snapshot that arrives at all arrived
through a notification, not a poll. The listener's connection is then killed
from the server side: it reconnects and notifications flow again.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import psycopg
import pytest

from meshplane.control_plane import ServiceAccountKey, load_credentials
from meshplane.proto.distribution.v1 import distribution_pb2 as dpb
from meshplane.proto.distribution.v1 import distribution_pb2_grpc as dpb_grpc
from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.cluster_credentials import write_credential
from tests.support.postgres import PostgresServer, find_bin_dir
from tests.support.processes import wait_until

ORG, CLUSTER = "replicas", "c"
BASE = f"/v2/organizations/{ORG}"
LISTENERS = "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN meshplane_revision'"


@pytest.fixture(scope="module")
def database() -> Iterator[tuple[PostgresServer, str]]:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.skip("no PostgreSQL binaries (initdb/postgres) on this machine")
    server = PostgresServer(bin_dir).start()
    yield server, server.new_database()
    server.stop()


@pytest.fixture(scope="module")
def replicas(
    database: tuple[PostgresServer, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[MgmtServer, MgmtServer]]:
    mp = pytest.MonkeyPatch()
    mp.setenv("MESHPLANE_REVISION_POLL", "1h")
    started: list[MgmtServer] = []
    try:
        for _ in range(2):
            started.append(MgmtServer(database_url=database[1]).start())
        yield started[0], started[1]
    finally:
        for server in started:
            server.close()
        mp.undo()


class Stream:
    """A ratelimit subscriber's stream to one replica, read on a thread."""

    def __init__(self, server: MgmtServer, key: ServiceAccountKey) -> None:
        self.snapshots: queue.Queue[dpb.Snapshot] = queue.Queue()
        self._channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        stub = dpb_grpc.PolicyDistributionStub(self._channel)  # type: ignore[no-untyped-call]
        node = dpb.Node(kind="ratelimit", organization=ORG, cluster=CLUSTER, instance="probe")
        self._requests: queue.Queue[dpb.SnapshotRequest | None] = queue.Queue()
        self._requests.put(dpb.SnapshotRequest(node=node))
        self._calls = stub.StreamSnapshots(
            iter(self._requests.get, None), metadata=[("authorization", f"Bearer {key.token()}")]
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for snapshot in self._calls:
                self.snapshots.put(snapshot)
                self._requests.put(
                    dpb.SnapshotRequest(
                        version_info=snapshot.version_info, response_nonce=snapshot.nonce
                    )
                )
        except grpc.RpcError:
            pass

    def next_containing(self, needle: bytes, timeout: float = 60.0) -> dpb.Snapshot:
        while True:
            snapshot = self.snapshots.get(timeout=timeout)
            if any(needle in f.content for f in snapshot.files):
                return snapshot

    def close(self) -> None:
        self._requests.put(None)
        self._calls.cancel()
        self._channel.close()
        self._thread.join(timeout=10)


def _policy(requests: int) -> dict[str, Any]:
    rules = [{"limit": {"requests": requests, "unit": "Minute"}}]
    return {
        "spec": {
            "targetRef": {"name": "web"},
            "rateLimit": {"type": "Global", "global": {"rules": rules}},
        }
    }


def _credentials(created: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("creds") / "cluster.json"
    return load_credentials(write_credential(created, "ratelimit", path))


def test_a_write_on_one_replica_reaches_the_streams_of_the_other(
    replicas: tuple[MgmtServer, MgmtServer],
    database: tuple[PostgresServer, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    writer, other = replicas
    with writer.admin() as admin:
        ok(admin.post("/v2/organizations", json={"name": ORG, "organization": {}}))
        created = ok(admin.post(f"{BASE}/clusters", json={"name": CLUSTER, "cluster": {}}))
        stream = Stream(other, _credentials(created, tmp_path_factory))
        try:
            stream.snapshots.get(timeout=60)  # the current (empty) snapshot
            body = {"name": "default.web", "backendTrafficPolicy": _policy(7)}
            ok(admin.post(f"{BASE}/clusters/{CLUSTER}/backendtrafficpolicies", json=body))
            stream.next_containing(b"requests_per_unit: 7")

            # The listener's connection dies (a failover, an idle-session killer):
            # it reconnects, and the next write reaches the other replica again.
            url = database[1].replace("postgresql+psycopg://", "postgresql://")
            with psycopg.connect(url, autocommit=True) as conn:
                listeners = [row[0] for row in conn.execute(LISTENERS)]
                assert len(listeners) == 2  # one per replica
                for pid in listeners:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))

                def relistening() -> bool:
                    return len(list(conn.execute(LISTENERS))) == 2

                wait_until(relistening, timeout=60, what="both listeners reconnected")
            path = f"{BASE}/clusters/{CLUSTER}/backendtrafficpolicies/default.web"
            current = ok(admin.get(path))
            ok(admin.put(path, json={**_policy(9), "etag": current["etag"]}))
            stream.next_containing(b"requests_per_unit: 9")
        finally:
            stream.close()
