"""nghttp2's own clients (Debian's nghttp2-client, installed by scripts/setup) against
every HTTP/2 backend: gRPC over h2c from a codec that is not ours and not Envoy's.

- ``nghttp``: three Echo calls multiplexed on one connection, each with a
  request trailer, under a 1023-byte stream window, and a 20 KB answer pulled
  through that window (the server must send it in pieces as WINDOW_UPDATEs
  arrive); every answer has its message and ``grpc-status: 0`` in its
  trailers, and the client ends with no error;
- ``h2load``: a short burst (300 calls, 3 connections, 4 streams each), all
  answered 2xx, and the server still answers after it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conformance.conftest import HTTP2_BACKENDS
from tests.conformance.peer import Peer, grpc_message
from tests.runtime.echo_app import SERVICE
from tests.runtime.supervisors import Supervisor

GRPC_HEADERS = ["-H", "content-type: application/grpc", "-H", "te: trailers"]


def _url(server: Supervisor, method: str) -> str:
    return f"http://127.0.0.1:{server.port}/{SERVICE}/{method}"


@pytest.mark.parametrize("kind", HTTP2_BACKENDS)
def test_nghttp_multiplexed_calls_with_trailers_under_a_small_window(
    servers: dict[str, Supervisor], kind: str, tmp_path: Path
) -> None:
    body = tmp_path / "echo.bin"
    body.write_bytes(grpc_message(b"conformance"))
    out = subprocess.run(
        ["nghttp", "-v", "-t", "30", *GRPC_HEADERS, "--trailer", "x-trailer: 1",
         "-w", "10", "-m", "3", "-d", str(body), _url(servers[kind], "Echo")],
        capture_output=True, text=True, errors="replace", timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("grpc-status: 0") == 3, out.stdout[-3000:]
    assert out.stdout.count("conformance") >= 3
    assert "RST_STREAM" not in out.stdout


@pytest.mark.parametrize("kind", HTTP2_BACKENDS)
def test_nghttp_pulls_a_large_answer_through_a_small_window(
    servers: dict[str, Supervisor], kind: str, tmp_path: Path
) -> None:
    body = tmp_path / "fill.bin"
    body.write_bytes(grpc_message(b"20000"))
    out = subprocess.run(
        ["nghttp", "-v", "-t", "30", *GRPC_HEADERS, "-w", "10", "-d", str(body),
         _url(servers[kind], "Fill")],
        capture_output=True, text=True, errors="replace", timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "grpc-status: 0" in out.stdout, out.stdout[-3000:]
    sizes = [int(n) for n in re.findall(r"recv DATA frame <length=(\d+)", out.stdout)]
    assert sum(sizes) == 20005  # the message and its 5-byte prefix
    assert max(sizes) <= 1023  # never past the window the client gave
    assert "send WINDOW_UPDATE" in out.stdout


@pytest.mark.parametrize("kind", HTTP2_BACKENDS)
def test_h2load_burst_is_all_answered_and_the_server_survives(
    servers: dict[str, Supervisor], kind: str, tmp_path: Path
) -> None:
    body = tmp_path / "echo.bin"
    body.write_bytes(grpc_message(b"burst"))
    out = subprocess.run(
        ["h2load", "-n", "300", "-c", "3", "-m", "4", *GRPC_HEADERS, "-d", str(body),
         _url(servers[kind], "Echo")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "300 succeeded, 0 failed, 0 errored, 0 timeout" in out.stdout, out.stdout[-1500:]
    assert "status codes: 300 2xx" in out.stdout
    with Peer(servers[kind].port) as peer:
        peer.send(peer.call(1))
        assert peer.verdict(1, probe=False).label == "answer 0"
