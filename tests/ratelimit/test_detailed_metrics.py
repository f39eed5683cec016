"""``detailed_metric`` on ``/metrics`` of a real ``ratelimit serve``, and its bound.

The reference (README "Statistics": ``ratelimit.service.rate_limit.DOMAIN.KEY_VALUE.STAT``;
``GetLimit`` in ``src/config/config_impl.go``) rolls a key-only or wildcard
match up into the rule's own key, unless the descriptor has
``detailed_metric: true``: then the key is every entry as ``key_value`` with
the request's values, except that a ``share_threshold`` entry keeps its
wildcard pattern. Here the key (without the domain, which is its own label)
is the ``rule`` label, and since those labels come from requests, a worker
keeps at most ``detailedMetrics.maxSeries`` of them, each at most
``maxLabelBytes`` long; every other hit goes to ``<rule>:overflow``.
``value_to_metric`` (the same file) puts the request's value in the key at the
levels that ask, and shares the bound.
"""

from __future__ import annotations

import textwrap
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from ratelimit import cli
from tests.ratelimit.conftest import request
from tests.support.grpc_raw import raw_unary
from tests.support.net import free_port
from tests.support.processes import Service, wait_until
from tests.support.redis_server import RedisServer

CONFIG = """\
domain: rl
descriptors:
  - key: unspec
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: files
    value: "files/*"
    share_threshold: true
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: route
    value: api
    descriptors:
      - key: user
        value_to_metric: true
        rate_limit: {unit: minute, requests_per_unit: 1000}
"""

SETTINGS = """\
detailedMetrics: {maxSeries: 3, maxLabelBytes: 24}
"""

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, redis_module: RedisServer
) -> Iterator[tuple[str, int]]:
    """``ratelimit serve`` as an operator runs it: gRPC target and metrics port."""
    root = tmp_path_factory.mktemp("detailed")
    (root / "rl.yaml").write_text(CONFIG)
    (root / "settings.yaml").write_text(textwrap.dedent(SETTINGS))
    port, metrics_port = free_port(), free_port()
    service = Service(
        ["ratelimit.cli", "serve", "--config", str(root / "rl.yaml"),
         "--settings", str(root / "settings.yaml"), "--redis-url", redis_module.url,
         "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}"],
        port,
        root / "stderr.log",
    ).start()  # fmt: skip
    try:
        yield f"127.0.0.1:{port}", metrics_port
    finally:
        service.stop()


def _call(target: str, *entries: tuple[str, str]) -> int:
    raw = request("rl", list(entries)).SerializeToString()
    with grpc.insecure_channel(target) as channel:
        answer = wait_until(
            lambda: _try(channel, raw), timeout=30, what="an answer (readiness follows Redis)"
        )
    return int(rls_pb2.RateLimitResponse.FromString(answer).overall_code)


def _try(channel: grpc.Channel, raw: bytes) -> bytes | None:
    try:
        answer: bytes = raw_unary(channel, METHOD)(raw, timeout=10)
    except grpc.RpcError:
        return None
    return answer


def _hits(metrics_port: int) -> dict[str, float]:
    """total_hits by rule label, domain rl, from /metrics."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    prefix = 'meshplane_ratelimit_total_hits_total{domain="rl",rule="'
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            label, _, value = line[len(prefix) :].rpartition('"} ')
            found[label] = float(value)
    return found


def test_detailed_series_carry_request_values_up_to_the_bound(served: tuple[str, int]) -> None:
    target, metrics_port = served
    calls = [
        [("unspec", "a")],
        [("unspec", "a")],
        [("unspec", "b")],
        [("files", "files/x.pdf")],  # share_threshold: the pattern, not the value
        [("files", "files/y.csv")],
        [("unspec", "c")],  # a fourth series: past maxSeries
        [("unspec", "a")],  # an existing series still counts
        [("unspec", "v" * 30)],  # longer than maxLabelBytes
        [("plain", "p1")],  # not detailed: rolled up
        [("plain", "p2")],
        # value_to_metric on the nested key-only entry: its value is in the key,
        # the same bound applies (the series are full: overflow).
        [("route", "api"), ("user", "u1")],
    ]
    for entries in calls:
        assert _call(target, *entries) == rls_pb2.RateLimitResponse.OK
    want = {
        "unspec_a": 3.0,
        "unspec_b": 1.0,
        "files_files/*": 2.0,
        "unspec:overflow": 2.0,
        "plain": 2.0,
        "route_api.user:overflow": 1.0,
    }
    # Hot-path metrics are flushed twice a second. The config's own rule keys are
    # also there at 0 from the start (counters at zero); only the moved ones count.

    def moved() -> dict[str, float]:
        return {rule: hits for rule, hits in _hits(metrics_port).items() if hits}

    assert wait_until(lambda: moved() == want or None, timeout=30, what=str(want))


def test_quota_mode_flag_is_the_global_switch() -> None:
    args = cli._parser().parse_args(["serve", "--config", "c.yaml", "--quota-mode"])
    assert cli._settings(args).quota_mode
    args = cli._parser().parse_args(["serve", "--config", "c.yaml"])
    assert not cli._settings(args).quota_mode
