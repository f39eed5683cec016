"""CPU of the ext_authz Check handler alone: wire bytes in, wire bytes out.

    uv run --frozen python bench/extauthz/check_cost.py [--calls 50000] [--rounds 5]

``bench/asgi_cost.py`` adds the ASGI gRPC adapter and the event loop (about
half of its figure), so a change of a microsecond in the handler is lost in
its noise on a shared machine. This calls the very ``CheckHandler`` both
servers call, on the CheckRequest of ``bench.py`` (the real parse, policy
selection, token cache, claim checks, metrics and response bytes), driving
each call's coroutine by hand: none of these cases waits, so no loop turn is
counted. Cases:

* ``hs256``: a valid HS256 token, a token-cache hit (the usual call);
* ``hs256 policy``: the same, the policy named by the ``meshplane.policy``
  context extension (what a gateway route sends);
* ``forged``: one forged token repeated (a kept refusal, a 403).

Prints each case's process CPU µs per call: min, median and max of the rounds
(the rounds interleave the cases). Quote the median with the load average.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.extauthz.bench import check_request, write_config
from extauthz.app import ExtAuthzApp
from extauthz.grpc_api import CheckHandler


def _caller(handler: CheckHandler, raw: bytes) -> Callable[[], bytes]:
    """One call, its coroutine run to its end without an event loop."""

    def call() -> bytes:
        coroutine = handler(raw)
        try:
            coroutine.send(None)
        except StopIteration as done:
            answer: bytes = done.value
            return answer
        coroutine.close()
        raise SystemExit("the Check waited: this case needs an event loop")

    return call


def _per_call(call: Callable[[], bytes], calls: int) -> float:
    started = time.process_time()
    for _ in range(calls):
        call()
    return (time.process_time() - started) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    config, tokens = write_config(Path(tempfile.mkdtemp(prefix="check-cost-")), 10_000)
    handler = CheckHandler(ExtAuthzApp(str(config)).service)
    cases = {
        name: _caller(handler, check_request(tokens[token], policy).SerializeToString())
        for name, token, policy in (
            ("hs256", "hs", None),
            ("hs256 policy", "hs", "hs"),
            ("forged", "forged", None),
        )
    }
    for call in cases.values():
        for _ in range(500):  # the token cache, the refusal cache, the memos
            call()
    gc.collect()
    gc.freeze()  # as a worker does once started (extauthz.app)
    figures: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, call in cases.items():
            figures[name].append(_per_call(call, args.calls))
    print(f"load average {os.getloadavg()[0]:.2f}; CPU µs per call over {args.rounds} rounds")
    print(f"{'case':<14} {'min':>6} {'median':>7} {'max':>6}")
    for name, values in figures.items():
        print(
            f"{name:<14} {min(values):>6.2f} {statistics.median(values):>7.2f} {max(values):>6.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
