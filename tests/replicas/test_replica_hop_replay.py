"""The hop between replicas against a real mgmt-api over HTTPS, with a real agent's tunnel.

The test plays the other replica: it holds the shared secret and signs a
forwarded proxytools call for the replica that holds the agent's tunnel (its
id from the replica registry). That call is served once: the same bytes again,
at once or from several connections at the same time, are refused, and so are
the call signed for another replica and malformed signature headers (401 with
the error body; never a 500, and the server keeps serving).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import sqlite3
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from meshplane.proto.tunnel.v1 import tunnel_pb2 as pb
from mgmt_api.domain import replicas as rules
from mgmt_api.service.replicas import FORWARD_PATH
from tests.agent.fleet import ORG, Agent
from tests.mgmt_api.harness import MgmtServer, err, ok
from tests.support.certs import CertificateAuthority
from tests.support.processes import wait_until

SECRET = "replica-hop-test-shared-secret"
CLUSTER = "a"
ANOTHER_REPLICA = "0123456789abcdef0123456789abcdef"


class Holder:
    """One mgmt-api (HTTPS, the replica secret set) and the agent whose tunnel it holds."""

    def __init__(self, tmp: Path) -> None:
        ca = CertificateAuthority(tmp)
        issued = ca.issue("mgmt-api")
        self.server = MgmtServer(
            env={"MESHPLANE_REPLICA_SECRET": SECRET},
            extra_args=("--tls-cert", str(issued.cert), "--tls-key", str(issued.key)),
            tls_verify=ssl.create_default_context(cafile=str(ca.path)),
        )
        self.agent: Agent | None = None
        self.server.start()
        with self.server.admin() as admin:
            ok(admin.post("/v2/organizations", json={"name": ORG, "organization": {}}))
            created = ok(
                admin.post(
                    f"/v2/organizations/{ORG}/clusters", json={"name": CLUSTER, "cluster": {}}
                )
            )
        credentials = tmp / "credentials.json"
        secret = created["installTemplate"]["helm"]["secrets"]["clusterServiceAccount"]
        credentials.write_text(json.dumps(secret))
        proxies = tmp / "proxies.json"
        proxies.write_text(json.dumps({"proxies": []}))
        self.agent = Agent(tmp, self.server, CLUSTER, credentials, proxies).start()
        wait_until(self.agent.ready, timeout=60, what="the agent to connect")
        self.replica_id: str = wait_until(self._holder_id, timeout=60, what="the registry row")

    def _holder_id(self) -> str | None:
        database = Path(self.server.data_dir) / "mgmt-api.db"
        with sqlite3.connect(database) as conn:
            rows = conn.execute("SELECT replica_id, clusters FROM replicas").fetchall()
        for replica, clusters in rows:
            if f"organizations/{ORG}/clusters/{CLUSTER}" in json.loads(clusters):
                return str(replica)
        return None

    def post(self, body: bytes, signature: str | bytes) -> httpx.Response:
        # As bytes: the malformed signatures are not all text (httpx sends str as ASCII).
        raw = signature.encode("ascii") if isinstance(signature, str) else signature
        headers = {rules.SIGNATURE_HEADER.encode(): raw, b"content-type": b"application/json"}
        with httpx.Client(base_url=self.server.url, verify=self.server.verify, timeout=30) as c:
            return c.post(FORWARD_PATH, content=body, headers=headers)

    def close(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        self.server.close()


@pytest.fixture(scope="module")
def holder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Holder]:
    running: Holder | None = None
    try:
        running = Holder(tmp_path_factory.mktemp("hop"))
        yield running
    finally:
        if running is not None:
            running.close()


def _body() -> bytes:
    call = pb.Call(
        target=pb.Workload(namespace="shop", workload="web"),
        timeout_ms=5000,
        server_stats=pb.ServerStats(filter="server.live"),
    )
    forwarded = {
        "organization": ORG,
        "cluster": CLUSTER,
        "caller": "organizations/diag/users/admin",
        "from": "the-test",
        "call": base64.b64encode(call.SerializeToString()).decode(),
    }
    return json.dumps(forwarded).encode()


def _sign(body: bytes, target: str) -> str:
    hop = rules.Hop("POST", FORWARD_PATH, body)
    return rules.sign(
        SECRET.encode(), hop, target=target, now=time.time(), nonce=secrets.token_hex(16)
    )


def _served(response: httpx.Response) -> list[pb.Reply]:
    """The agent's replies of a served call (the last one says the call is done)."""
    assert response.status_code == 200, (response.status_code, response.text)
    replies = [pb.Reply.FromString(f) for f in rules.FrameReader().feed(response.content)]
    assert replies and replies[-1].WhichOneof("kind") == "done", replies
    return replies


