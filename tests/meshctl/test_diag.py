"""``meshctl diag``: Check and ShouldRateLimit sent as Envoy sends them, against
real ``extauthz serve`` and ``ratelimit serve`` processes; the decision is
printed with its headers and is the exit code (0 allowed, 7 denied / over)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplane.check_request import HttpCall, build_check_request
from tests.support.net import free_port, wait_for_port
from tests.support.processes import terminate

REPO = Path(__file__).resolve().parents[2]
DEMO_POLICY = REPO / "deploy" / "extauthz" / "demo-policy.yaml"
RATELIMIT_CONFIG = """\
domain: diag
descriptors:
  - key: route
    value: web
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: route
    value: bulk
    rate_limit: {unit: minute, requests_per_unit: 2}
"""
DENIED = 7


def _serve(module: str, args: list[str], log: Path) -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "serve", "--listen", f"127.0.0.1:{port}", *args],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "ab"),  # noqa: SIM115
    )
    try:
        try:
            wait_for_port(port, timeout=60)
        except TimeoutError:
            raise RuntimeError(log.read_text()[-3000:]) from None
        yield port
    finally:
        terminate(proc)


@pytest.fixture(scope="module")
def extauthz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("extauthz") / "extauthz.log"
    for port in _serve("extauthz.cli", ["--config", str(DEMO_POLICY)], log):
        yield f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def ratelimit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("ratelimit")
    (tmp / "config.yaml").write_text(RATELIMIT_CONFIG)
    for port in _serve("ratelimit.cli", ["--config", str(tmp / "config.yaml")], tmp / "rl.log"):
        yield f"127.0.0.1:{port}"


def meshctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "meshctl", "diag", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def demo_token(path: str) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "extauthz.cli",
            "token",
            "--config",
            str(DEMO_POLICY),
            "--path",
            path,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_check_allowed_exits_0_and_prints_the_decision(extauthz: str) -> None:
    token = demo_token("/headers")
    done = meshctl(
        "check", "--server", extauthz, "--path", "/headers/x",
        "--header", f"Authorization=Bearer {token}", "-o", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "allowed": True,
        "grpc_status": 0,
        "headers": {},
        "headers_to_remove": [],
    }


def test_check_denied_exits_7_with_status_headers_and_body(extauthz: str) -> None:
    token = demo_token("/headers")
    done = meshctl(
        "check", "--server", extauthz, "--path", "/admin",
        "--header", f"authorization=Bearer {token}",
    )  # fmt: skip
    assert done.returncode == DENIED, done.stderr
    assert done.stdout.splitlines()[0] == "DENIED: HTTP 403 (gRPC PERMISSION_DENIED)"
    assert "  x-ext-authz-reason: path_not_allowed" in done.stdout
    assert "body: " in done.stdout


def test_check_context_extension_selects_the_policy(extauthz: str) -> None:
    token = demo_token("/headers")
    common = ["check", "--server", extauthz, "--path", "/headers-admin", "-o", "json"]
    common += ["--header", f"authorization=Bearer {token}"]
    prefix = meshctl(*common)  # defaultPolicy: literal PREFIX match grants it
    segment = meshctl(*common, "--context-extension", "meshplane.policy=tsb-jwt-segment")
    unknown = meshctl(*common, "--context-extension", "meshplane.policy=nope")
    assert prefix.returncode == 0, prefix.stdout + prefix.stderr
    assert segment.returncode == DENIED
    assert json.loads(segment.stdout)["headers"]["x-ext-authz-reason"] == "path_not_allowed"
    assert unknown.returncode == DENIED
    assert json.loads(unknown.stdout)["headers"]["x-ext-authz-reason"] == "unknown_policy"


def test_check_request_is_built_as_envoy_builds_it() -> None:
    call = HttpCall(
        method="POST",
        path="/a?b=c",
        host="web.example",
        headers={"Authorization": "Bearer t"},
        context_extensions={"meshplane.policy": "p"},
        source=("10.0.0.1", 4321),
        destination=("10.0.0.2", 8080),
    )
    attrs = build_check_request(call, now=1_700_000_000.5, request_id="rid").attributes
    http = attrs.request.http
    assert (http.method, http.path, http.host, http.scheme, http.protocol, http.id) == (
        "POST", "/a?b=c", "web.example", "http", "HTTP/1.1", "rid",
    )  # fmt: skip
    assert dict(http.headers) == {
        ":authority": "web.example",
        ":method": "POST",
        ":path": "/a?b=c",
        ":scheme": "http",
        "authorization": "Bearer t",
        "x-request-id": "rid",
        "x-forwarded-proto": "http",
    }
    assert attrs.source.address.socket_address.address == "10.0.0.1"
    assert attrs.source.address.socket_address.port_value == 4321
    assert attrs.destination.address.socket_address.port_value == 8080
    assert dict(attrs.context_extensions) == {"meshplane.policy": "p"}
    assert attrs.request.time.seconds == 1_700_000_000


def not_near_a_minute_boundary() -> None:
    """The limits are per minute: a few calls must not straddle two windows."""
    left = 60 - time.time() % 60
    if left < 5:
        time.sleep(left + 0.05)


def test_ratelimit_repeat_reaches_over_limit_and_exits_7(ratelimit: str) -> None:
    not_near_a_minute_boundary()
    done = meshctl(
        "ratelimit", "--server", ratelimit, "--domain", "diag",
        "--descriptor", "route=web", "--repeat", "3",
    )  # fmt: skip
    assert done.returncode == DENIED, done.stdout + done.stderr
    out = done.stdout
    assert "#1: OK" in out
    assert "#3: OVER_LIMIT" in out
    assert "descriptor[0]: OVER_LIMIT limit 2/MINUTE remaining 0" in out
    assert "x-ratelimit-limit: 2, 2;w=60" in out


def test_ratelimit_json_lists_each_descriptor_and_the_headers(ratelimit: str) -> None:
    not_near_a_minute_boundary()
    done = meshctl(
        "ratelimit", "--server", ratelimit, "--domain", "diag", "-o", "json",
        "--descriptor", "route=bulk", "--descriptor", "route=unlimited,user=u1",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["overallCode"] == "OK"
    limited, unlimited = result["statuses"]
    assert limited["currentLimit"] == {"requestsPerUnit": 2, "unit": "MINUTE"}
    assert limited["limitRemaining"] == 1
    assert unlimited == {"code": "OK"}
    assert result["responseHeaders"]["x-ratelimit-remaining"] == "1"


def test_ratelimit_hits_is_envoys_hits_addend(ratelimit: str) -> None:
    done = meshctl(
        "ratelimit", "--server", ratelimit, "--domain", "diag",
        "--descriptor", "route=web,x=1", "--descriptor", "route=bulk", "--hits", "5",
    )  # fmt: skip
    assert done.returncode == DENIED, done.stdout + done.stderr
    assert "#1: OVER_LIMIT" in done.stdout


def test_unreachable_server_exits_6_and_bad_descriptor_exits_2() -> None:
    down = meshctl("ratelimit", "--server", f"127.0.0.1:{free_port()}", "--domain", "d",
                   "--descriptor", "k=v", "--timeout", "2")  # fmt: skip
    assert down.returncode == 6
    assert down.stderr.startswith("error: ShouldRateLimit to 127.0.0.1:")
    bad = meshctl("ratelimit", "--server", "127.0.0.1:1", "--domain", "d", "--descriptor", "k")
    assert bad.returncode == 2
    assert "is not KEY=VALUE" in bad.stderr
