"""CPU per call with tracing off, at 1 % and at 100 %, in process (no transport).

    uv run --frozen python bench/tracing_cost.py --calls 20000 --rounds 5

The h2load benches (``bench/extauthz/bench.py --tracing``,
``bench/ratelimit/run.py --tracing``) measure the whole server, where the
socket and Envoy work move by ±20 % with a shared machine's load and hide a
few microseconds. This one runs the two decision paths in a tight loop,
as the servers call them (wire bytes in, wire bytes out):

* ext_authz: ``CheckHandler`` on a valid HS256 token (an allow, the
  verified-token cache hit);
* ratelimit: ``RateLimitService.decide`` on the in-memory store (one bucket).

Each with tracing off (no provider), at 1 % and at 100 %
(``parentbased_traceidratio``; the calls carry no ``traceparent``, so the
gate draws), exporting over OTLP/gRPC to a real receiver
(``tests/support/otlp_receiver.py``) run in a *child process*, so that
receiving does not count. CPU is ``time.process_time()`` (every thread, so
the SDK's batch-export thread is counted; each case's provider lives for
the whole run and its queue is flushed inside each measure), per call; the
cases alternate within each round and the medians of the rounds are printed, with each
case's ratio to off.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envoy.service.auth.v3 import external_auth_pb2  # noqa: E402
from envoy.service.ratelimit.v3 import rls_pb2  # noqa: E402

from bench.extauthz.bench import check_request, write_config  # noqa: E402
from extauthz.app import ExtAuthzApp  # noqa: E402
from extauthz.grpc_api import CheckHandler  # noqa: E402
from meshplane.tracing import TraceSettings, Tracing, start_tracing  # noqa: E402
from ratelimit.config import load_config  # noqa: E402
from ratelimit.service import RateLimitService  # noqa: E402
from ratelimit.settings import Settings  # noqa: E402
from ratelimit.store.memory import MemoryStore  # noqa: E402

RATIOS = {"off": None, "1%": 0.01, "100%": 1.0}
_LIMITS = """\
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
"""
_RECEIVER = """
import sys
from tests.support.otlp_receiver import OtlpGrpcReceiver
with OtlpGrpcReceiver() as sink:
    print(sink.port, flush=True)
    sys.stdin.read()  # until the bench closes our stdin
    print(len(sink.spans()), flush=True)
"""


@contextmanager
def receiver() -> Iterator[tuple[str, Callable[[], int]]]:
    """(endpoint, spans received once stopped) of a receiver in a child process."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _RECEIVER],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    received: list[int] = []
    try:
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}", lambda: received[0] if received else -1
    finally:
        proc.stdin.close()
        line = proc.stdout.readline().strip()
        received.append(int(line) if line else -1)
        proc.wait(30)


def tracing_at(endpoint: str, ratio: float | None, service: str) -> Tracing | None:
    if ratio is None:
        return None
    settings = TraceSettings(endpoint, "grpc", "parentbased_traceidratio", ratio, service)
    return start_tracing(settings)


def per_call(call: Callable[[], Awaitable[bytes]], calls: int, tracing: Tracing | None) -> float:
    """CPU µs per call; the SDK's queue is exported inside the measure."""

    async def loop() -> None:
        for _ in range(calls):
            await call()

    asyncio.run(loop_warm(call))
    if tracing is not None:
        tracing.provider.force_flush()  # the warm-up's spans are not this measure's
    start = time.process_time()
    asyncio.run(loop())
    if tracing is not None:
        tracing.provider.force_flush()  # the spans these calls queued are exported inside
    return (time.process_time() - start) / calls * 1e6


async def loop_warm(call: Callable[[], Awaitable[bytes]]) -> None:
    for _ in range(200):
        await call()


def extauthz_case(directory: Path) -> Callable[[Tracing | None], Callable[[], Awaitable[bytes]]]:
    config, tokens = write_config(directory, 10_000)
    app = ExtAuthzApp(config)
    raw = check_request(tokens["hs"], "hs").SerializeToString()

    def make(tracing: Tracing | None) -> Callable[[], Awaitable[bytes]]:
        handler = CheckHandler(app.service, tracing)
        answer = external_auth_pb2.CheckResponse.FromString(asyncio.run(handler(raw)))
        assert answer.status.code == 0, answer  # an allow, checked before measuring
        return lambda: handler(raw)

    return make


def ratelimit_case(directory: Path) -> Callable[[Tracing | None], Callable[[], Awaitable[bytes]]]:
    (directory / "limits.yaml").write_text(_LIMITS)
    config = load_config(directory / "limits.yaml")
    request = rls_pb2.RateLimitRequest(domain="bench")
    request.descriptors.add().entries.add(key="client", value="c1")
    raw = request.SerializeToString()

    def make(tracing: Tracing | None) -> Callable[[], Awaitable[bytes]]:
        service = RateLimitService(lambda: config, MemoryStore(), Settings(), tracing=tracing)
        answer = rls_pb2.RateLimitResponse.FromString(asyncio.run(service.decide(raw)))
        assert answer.overall_code == rls_pb2.RateLimitResponse.OK, answer
        return lambda: service.decide(raw)

    return make


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, receiver() as (endpoint, received):
        makers = {
            "extauthz Check": extauthz_case(Path(tmp)),
            "ratelimit decide": ratelimit_case(Path(tmp)),
        }
        # One provider per case for the whole run (as a worker has one), its
        # exporter's channel connected by the check call's flush before measuring.
        cases = []
        for service, make in makers.items():
            for case, ratio in RATIOS.items():
                tracing = tracing_at(endpoint, ratio, service.split()[0])
                cases.append((service, case, make(tracing), tracing))
                if tracing is not None:
                    tracing.provider.force_flush()
        for round_ in range(args.rounds):
            for service, case, call, tracing in cases:
                figure = per_call(call, args.calls, tracing)
                results.setdefault((service, case), []).append(figure)
            print(f"round {round_ + 1}/{args.rounds} done", flush=True)
        for *_, tracing in cases:
            if tracing is not None:
                tracing.shutdown()
    print(f"\n{'case':<28} {'CPU µs/call':>12} {'vs off':>8}   rounds")
    for (service, case), values in results.items():
        median = statistics.median(values)
        off = statistics.median(results[(service, "off")])
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(f"{service + ', ' + case:<28} {median:>12.1f} {median / off - 1:>+8.1%}   {shown}")
    print(f"\nspans received by the OTLP receiver: {received()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
