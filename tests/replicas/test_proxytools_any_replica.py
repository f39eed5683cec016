"""Three mgmt-api replicas on one real PostgreSQL, an agent behind a TCP front, a real Envoy.

The agent reaches the replicas through :class:`TcpFront` (in production a
Kubernetes Service), so its tunnel lands on one replica; a proxytools call
to any replica is forwarded, signed with the shared secret, to the one that
holds it. Then the holder is killed with SIGKILL during a forwarded log
stream: the stream ends (it does not hang), the agent reconnects through the
front to a live replica, and the next call answers through every live
replica. Periodic jobs run once per period across the replicas, and no
write a replica acknowledged is lost when one of them is killed.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.agent.fleet import ORG, Agent, bootstrap
from tests.distribution.test_replicas import database  # noqa: F401 - a fixture
from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.certs import CertificateAuthority
from tests.support.envoy import EnvoyProcess
from tests.support.postgres import PostgresServer
from tests.support.processes import wait_until
from tests.support.tcp_front import TcpFront

CLUSTER = "a"
WEB = {"namespace": "shop", "workload": "web"}
SERVERINFO = f"/v2/organizations/{ORG}/clusters/{CLUSTER}/proxytools/serverstats"
STREAMLOGS = f"/v2/organizations/{ORG}/clusters/{CLUSTER}/proxytools/streamlogs"
PURGE_RAN = re.compile(r'"msg": ?"periodic job ran".*"job": ?"purge-expired-logins"')


class Mesh:
    """The replicas, the front, one Envoy (shop/web web-1) and the agent of cluster ``a``."""

    def __init__(self, database_url: str, tmp: Path, mp: pytest.MonkeyPatch) -> None:
        mp.setenv("MESHPLANE_REPLICA_SECRET", "replicas-test-shared-secret")
        mp.setenv("MESHPLANE_PURGE_INTERVAL", "1s")
        mp.setenv("MESHPLANE_PROXYTOOLS_TIMEOUT", "5s")
        self.replicas: list[MgmtServer] = []
        self.envoy: EnvoyProcess | None = None
        self.agent: Agent | None = None
        self.front: TcpFront | None = None
        for _ in range(3):
            self.replicas.append(MgmtServer(database_url=database_url).start())
        self.admin = self.replicas[0].admin()
        ok(self.admin.post("/v2/organizations", json={"name": ORG, "organization": {}}))
        created = ok(
            self.admin.post(
                f"/v2/organizations/{ORG}/clusters", json={"name": CLUSTER, "cluster": {}}
            )
        )
        credentials = tmp / "credentials.json"
        secret = created["installTemplate"]["helm"]["secrets"]["clusterServiceAccount"]
        credentials.write_text(json.dumps(secret))
        tls = CertificateAuthority(tmp).issue("envoy")
        self.envoy = EnvoyProcess(bootstrap("web-1", "web", tls), directory=tmp / "web-1").start()
        proxies = tmp / "proxies.json"
        entry = {
            **WEB,
            "instance": "web-1",
            "adminAddress": self.envoy.admin_address,
            "logFile": str(self.envoy.log_path),
        }
        proxies.write_text(json.dumps({"proxies": [entry]}))
        self.front = TcpFront([r.grpc_port for r in self.replicas])
        self.agent = Agent(
            tmp,
            self.replicas[0],
            CLUSTER,
            credentials,
            proxies,
            control_plane=f"grpc://127.0.0.1:{self.front.port}",
        ).start()
        wait_until(self.agent.ready, timeout=60, what="the agent to connect")

    def live(self) -> list[MgmtServer]:
        return [r for r in self.replicas if r.proc is not None]

    def holder(self, database_url: str) -> MgmtServer:
        """The replica whose registry row holds the cluster's tunnel."""
        url = database_url.replace("postgresql+psycopg://", "postgresql://")

        def find() -> MgmtServer | None:
            with psycopg.connect(url) as conn:
                rows = conn.execute("SELECT address, clusters FROM replicas").fetchall()
            for address, clusters in rows:
                if f"organizations/{ORG}/clusters/{CLUSTER}" in json.loads(clusters):
                    for replica in self.live():
                        if address.endswith(f":{replica.port}"):
                            return replica
            return None

        found: MgmtServer = wait_until(find, timeout=60, what="the tunnel's replica registered")
        return found

    def close(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        if self.front is not None:
            self.front.close()
        if self.envoy is not None:
            self.envoy.stop()
        if hasattr(self, "admin"):
            self.admin.close()
        for replica in self.replicas:
            replica.close()


@pytest.fixture(scope="module")
def mesh(
    database: tuple[PostgresServer, str],  # noqa: F811 - the imported fixture
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Mesh]:
    mp = pytest.MonkeyPatch()
    mesh: Mesh | None = None
    try:
        mesh = Mesh(database[1], tmp_path_factory.mktemp("mesh"), mp)
        yield mesh
    finally:
        mp.undo()
        if mesh is not None:
            mesh.close()


def _answers(replica: MgmtServer, timeout: float = 60) -> dict[str, Any]:
    """The first 200 of serverstats through ``replica`` (registry rows may be catching up)."""
    last: list[httpx.Response] = []

    def attempt() -> dict[str, Any] | None:
        with replica.admin() as client:
            response = client.post(SERVERINFO, json={**WEB, "filter": "server.live"})
        last[:] = [response]
        return response.json() if response.status_code == 200 else None

    try:
        answer: dict[str, Any] = wait_until(attempt, timeout=timeout, what="serverstats answers")
    except AssertionError:
        raise AssertionError(f"{last[0].status_code} {last[0].text[:500]}") from None
    return answer


def test_a_proxytools_call_through_every_replica_answers(
    mesh: Mesh,
    database: tuple[PostgresServer, str],  # noqa: F811
) -> None:
    holder = mesh.holder(database[1])
    for replica in mesh.replicas:
        answer = _answers(replica)
        assert [item["instance"] for item in answer["instances"]] == ["web-1"]
        assert "server.live" in json.dumps(answer)
    others = [r for r in mesh.replicas if r is not holder]
    for replica in others:  # those two answered through the holder, signed
        assert "serving a forwarded proxytools call" in holder.log_path.read_text()
        with httpx.Client(base_url=replica.url, timeout=30) as anonymous:
            forged = anonymous.post(
                "/internal/v1/tunnelcalls",
                content=b'{"organization":"diag","cluster":"a","caller":"x","call":""}',
                headers={"x-meshplane-replica-signature": "t=1,v1=00"},
            )
        assert forged.status_code == 401, forged.text
    # A forwarded write is audited once, by the replica the caller reached.
    other = others[0]
    levels = f"/v2/organizations/{ORG}/clusters/{CLUSTER}/proxytools/loggerlevels"
    with other.admin() as client:
        changed = ok(client.put(levels, json={**WEB, "loggers": {"upstream": "debug"}}))
        assert changed["instances"][0]["levels"]["upstream"] == "debug"
        audit = ok(client.get(f"/v2/organizations/{ORG}/auditlogs", params={"pageSize": 1000}))
    sets = [e for e in audit["auditLogs"] if e["operation"] == "SET_LOGGER_LEVELS"]
    assert len(sets) == 1 and sets[0]["properties"]["outcome"] == {"web-1": "OK"}, sets


def test_kill_9_of_the_tunnel_holder_during_a_log_stream_then_the_next_call_answers(
    mesh: Mesh,
    database: tuple[PostgresServer, str],  # noqa: F811
) -> None:
    holder = mesh.holder(database[1])
    reader = next(r for r in mesh.live() if r is not holder)
    lines: list[dict[str, Any]] = []
    ended = threading.Event()
    first = threading.Event()

    def stream() -> None:
        body = {**WEB, "follow": True, "tailLines": 5}
        with reader.admin() as client, client.stream("POST", STREAMLOGS, json=body) as response:
            assert response.status_code == 200
            for raw in response.iter_lines():
                lines.append(json.loads(raw))
                first.set()
        ended.set()

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    assert first.wait(60), "no log line through the forwarded stream"
    assert "line" in lines[0]
    holder.kill9()
    assert ended.wait(60), "the forwarded stream did not end when its replica died"
    thread.join(timeout=10)
    assert "error" in lines[-1], lines[-1]  # the stream says why it ended
    # The agent reconnects through the front to a live replica; every live one answers.
    assert mesh.holder(database[1]) is not holder
    for replica in mesh.live():
        assert _answers(replica)["instances"][0]["instance"] == "web-1"


def test_a_periodic_job_runs_once_per_period_across_replicas(mesh: Mesh) -> None:
    def periods() -> list[int]:
        found: list[int] = []
        for replica in mesh.replicas:
            for line in replica.log_path.read_text().splitlines():
                if PURGE_RAN.search(line):
                    found.append(json.loads(line)["period"])
        return found

    wait_until(lambda: len(set(periods())) >= 5, timeout=60, what="five purge periods")
    seen = periods()
    assert len(seen) == len(set(seen)), sorted(seen)  # no period ran twice
    runners = set()
    for replica in mesh.replicas:
        if PURGE_RAN.search(replica.log_path.read_text()):
            runners.add(replica.port)
    assert len(runners) >= 1


def test_no_acknowledged_write_is_lost_when_a_replica_is_killed(mesh: Mesh) -> None:
    live = mesh.live()
    assert len(live) >= 2
    victim, survivor = live[0], live[-1]
    acknowledged: list[str] = []
    lock = threading.Lock()

    def write(replica: MgmtServer, prefix: str) -> None:
        with replica.admin() as client:
            for index in range(40):
                name = f"{prefix}-{index}"
                try:
                    response = client.post(
                        f"/v2/organizations/{ORG}/teams", json={"name": name, "team": {}}
                    )
                except httpx.HTTPError:
                    return  # the replica died mid-request: not acknowledged
                if response.status_code == 200:
                    with lock:
                        acknowledged.append(name)

    threads = [
        threading.Thread(target=write, args=(replica, f"t{i}"), daemon=True)
        for i, replica in enumerate(live)
    ]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(acknowledged) >= 10, timeout=60, what="some writes acknowledged")
    victim.kill9()
    for thread in threads:
        thread.join(timeout=120)
    with survivor.admin() as client:
        teams = ok(client.get(f"/v2/organizations/{ORG}/teams", params={"pageSize": 1000}))
    stored = {team["fqn"].rsplit("/", 1)[-1] for team in teams["teams"]}
    assert set(acknowledged) <= stored, set(acknowledged) - stored
