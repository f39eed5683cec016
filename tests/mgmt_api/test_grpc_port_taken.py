"""A taken gRPC port stops ``mgmt-api serve``, as a taken REST port does.

gRPC binds with SO_REUSEPORT by default, so a second mgmt-api (another
database) used to share the first one's ``--grpc-listen`` port and split the
gateways and sidecars between two control planes. Real processes and real
sockets: the CLI refuses the port before its migrations, naming the port and
the flag, and the gRPC server's own bind refuses it too (the guarantee when
two starts race past the CLI's check).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from mgmt_api.distribution.hub import SERVER_OPTIONS
from tests.mgmt_api.harness import MgmtServer
from tests.support.net import free_port


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``mgmt-api serve`` with a database of its own, to its exit."""
    return subprocess.run(
        [sys.executable, "-m", "mgmt_api.cli", "serve", *args],
        env={**os.environ, "MESHPLANE_DATA_DIR": str(tmp_path)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port a socket listens on with SO_REUSEPORT, as gRPC's default binds."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_taken_grpc_port_stops_the_start_naming_the_port_and_the_flag(
    tmp_path: Path, held_port: int
) -> None:
    rest = free_port()
    done = _serve(
        tmp_path, "--listen", f"127.0.0.1:{rest}", "--grpc-listen", f"127.0.0.1:{held_port}"
    )
    assert done.returncode == 2, done.stderr
    error = " ".join(done.stderr.split())  # the box wraps lines
    assert f"port {held_port} on 127.0.0.1 is in use" in error, done.stderr
    assert "--grpc-listen" in error, done.stderr
    assert not (tmp_path / "mgmt-api.db").exists(), "refused before the migrations"


def test_a_second_mgmt_api_cannot_take_the_first_ones_grpc_port(tmp_path: Path) -> None:
    first = MgmtServer().start()
    try:
        done = _serve(
            tmp_path,
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--database",
            f"sqlite+pysqlite:///{tmp_path / 'other.db'}",
            "--grpc-listen",
            f"127.0.0.1:{first.grpc_port}",
        )
        assert done.returncode == 2, done.stderr
        error = " ".join(done.stderr.split())
        assert f"port {first.grpc_port} on 127.0.0.1 is in use" in error, done.stderr
        assert "--grpc-listen" in error
        assert httpx.get(first.url + "/readyz", timeout=10).status_code == 200
    finally:
        first.close()


def test_a_taken_rest_port_names_its_flag(tmp_path: Path, held_port: int) -> None:
    done = _serve(tmp_path, "--listen", f"127.0.0.1:{held_port}", "--grpc-listen", "off")
    assert done.returncode == 2, done.stderr
    error = " ".join(done.stderr.split())
    assert f"port {held_port} on 127.0.0.1 is in use" in error and "--listen" in error, error


async def test_the_grpc_server_does_not_share_a_taken_port(held_port: int) -> None:
    """The server's own bind, past the CLI's check: with gRPC's default options
    it would bind the port beside the holder; with mgmt-api's it is refused."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    with pytest.raises(RuntimeError, match="Failed to bind"):
        server.add_insecure_port(f"127.0.0.1:{held_port}")
    await server.stop(None)
