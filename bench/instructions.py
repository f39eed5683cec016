"""Instructions per unary call through the gRPC adapter, counted by callgrind, against a baseline.

    uv run --frozen python bench/instructions.py            # compare with the baseline
    uv run --frozen python bench/instructions.py --update   # write the baseline

CPU-time benches move ±30 % with this machine's load; an instruction count
does not. This runs the services' real handlers behind
:class:`meshplane.asgi_grpc.GrpcAsgiApp`, on uvloop, in a Python process under
``valgrind --tool=callgrind``, through both entries of the unary path:

* ``asgi``: ``GrpcAsgiApp.__call__`` (what pyvoy calls on the ``envoy``
  backend), with ``receive``/``send`` that answer at once;
* ``complete``: ``GrpcAsgiApp.complete_unary`` (what the ``h2`` backend calls
  for a request whose body came whole), with a responder that keeps nothing.

on cached paths (no call suspends, so no loop turn is counted):

* ``check``: ext_authz Check, a valid HS256 token (a token-cache hit);
* ``rls``: ShouldRateLimit on an empty bucket, answered by the local cache of
  the Redis store stack (its connection is ``bench/asgi_cost.py``'s fake,
  never reached by these calls).

Each call carries ``grpc-timeout`` as Envoy's filters send it. The counters are
zeroed (``callgrind_control -z``) and dumped (``-d``) around ``--calls`` and
``--calls * 5`` calls of each case; the difference divided by the difference
in calls is the count per call (so the control's own work cancels out).
``PYTHONHASHSEED`` is fixed; two runs agree within a few tenths of a percent.

Compared with ``bench/instructions_baseline.json``: a case more than
``--tolerance`` (default 5 %) above its baseline fails the run (exit 1) with
the cases named; one more than that below it says to update the baseline.
About two minutes (most of it importing under valgrind).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop
from envoy.service.ratelimit.v3 import rls_pb2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.asgi_cost import RLS_CONFIG, connect_fake_redis  # noqa: E402
from bench.extauthz.bench import check_request, grpc_frame, write_config  # noqa: E402
from extauthz.app import ExtAuthzApp  # noqa: E402
from meshplane.asgi_grpc import GrpcAsgiApp  # noqa: E402
from meshplane.server_contract import new_worker_context  # noqa: E402
from ratelimit.app import AppOptions, RateLimitApp  # noqa: E402
from ratelimit.settings import Settings  # noqa: E402

BASELINE = ROOT / "bench" / "instructions_baseline.json"
CHECK = "/envoy.service.auth.v3.Authorization/Check"
RLS = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
HEADERS = [
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
    (b"grpc-timeout", b"60S"),  # as Envoy sends it; long: valgrind is slow
    (b"user-agent", b"envoy"),
]
CASES = ("check asgi", "check complete", "rls asgi", "rls complete")


# ---- the process under callgrind -------------------------------------------------------


class _Responder:
    """The h2 stream's place in ``complete_unary``: the answer is dropped."""

    def respond(self, start: dict[str, Any], body: bytes, trailers: dict[str, Any] | None) -> None:
        return None


async def _calls() -> dict[str, Callable[[], Awaitable[None]]]:
    """One call of each case, ready to repeat (the caches warmed, each checked OK)."""
    workdir = Path(tempfile.mkdtemp(prefix="instructions-"))
    config, tokens = write_config(workdir, 10_000)
    ext = ExtAuthzApp(str(config))
    ctx = new_worker_context(ext)
    await ext.start(ctx)
    check_app = GrpcAsgiApp(ctx.services, ctx.health, tuple(ext.service_names))
    check_body = grpc_frame(check_request(tokens["hs"], None).SerializeToString())

    loop = asyncio.get_running_loop()
    loop.create_connection = connect_fake_redis  # type: ignore[method-assign]  # a fake Redis, for this loop only
    (workdir / "rls").mkdir()
    (workdir / "rls/bench.yaml").write_text(RLS_CONFIG)
    # The store's timeout long: under callgrind the fake Redis's next loop turn is
    # far from the 10 ms a worker allows (the timed calls never reach it).
    rls = RateLimitApp(
        AppOptions(
            str(workdir / "rls"),
            redis_url="redis://127.0.0.1:6379/0",
            settings=Settings(store_timeout=30.0),
        )
    )
    ctx = new_worker_context(rls)
    await rls.start(ctx)
    rls_app = GrpcAsgiApp(ctx.services, ctx.health, tuple(rls.service_names))
    request = rls_pb2.RateLimitRequest(domain="bench")
    request.descriptors.add().entries.add(key="blocked", value="b")
    rls_body = grpc_frame(request.SerializeToString())

    calls: dict[str, Callable[[], Awaitable[None]]] = {}
    statuses: dict[str, set[bytes]] = {}
    for name, app, path, body, expected in (
        ("check", check_app, CHECK, check_body, b"0"),
        ("rls", rls_app, RLS, rls_body, b"0"),
    ):
        calls[f"{name} asgi"] = _asgi_call(app, path, body)
        calls[f"{name} complete"] = _complete_call(app, path, body)
        statuses[name] = await _statuses(app, path, body)
        if statuses[name] != {expected}:
            raise SystemExit(f"{name} answered grpc-status {sorted(statuses[name])}: fix the bench")
    answer = rls_pb2.RateLimitResponse.FromString((await _body(rls_app, RLS, rls_body))[5:])
    if answer.overall_code != rls_pb2.RateLimitResponse.OVER_LIMIT:
        raise SystemExit("the rls case is not answered over the limit: not the cached path")
    for name, call in calls.items():
        for _ in range(200):  # the token cache, the plans, the header blocks
            await call()
        coroutine = call()
        try:
            coroutine.send(None)  # type: ignore[attr-defined]
        except StopIteration:
            continue
        coroutine.close()  # type: ignore[attr-defined]
        raise SystemExit(f"{name} waited: not a cached path, a loop turn would be counted")
    return calls


