"""SIGTERM drains the management API and exits 0, like the gRPC services."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx

from tests.mgmt_api.harness import MgmtServer, ok


def test_sigterm_finishes_in_flight_requests_and_exits_zero(
    database_factory: Callable[[str], str | None],
) -> None:
    server = MgmtServer(database_factory("sqlite")).start()
    try:
        answers: list[int] = []
        with server.admin() as admin:
            ok(admin.post("/v2/organizations", json={"name": "drain", "organization": {}}))

            def write_while_stopping() -> None:
                for i in range(20):
                    try:
                        resp = admin.post(
                            "/v2/organizations/drain/tenants",
                            json={"name": f"t{i}", "tenant": {}},
                        )
                    except httpx.TransportError:
                        return  # the listener is closed: no new requests
                    answers.append(resp.status_code)

            writer = threading.Thread(target=write_while_stopping)
            writer.start()
            server.stop()
            writer.join(30)
        assert server.exit_code == 0, server.log_path.read_text()[-2000:]
        log = server.log_path.read_text()
        assert "Application shutdown complete" in log
        # Every request that got an answer got a real one, never a 5xx mid-drain.
        assert all(code == 200 for code in answers), answers
    finally:
        server.close()
