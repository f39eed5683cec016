"""CPU per denied Check with decision logging off vs on (in process, no transport).

The Check handler (wire bytes in, wire bytes out, as both servers call it)
answers one forged HS256 token repeatedly (a bad-signature deny, the
refusal a cached dict hit after the first call, so the deny path itself is
what is measured). Three cases, interleaved over ``--rounds`` rounds:

* ``off``: no recorder (the handler as before decision logs);
* ``on-file``: every deny writes a line to a file (``--decision-log PATH``);
* ``on-otlp``: not measured here (export runs in the writer thread and costs
  a gRPC call per batch of up to 512 lines, off the request path).

CPU is ``time.process_time()`` (every thread of the process, so the writer
thread's JSON formatting and write are counted, not hidden) divided by the
calls. A tight loop of denies can outrun the writer; the lines written
(the rest were dropped and counted) are printed per round.
Each case is checked to deny (and, when on,
to carry ``x-decision-id``) before it is measured.

    uv run --frozen python bench/extauthz/decision_log_cost.py --calls 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from envoy.service.auth.v3 import external_auth_pb2

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.extauthz.bench import check_request, write_config
from extauthz.app import ExtAuthzApp
from extauthz.decisions import DecisionRecorder
from extauthz.grpc_api import CheckHandler
from meshplane.decision_log import DecisionLog, DecisionLogSettings


async def _calls(handler: CheckHandler, raw: bytes, calls: int) -> None:
    for _ in range(calls):
        await handler(raw)


def measure(
    handler: CheckHandler, raw: bytes, calls: int, log: DecisionLog | None
) -> tuple[float, float]:
    """(all threads', the request thread's) CPU seconds per call; the writer is drained
    inside the measure, so its share is in the first figure."""
    cpu, own = time.process_time(), time.thread_time()
    asyncio.run(_calls(handler, raw, calls))
    own = time.thread_time() - own
    if log is not None:
        log.close()  # the lines queued by these calls are written inside the measure
    return (time.process_time() - cpu) / calls, own / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        config, tokens = write_config(directory, 10_000)
        app = ExtAuthzApp(config)
        raw = check_request(tokens["forged"], "hs").SerializeToString()
        results: dict[str, list[tuple[float, float]]] = {"off": [], "on-file": []}
        for round_ in range(args.rounds):
            plain = CheckHandler(app.service)
            first = external_auth_pb2.CheckResponse.FromString(asyncio.run(plain(raw)))
            assert first.status.code == 7, first
            results["off"].append(measure(plain, raw, args.calls, None))
            settings = DecisionLogSettings(path=str(directory / f"decisions-{round_}.log"))
            log = DecisionLog("bench", settings)
            logged = CheckHandler(app.service, recorder=DecisionRecorder(log))
            answer = external_auth_pb2.CheckResponse.FromString(asyncio.run(logged(raw)))
            keys = [h.header.key for h in answer.denied_response.headers]
            assert answer.status.code == 7 and "x-decision-id" in keys, answer
            results["on-file"].append(measure(logged, raw, args.calls, log))
            lines = (directory / f"decisions-{round_}.log").read_text().count("\n")
            print(f"round {round_}: {lines} of {args.calls + 1} lines written (rest dropped)")
        medians = {}
        for case, values in results.items():
            total = statistics.median(v[0] for v in values)
            own = statistics.median(v[1] for v in values)
            medians[case] = (total, own)
            shown = ", ".join(f"{v[0] * 1e6:.1f}" for v in values)
            print(
                f"{case:8} CPU/call median {total * 1e6:6.1f} us all threads ({shown});"
                f" {own * 1e6:6.1f} us in the request thread"
            )
        (off, off_own), (on, on_own) = medians["off"], medians["on-file"]
        print(
            f"on-file - off: +{(on - off) * 1e6:.1f} us CPU per denied call in all,"
            f" +{(on_own - off_own) * 1e6:.1f} us on the request thread"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