def _asgi_call(app: Any, path: str, body: bytes) -> Callable[[], Awaitable[None]]:
    scope = {"type": "http", "method": "POST", "path": path, "headers": HEADERS}
    message = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict[str, Any]:
        return message

    async def send(_: dict[str, Any]) -> None:
        return None

    def call() -> Awaitable[None]:
        return app(scope, receive, send)  # type: ignore[no-any-return]

    return call


def _complete_call(app: Any, path: str, body: bytes) -> Callable[[], Awaitable[None]]:
    responder = _Responder()

    def call() -> Awaitable[None]:
        awaitable = app.complete_unary("POST", path, HEADERS, body, responder)
        if awaitable is None:
            raise SystemExit(f"complete_unary declined {path}: fix the bench")
        return awaitable  # type: ignore[no-any-return]

    return call


async def _answer(app: Any, path: str, body: bytes) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": HEADERS}
    await app(scope, receive, send)
    return sent


async def _statuses(app: Any, path: str, body: bytes) -> set[bytes]:
    return {
        value
        for message in await _answer(app, path, body)
        for key, value in message.get("headers", ())
        if key == b"grpc-status"
    }


async def _body(app: Any, path: str, body: bytes) -> bytes:
    return b"".join(m.get("body", b"") for m in await _answer(app, path, body))


async def _inner(calls_per_round: int) -> None:
    """Under callgrind: for each case and count, ``ready`` → (zeroed) → the calls →
    ``done`` → (dumped); the driver answers each line with one of its own."""
    calls = await _calls()
    for name in CASES:
        call = calls[name]
        for count in (calls_per_round, calls_per_round * 5):
            _say(f"ready {name} {count}")
            for _ in range(count):
                await call()
            _say("done")


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    sys.stdin.readline()  # the driver's go-ahead, once it has zeroed or dumped


# ---- the driver ----------------------------------------------------------------------------


def count(calls_per_round: int) -> dict[str, float]:
    """Instructions per call of each case (see the module docstring)."""
    work = Path(tempfile.mkdtemp(prefix="instructions-cg-"))
    out = work / "callgrind.out"
    # Instrumented only from the first case on (``-i on``): the imports and the
    # set-up run at valgrind's plain speed, several times callgrind's.
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
           sys.executable, __file__, "--inner", "--calls", str(calls_per_round)]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    with open(work / "valgrind.log", "wb") as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env
        )
    assert proc.stdin is not None and proc.stdout is not None
    totals: dict[tuple[str, int], int] = {}
    try:
        current: tuple[str, int] | None = None
        for line in proc.stdout:
            words = line.split()
            if words[0] == "ready":
                if current is None:
                    _control(proc.pid, "-i", "on")
                current = (" ".join(words[1:-1]), int(words[-1]))
                _control(proc.pid, "-z")
            elif words[0] == "done" and current is not None:
                totals[current] = _dump(proc.pid, work)
            proc.stdin.write("go\n")
            proc.stdin.flush()
        if proc.wait() != 0:
            raise SystemExit(f"the callgrind run failed, see {work / 'valgrind.log'}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    small, large = calls_per_round, calls_per_round * 5
    return {
        name: (totals[(name, large)] - totals[(name, small)]) / (large - small) for name in CASES
    }


def _control(pid: int, *flags: str) -> None:
    subprocess.run(["callgrind_control", *flags, str(pid)], check=True, capture_output=True)


def _dump(pid: int, work: Path) -> int:
    before = set(work.glob("callgrind.out.*"))
    _control(pid, "-d")
    (dump,) = set(work.glob("callgrind.out.*")) - before
    for line in dump.read_text().splitlines():
        if line.startswith("summary:"):
            dump.unlink()
            return int(line.split()[1])
    raise RuntimeError(f"no summary in {dump}")


def compare(counts: dict[str, float], baseline: dict[str, float], tolerance: float) -> list[str]:
    """The cases above their baseline by more than ``tolerance`` (a fraction)."""
    return [
        f"{name}: {counts[name]:.0f} instructions/call, baseline {baseline[name]:.0f} "
        f"({counts[name] / baseline[name] - 1:+.1%}, tolerance +{tolerance:.0%})"
        for name in CASES
        if name in baseline and counts[name] > baseline[name] * (1 + tolerance)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="calls of the smaller run")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--update", action="store_true", help="write the baseline")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        uvloop.run(_inner(args.calls))
        return 0
    counts = count(args.calls)
    baseline = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
    print(f"{'case':<16} {'instructions/call':>18} {'baseline':>9} {'change':>8}")
    for name in CASES:
        base = baseline.get(name)
        change = f"{counts[name] / base - 1:+.1%}" if base else "-"
        print(f"{name:<16} {counts[name]:>18.0f} {base or 0:>9.0f} {change:>8}")
    if args.update:
        BASELINE.write_text(json.dumps({n: round(counts[n]) for n in CASES}, indent=2) + "\n")
        print(f"wrote {BASELINE.relative_to(ROOT)}")
        return 0
    regressions = compare(counts, baseline, args.tolerance)
    if regressions:
        print("REGRESSION: more instructions per call than the baseline allows:", file=sys.stderr)
        for line in regressions:
            print(f"  {line}", file=sys.stderr)
        return 1
    cheaper = [n for n in CASES if n in baseline and counts[n] < baseline[n] * (1 - args.tolerance)]
    if cheaper:
        print(f"cheaper than the baseline: {', '.join(cheaper)}; run with --update to keep it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
