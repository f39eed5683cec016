"""RFC 9113 on every HTTP/2 backend: the scenario table, one row a test.

Each row (tests/conformance/scenarios.py, with the RFC section and, where a
backend's verdict may differ in detail, why) runs on a fresh connection to
each backend. Asserted: each backend's verdict is one RFC 9113 allows; the
``h2`` backend (ours) gives the row's own verdict, not only the general
allowances (it always sends GOAWAY or RST_STREAM with the code); every
backend's verdict is of the same class (the app answered, or nothing reached
it); and afterwards a well-behaved call on a new connection is answered.

The rows run side by side once for the module (several wait a second for
Envoy to close a connection it ended without GOAWAY), each test reads its own.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conformance.peer import Peer
from tests.conformance.scenarios import SCENARIOS, Scenario, allowed, run, verdict_class
from tests.runtime.supervisors import Supervisor

Verdicts = dict[tuple[str, str], str]


@pytest.fixture(scope="module")
def verdicts(servers: dict[str, Supervisor]) -> Verdicts:
    """(scenario, backend) → the verdict's label, every row run at once."""
    jobs = [(scenario, kind) for scenario in SCENARIOS for kind in servers]
    with ThreadPoolExecutor(max_workers=8) as pool:
        labels = pool.map(lambda job: run(servers[job[1]].port, job[0])[0], jobs)
        return {
            (scenario.name, kind): label
            for (scenario, kind), label in zip(jobs, labels, strict=True)
        }


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_backend_gives_rfc_9113s_verdict(
    servers: dict[str, Supervisor], verdicts: Verdicts, scenario: Scenario
) -> None:
    labels = {kind: verdicts[(scenario.name, kind)] for kind in servers}
    for kind, label in labels.items():
        assert label in allowed(scenario), f"{kind}: {label} (RFC 9113 {scenario.rfc})"
    if "h2" in labels:
        assert labels["h2"] in {scenario.expected, *scenario.accepted}, labels
    if scenario.same_class:
        assert len({verdict_class(label) for label in labels.values()}) == 1, labels


def test_every_backend_still_serves_after_the_table(
    servers: dict[str, Supervisor], verdicts: Verdicts
) -> None:
    for kind, server in servers.items():
        assert server.proc.poll() is None, f"{kind}'s supervisor exited"
        with Peer(server.port) as peer:
            peer.send(peer.call(1))
            assert peer.verdict(1, probe=False).label == "answer 0", kind
