"""The RFC 9113 scenario table against every HTTP/2 backend, printed as markdown.

    uv run --frozen python bench/h2_conformance.py

Starts one echo supervisor per backend (the matrix's, less ``grpcio``), runs
each row of tests/conformance/scenarios.py on a fresh connection to each, and
prints the verdicts beside RFC 9113's, with the reason where a backend may
differ. tests/conformance/test_h2_table.py asserts the same table; this shows
it. The frame fuzzing runs by hand with more examples through its test
(``MESHPLANE_H2_FUZZ_EXAMPLES``, ``MESHPLANE_H2_FUZZ_FRESH``).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conformance.conftest import HTTP2_BACKENDS
from tests.conformance.scenarios import SCENARIOS, allowed, run
from tests.runtime.supervisors import Supervisor


def main() -> int:
    servers = {kind: Supervisor(kind, workers=1) for kind in HTTP2_BACKENDS}
    try:
        for server in servers.values():
            server.wait_serving()
        jobs = [(scenario, kind) for scenario in SCENARIOS for kind in servers]
        with ThreadPoolExecutor(max_workers=8) as pool:
            labels = list(pool.map(lambda job: run(servers[job[1]].port, job[0])[0], jobs))
    finally:
        for server in servers.values():
            server.close()
    verdicts = {(s.name, kind): label for (s, kind), label in zip(jobs, labels, strict=True)}
    print("| scenario | RFC 9113 | expected | " + " | ".join(servers) + " | why they may differ |")
    print("|---|---|---|" + "---|" * len(servers) + "---|")
    failures = 0
    for scenario in SCENARIOS:
        cells = []
        for kind in servers:
            label = verdicts[(scenario.name, kind)]
            ok = label in allowed(scenario)
            failures += not ok
            cells.append(label if ok else f"**{label}** (not allowed)")
        print(
            f"| {scenario.name} | {scenario.rfc} | {scenario.expected} | "
            + " | ".join(cells)
            + f" | {scenario.why} |"
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
