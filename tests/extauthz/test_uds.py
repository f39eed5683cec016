"""Check over a Unix domain socket (``--listen unix:/PATH``), on both servers.

The "sidecar services" placement: extauthz in the gateway's pod, reached on a
socket file. ``extauthz serve`` runs as deployed (a real supervisor, a real
socket) on the Envoy-based server and on h2; the shared gRPC decision
table must give the same decisions as over TCP (test_modes.py). A socket
path with more than one worker is refused at the command line, by name.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc

from tests.support.backends import BACKENDS
from tests.support.processes import Service

from .cases import CASES, Case
from .jwtkit import HS_SECRET
from .policies import write_policies
from .support import check_request
from .test_modes import assert_grpc_decision, grpc_headers


@pytest.fixture(scope="module", params=BACKENDS)
def socket_path(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    config = write_policies(tmp_path_factory.mktemp("policies"))
    # A short directory: sun_path holds 107 bytes, pytest's tmp paths can be longer.
    with tempfile.TemporaryDirectory(prefix="mp-uds-") as short:
        path = Path(short) / "extauthz.sock"
        log = tmp_path_factory.mktemp("uds-extauthz") / "stderr.log"
        service = Service(
            ["extauthz.cli", "serve", "--config", str(config), "--server", request.param,
             "--listen", f"unix:{path}"],
            path,
            log,
            env={**os.environ, "EXTAUTHZ_TEST_SECRET": HS_SECRET.decode()},
        ).start()  # fmt: skip
        try:
            yield path
        finally:
            assert service.stop() == 0


@pytest.fixture(scope="module")
def stub(socket_path: Path) -> Iterator[external_auth_pb2_grpc.AuthorizationStub]:
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        yield external_auth_pb2_grpc.AuthorizationStub(channel)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_check_over_a_unix_socket(
    stub: external_auth_pb2_grpc.AuthorizationStub, case: Case
) -> None:
    request = check_request(case.path, grpc_headers(case), policy=case.policy)
    response: external_auth_pb2.CheckResponse = stub.Check(request, timeout=10)
    assert_grpc_decision(response, case.expect)


def test_a_socket_with_two_workers_is_refused_by_name(tmp_path: Path) -> None:
    config = write_policies(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "extauthz.cli", "serve", "--config", str(config),
         "--workers", "2", "--listen", f"unix:{tmp_path}/x.sock"],
        check=False, capture_output=True, text=True, timeout=60,
        env={**os.environ, "EXTAUTHZ_TEST_SECRET": HS_SECRET.decode()},
    )  # fmt: skip
    assert done.returncode != 0
    assert "one worker" in done.stderr and "unix:" in done.stderr
    assert not (tmp_path / "x.sock").exists()
