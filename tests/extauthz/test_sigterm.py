"""The real CLI with 2 workers: metrics summed across workers, SIGTERM drain."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc

from tests.support.net import free_port, wait_for_port

from .cases import GOOD
from .jwtkit import HS_SECRET, claims, ec_key, make_token, public_jwk
from .keyserver import KeyServer
from .metricsutil import sample
from .support import GrpcClient, check_request, http_check


def write_config(tmp_path: Path, keys: KeyServer) -> Path:
    path = tmp_path / "serve.yaml"
    path.write_text(
        f"""
defaultPolicy: hs
policies:
  - name: hs
    jwt:
      algorithms: [HS256]
      keys:
        - hmacSecret: {{env: EXTAUTHZ_TEST_SECRET}}
    pathClaim: {{name: path}}
  - name: slow
    jwt:
      algorithms: [ES256]
      keys:
        - jwks:
            uri: {keys.url("/slow")}
            minRefetchSeconds: 0
            kidMissWaitSeconds: 4
            timeoutSeconds: 5
"""
    )
    return path


def wait_serving(client: GrpcClient, deadline: float) -> None:
    request = check_request("/headers", {"authorization": f"Bearer {GOOD}"})
    while True:
        try:
            if client.check(request).status.code == 0:
                return
        except grpc.RpcError:
            pass
        assert time.monotonic() < deadline, "server did not come up"
        time.sleep(0.1)


def test_two_workers_metrics_and_sigterm_drain(tmp_path: Path) -> None:
    with KeyServer() as keys:
        keys.documents["/slow"] = {"keys": [public_jwk(ec_key(0), "k1")]}
        config = write_config(tmp_path, keys)
        port, http_port, metrics_port = free_port(), free_port(), free_port()
        env = {**os.environ, "EXTAUTHZ_TEST_SECRET": HS_SECRET.decode()}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "extauthz.cli",
                "serve",
                "--config",
                str(config),
                "--listen",
                f"127.0.0.1:{port}",
                "--workers",
                "2",
                "--http-listen",
                f"127.0.0.1:{http_port}",
                "--metrics-listen",
                f"127.0.0.1:{metrics_port}",
                "--grace-seconds",
                "8",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            wait_for_port(port, timeout=30)
            wait_for_port(http_port, timeout=30)
            clients = [GrpcClient(port) for _ in range(6)]
            deadline = time.monotonic() + 30
            for client in clients:
                wait_serving(client, deadline)
            wait_for_port(metrics_port, timeout=30)
            # Both workers fetched the JWKS once before serving.
            while keys.hits["/slow"] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.05)

            # Metrics are summed across worker processes.
            request = check_request("/headers", {"authorization": f"Bearer {GOOD}"})
            for client in clients:
                for _ in range(5):
                    assert client.check(request).status.code == 0

            # Workers flush their check counts every 0.5 s; wait for all 36.
            def scrape() -> str:
                url = f"http://127.0.0.1:{metrics_port}/metrics"
                return str(urllib.request.urlopen(url).read().decode())

            def allowed(text: str) -> float:
                return sample(
                    text,
                    "meshplane_extauthz_checks_total",
                    mode="grpc",
                    result="allow",
                    reason="ok",
                )

            expected = 30 + len(clients)  # 30 here + one readiness probe per client
            while allowed(text := scrape()) < expected:
                assert time.monotonic() < deadline + 10
                time.sleep(0.1)
            assert allowed(text) == expected
            count = sample(text, "meshplane_extauthz_check_duration_seconds_count", mode="grpc")
            assert count == expected

            # Rotate to a slow IdP: requests with the new kid wait for the refetch.
            keys.delay["/slow"] = 1.5
            keys.documents["/slow"] = {"keys": [public_jwk(ec_key(1), "k2")]}
            token = make_token(
                claims(time.time()), alg="ES256", key=ec_key(1), header={"kid": "k2"}
            )
            slow = check_request("/x", {"authorization": f"Bearer {token}"}, policy="slow")
            pool = concurrent.futures.ThreadPoolExecutor(8)
            grpc_calls = [client.stub.Check.future(slow, timeout=20) for client in clients]
            http_calls = [
                pool.submit(
                    http_check, http_port, "/check/slow/x", [("authorization", f"Bearer {token}")]
                )
                for _ in range(2)
            ]
            while keys.hits["/slow"] < 3:  # a refetch is in flight: calls are waiting on it
                assert time.monotonic() < deadline + 30
                time.sleep(0.01)
            proc.send_signal(signal.SIGTERM)

            for call in grpc_calls:
                response = call.result(timeout=20)
                assert response.status.code == 0, response.status.message
            for future in http_calls:
                assert future.result(timeout=20).status == 200
            assert proc.wait(timeout=30) == 0
            pool.shutdown()
            for client in clients:
                client.close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        assert "worker draining" in stderr
        assert GOOD not in stderr  # tokens never reach the logs
