"""StreamRateLimitQuotas on every server backend, as a gRPC client sees it.

The server runs under the real supervisor with its clock standing still
(tests/ratelimit/servers.py) and keeps demand in a real redis-server, so each
report's demand is its request count and the shares are exact. A real Envoy
enforcing them is tests/gateway/test_quota_gateways.py; the allocation rules
alone are tests/ratelimit/test_quota_allocation.py.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from envoy.service.rate_limit_quota.v3 import rlqs_pb2

from tests.ratelimit.servers import Server, wait_ready
from tests.support.backends import BACKENDS
from tests.support.grpc_raw import raw_stream
from tests.support.redis_server import RedisServer

METHOD = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
CONFIG = """\
domain: gw
descriptors:
  - key: route
    value: r1
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: route
    value: free
"""
BUCKET = {"domain": "gw", "0:route": "r1"}


class Stream:
    """One bidi call: ``send`` a report, ``recv`` the next response (or the end)."""

    def __init__(self, target: str) -> None:
        self._out: queue.Queue[bytes | None] = queue.Queue()
        self._in: queue.Queue[rlqs_pb2.RateLimitQuotaResponse | grpc.RpcError | None] = (
            queue.Queue()
        )
        self._channel = grpc.insecure_channel(target)
        call = raw_stream(self._channel, METHOD)(iter(self._out.get, None), timeout=60)
        self._thread = threading.Thread(target=self._read, args=(call,), daemon=True)
        self._thread.start()

    def _read(self, call: Iterator[bytes]) -> None:
        try:
            for raw in call:
                self._in.put(rlqs_pb2.RateLimitQuotaResponse.FromString(raw))
            self._in.put(None)
        except grpc.RpcError as exc:
            self._in.put(exc)

    def send(
        self,
        counts: dict[str, int] | None = None,
        domain: str = "gw",
        bucket: dict[str, str] | None = None,
    ) -> None:
        message = rlqs_pb2.RateLimitQuotaUsageReports(domain=domain)
        usage = message.bucket_quota_usages.add()
        usage.bucket_id.bucket.update(bucket or BUCKET)
        usage.num_requests_allowed = (counts or {}).get("allowed", 1)
        usage.num_requests_denied = (counts or {}).get("denied", 0)
        self._out.put(message.SerializeToString())

    def send_many(self, buckets: list[dict[str, str]], domain: str = "gw") -> None:
        """One report of one request in each of ``buckets``."""
        message = rlqs_pb2.RateLimitQuotaUsageReports(domain=domain)
        for bucket in buckets:
            usage = message.bucket_quota_usages.add()
            usage.bucket_id.bucket.update(bucket)
            usage.num_requests_allowed = 1
        self._out.put(message.SerializeToString())

    def recv(self, timeout: float = 20) -> rlqs_pb2.RateLimitQuotaResponse | grpc.RpcError | None:
        return self._in.get(timeout=timeout)

    def close(self) -> None:
        self._out.put(None)
        self._channel.close()


def action(response: object) -> rlqs_pb2.RateLimitQuotaResponse.BucketAction:
    assert isinstance(response, rlqs_pb2.RateLimitQuotaResponse), response
    (only,) = response.bucket_action
    return only


def tokens(response: object) -> tuple[int, int, int, int]:
    """(tokens_per_fill, fill seconds, max_tokens, ttl seconds) of a one-bucket answer."""
    assignment = action(response).quota_assignment_action
    bucket = assignment.rate_limit_strategy.token_bucket
    return (
        bucket.tokens_per_fill.value,
        bucket.fill_interval.seconds,
        bucket.max_tokens,
        assignment.assignment_time_to_live.seconds,
    )


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.close()


class Servers:
    """The module's server of one backend, started again only after a test drained it
    (the drain test comes last in file order, so usually never)."""

    def __init__(self, kind: str, config: Path, redis_url: str) -> None:
        self.kind, self.config, self.redis_url = kind, config, redis_url
        self.current: Server | None = None

    def get(self) -> Server:
        if self.current is None or self.current.proc.poll() is not None:
            self.close()
            running = self.current = Server(self.kind, self.config, self.redis_url)
            running.wait_listening()
            wait_ready(running)
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None


@pytest.fixture(scope="module", params=BACKENDS)
def servers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            redis: RedisServer) -> Iterator[Servers]:  # fmt: skip
    config = tmp_path_factory.mktemp("quota") / "gw.yaml"
    config.write_text(CONFIG)
    holder = Servers(request.param, config, redis.url)
    try:
        yield holder
    finally:
        holder.close()


@pytest.fixture
def server(servers: Servers) -> Server:
    return servers.get()


@pytest.fixture
def streams(server: Server, redis: RedisServer) -> Iterator[list[Stream]]:
    redis.command("FLUSHALL")
    opened: list[Stream] = []
    yield opened
    for stream in opened:
        stream.close()


def open_stream(server: Server, streams: list[Stream]) -> Stream:
    stream = Stream(server.target)
    streams.append(stream)
    return stream


def test_the_first_report_subscribes_and_gets_the_whole_limit(
    server: Server, streams: list[Stream]
) -> None:
    gateway = open_stream(server, streams)
    gateway.send()
    assert tokens(gateway.recv()) == (200, 10, 10, 15)  # 20 a second, a burst of 10


def test_a_second_gateway_takes_its_share_and_the_first_is_pushed_a_smaller_one(
    server: Server, streams: list[Stream]
) -> None:
    first, second = open_stream(server, streams), open_stream(server, streams)
    first.send({"allowed": 1})
    assert tokens(first.recv())[0] == 200
    second.send({"allowed": 20, "denied": 10})  # wants 30 a second
    # floor 1 each; the rest (18) goes by demand: the quiet first keeps its floor.
    assert tokens(second.recv())[:2] == (190, 10)
    assert tokens(first.recv())[:2] == (10, 10)  # pushed, without a report of its own


def test_a_bucket_quiet_for_three_reports_is_abandoned(
    server: Server, streams: list[Stream]
) -> None:
    gateway = open_stream(server, streams)
    gateway.send()
    gateway.recv()
    for _ in range(2):
        gateway.send({"allowed": 0})
        assert action(gateway.recv()).HasField("quota_assignment_action")
    gateway.send({"allowed": 0})
    assert action(gateway.recv()).HasField("abandon_action")


def test_a_bucket_without_a_limit_is_allowed_all(server: Server, streams: list[Stream]) -> None:
    gateway = open_stream(server, streams)
    gateway.send(bucket={"domain": "gw", "0:route": "free"})
    strategy = action(gateway.recv()).quota_assignment_action.rate_limit_strategy
    assert strategy.blanket_rule == strategy.ALLOW_ALL


@pytest.mark.parametrize(
    ("domain", "bucket", "message"),
    [
        ("", BUCKET, "domain: required in the first message"),
        ("gw", {"route": "r1"}, "bucket_id: bucket_id key 'route' is not"),
        ("gw", {"0:route": "r1", "2:x": "y"}, "bucket_id: bucket_id entry indexes"),
        # 300 characters, 600 bytes: the cap is on bytes
        ("gw", {"0:route": "é" * 300}, "bucket_id: bucket_id entry longer than 512 bytes"),
    ],
)
def test_bad_reports_end_the_stream_naming_the_field(
    server: Server, streams: list[Stream], domain: str, bucket: dict[str, str], message: str
) -> None:
    gateway = open_stream(server, streams)
    gateway.send(domain=domain, bucket=bucket)
    error = gateway.recv()
    assert isinstance(error, grpc.RpcError)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert (error.details() or "").startswith(message)


@pytest.mark.parametrize(
    ("buckets", "message"),
    [
        # more buckets than a stream may hold (QuotaSettings.max_buckets)
        ([{"domain": "gw", "0:route": f"r{i}"} for i in range(10_001)], "a stream may subscribe"),
        # ids of 16 entries of 512 bytes: past the byte cap long before the count
        (
            [
                {"domain": "gw", **{f"{j}:k": f"{i:04d}" + "v" * 508 for j in range(16)}}
                for i in range(260)
            ],
            "a stream's bucket ids may hold at most",
        ),
    ],
    ids=["count", "bytes"],
)
def test_a_stream_past_its_bucket_caps_is_refused(
    server: Server, streams: list[Stream], buckets: list[dict[str, str]], message: str
) -> None:
    gateway = open_stream(server, streams)
    gateway.send_many(buckets)
    error = gateway.recv()
    assert isinstance(error, grpc.RpcError), error
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (error.details() or "").startswith(message)


def test_a_drain_sends_every_assignment_with_ttl_0_then_ends_the_stream(
    servers: Servers, streams: list[Stream]
) -> None:
    running = servers.get()
    gateway = open_stream(running, streams)
    gateway.send()
    assert tokens(gateway.recv())[3] == 15
    # This test owns the stop and checks its exit code; the module's teardown must
    # not report the same exit code again against the next backend's first test.
    servers.current = None
    try:
        running.proc.terminate()  # SIGTERM: a planned stop
        assert tokens(gateway.recv())[3] == 0
        # Then the stream ends rather than holding the drain: with OK, or reset as the
        # worker closes its connections (Envoy reconnects at its next report either way).
        end = gateway.recv()
        assert end is None or isinstance(end, grpc.RpcError), end
        assert running.proc.wait(30) == 0
    finally:
        if running.proc.poll() is None:
            running.proc.kill()
            running.proc.wait(10)
