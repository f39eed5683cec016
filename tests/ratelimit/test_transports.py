"""One ShouldRateLimit table through every server: same answers, byte for byte.

The service runs under a real supervisor on the Envoy-based server (the
default) and on h2 (meshplane's own HTTP/2 server), each with a
clock standing still at T0 and its own counters in a real redis-server. The
same sequence of calls (allow, count down, deny, two rules OR'ed, a zero
limit, an unknown domain, invalid requests) must give the same statuses,
headers and error codes on all, and the expected ones. Each server runs
twice: on a TCP port and on a Unix domain socket (``unix:/PATH``, the
"sidecar services" placement). A worker whose Redis is unreachable answers
UNAVAILABLE (failureMode ``unavailable``) fast on each.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from tests.ratelimit.conftest import OK, OVER, headers_of, request, write_config
from tests.ratelimit.servers import SERVERS, Server, wait_ready
from tests.support.net import free_port
from tests.support.redis_server import RedisServer, redis_server

TRANSPORTS = ("tcp", "uds")
#: Every (server, transport) pair: the first is the reference the others must match.
PAIRS = tuple((kind, transport) for transport in TRANSPORTS for kind in SERVERS)

CONFIG = """\
domain: api
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: route
    value: checkout
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: banned
    rate_limit: {unit: minute, requests_per_unit: 0}
"""


@pytest.fixture(scope="module")
def socket_dir() -> Iterator[Path]:
    """A short directory for sockets (sun_path holds 107 bytes; pytest's paths can be longer)."""
    with tempfile.TemporaryDirectory(prefix="mp-rl-") as short:
        yield Path(short)


@pytest.fixture(scope="module")
def stores() -> Iterator[dict[tuple[str, str], RedisServer]]:
    """A redis-server of its own for each server, so counters never mix."""
    with contextlib.ExitStack() as stack:
        yield {pair: stack.enter_context(redis_server()) for pair in PAIRS}


@pytest.fixture(scope="module")
def servers(
    stores: dict[tuple[str, str], RedisServer],
    socket_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[tuple[str, str], Server]]:
    config = write_config(tmp_path_factory.mktemp("rl"), "api.yaml", CONFIG)
    started = {
        (kind, transport): Server(
            kind,
            config,
            stores[kind, transport].url,
            socket_dir=socket_dir if transport == "uds" else None,
        )
        for kind, transport in PAIRS
    }
    try:
        for server in started.values():
            server.wait_listening()
            wait_ready(server)
        yield started
    finally:
        for server in started.values():
            server.close()


def _raw(req: rls_pb2.RateLimitRequest) -> bytes:
    return bytes(req.SerializeToString())


CLIENT = _raw(request("api", [("client", "c1")]))
BOTH = _raw(request("api", [("client", "c2")], [("route", "checkout")]))
SEQUENCE: list[bytes] = [
    CLIENT, CLIENT, CLIENT, CLIENT,  # 3 a minute: the 4th is over
    BOTH, BOTH, BOTH,  # the route's 2 an hour deny the 3rd, c2's bucket keeps 1
    _raw(request("api", [("banned", "b")])),  # a zero limit
    _raw(request("nope", [("client", "c1")])),  # an unknown domain: OK, no limit
    _raw(request("", [("a", "b")])),  # invalid
    _raw(request("api")),  # invalid: no descriptors
    b"\x0a\xff\xff",  # not a RateLimitRequest
]  # fmt: skip


def _summary(answer: rls_pb2.RateLimitResponse | tuple[str, str]) -> object:
    if isinstance(answer, tuple):
        return answer
    return (
        answer.overall_code,
        [(s.code, s.limit_remaining) for s in answer.statuses],
        headers_of(answer),
    )


def _wire(answers: list[rls_pb2.RateLimitResponse | tuple[str, str]]) -> list[object]:
    return [a if isinstance(a, tuple) else a.SerializeToString() for a in answers]


def test_every_server_gives_the_same_answers(servers: dict[tuple[str, str], Server]) -> None:
    results = {pair: [server.call(raw) for raw in SEQUENCE] for pair, server in servers.items()}
    envoy = results[PAIRS[0]]
    # Byte for byte, on a port and on a socket: the same service code wrote them all.
    for pair in PAIRS[1:]:
        assert _wire(results[pair]) == _wire(envoy), pair
    got = [_summary(a) for a in envoy]
    limit = {"x-ratelimit-limit": "3, 3;w=60", "x-ratelimit-reset": "50"}
    assert got[:4] == [
        (OK, [(OK, 2)], {**limit, "x-ratelimit-remaining": "2"}),
        (OK, [(OK, 1)], {**limit, "x-ratelimit-remaining": "1"}),
        (OK, [(OK, 0)], {**limit, "x-ratelimit-remaining": "0"}),
        (OVER, [(OVER, 0)], {**limit, "x-ratelimit-remaining": "0",
                             "x-proxy-ratelimited": "true"}),
    ]  # fmt: skip
    assert [g[0] for g in got[4:7]] == [OK, OK, OVER]  # type: ignore[index]
    assert got[6][1] == [(OK, 1), (OVER, 0)]  # type: ignore[index]
    assert got[7][0] == OVER  # type: ignore[index]
    assert got[8] == (OK, [(OK, 0)], {})
    assert got[9:] == [
        ("INVALID_ARGUMENT", "rate limit domain must not be empty"),
        ("INVALID_ARGUMENT", "rate limit descriptor list must not be empty"),
        ("INVALID_ARGUMENT", "the request is not a valid RateLimitRequest"),
    ]


@pytest.mark.parametrize(("kind", "transport"), PAIRS)
def test_a_store_that_cannot_answer_is_unavailable_on_every_server(
    kind: str, transport: str, tmp_path: Path, socket_dir: Path
) -> None:
    config = write_config(tmp_path, "api.yaml", CONFIG)
    sockets = socket_dir / f"down-{kind}" if transport == "uds" else None
    if sockets is not None:
        sockets.mkdir()
    # Nobody listens on that Redis port.
    server = Server(kind, config, f"redis://127.0.0.1:{free_port()}", socket_dir=sockets)
    try:
        server.wait_listening()
        started = time.monotonic()
        assert server.call(CLIENT)[0] == "UNAVAILABLE"
        assert time.monotonic() - started < 5
    finally:
        server.close()