def _refused(response: httpx.Response) -> None:
    err(response, 401, "UNAUTHENTICATED")
    assert SECRET not in response.text


def test_one_signed_call_is_served_once_and_its_replay_is_refused(holder: Holder) -> None:
    body = _body()
    signature = _sign(body, holder.replica_id)
    _served(holder.post(body, signature))
    for _ in range(3):
        _refused(holder.post(body, signature))
    # The same signature over another body (a changed call) is refused as well.
    _refused(holder.post(body.replace(b"shop", b"kube"), signature))


def test_concurrent_copies_of_one_signed_call_are_served_at_most_once(holder: Holder) -> None:
    body = _body()
    signature = _sign(body, holder.replica_id)
    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(lambda _i: holder.post(body, signature), range(6)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200, 401, 401, 401, 401, 401], statuses
    for answer in answers:
        _served(answer) if answer.status_code == 200 else _refused(answer)


def test_a_call_signed_for_another_replica_is_refused(holder: Holder) -> None:
    body = _body()
    _refused(holder.post(body, _sign(body, ANOTHER_REPLICA)))
    # Rewriting the header's target to this replica breaks the MAC.
    retargeted = _sign(body, ANOTHER_REPLICA).replace(ANOTHER_REPLICA, holder.replica_id)
    _refused(holder.post(body, retargeted))


@pytest.mark.parametrize(
    "signature",
    [
        b"t=\xb2,v1=00",  # the reproduction: "\xb2" passed isdigit() and int() raised (500)
        "t=\u00b2,v1=00".encode(),
        b"t=1,v1=00",  # the old shape
        b"t=,n=,r=,v1=",
        b"",
        b"garbage",
        b"t=99999999999999999999,n=" + b"a" * 32 + b",r=x,v1=" + b"0" * 64,
        b"t=1" + b"0" * 4000,  # oversized
        "t=\u0661\u0662\u0663,n=x,r=y,v1=z".encode(),  # Arabic-Indic digits, UTF-8 bytes
    ],
)
def test_a_malformed_signature_is_a_401_never_a_500(holder: Holder, signature: bytes) -> None:
    _refused(holder.post(_body(), signature))


def test_no_signature_at_all_is_a_401_and_the_server_keeps_serving(holder: Holder) -> None:
    with httpx.Client(base_url=holder.server.url, verify=holder.server.verify, timeout=30) as c:
        _refused(c.post(FORWARD_PATH, content=_body()))
    body = _body()
    _served(holder.post(body, _sign(body, holder.replica_id)))
    log = holder.server.log_path.read_text()
    assert "Traceback" not in log
    assert '"reason": "replayed"' in log or '"reason":"replayed"' in log


@pytest.mark.parametrize(
    ("listen", "address"),
    [
        ("0.0.0.0:0", None),  # derived from --listen without TLS: http://<host name>
        ("127.0.0.1:0", "http://10.0.0.7:8443"),
    ],
    ids=["derived", "given"],
)
def test_a_plain_http_hop_off_this_machine_stops_the_start(
    listen: str, address: str | None, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "MESHPLANE_DATA_DIR": str(tmp_path),
        "MESHPLANE_REPLICA_SECRET": SECRET,
        "COLUMNS": "1000",  # the error box unwrapped
    }
    env.pop("MESHPLANE_REPLICA_ADDRESS", None)
    if address is not None:
        env["MESHPLANE_REPLICA_ADDRESS"] = address
    done = subprocess.run(
        [sys.executable, "-m", "mgmt_api.cli", "serve", "--listen", listen, "--grpc-listen", "off"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "MESHPLANE_REPLICA_ADDRESS" in done.stderr and "plain HTTP" in done.stderr
    assert SECRET not in done.stderr
