"""Checks are counted by mode, result and reason; latency is observed per check."""

from __future__ import annotations

import os
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from extauthz import metrics
from extauthz.reasons import Decision, Reason
from meshplane.metrics import render_latest

from .cases import GOOD
from .jwtkit import HS_SECRET, claims, make_token
from .metricsutil import sample
from .policies import write_policies
from .support import GrpcClient, ServerThread, app_factory, check_request, http_check

CHECKS = "meshplane_extauthz_checks_total"


def test_checks_counted_by_mode_result_and_reason(tmp_path: Path) -> None:
    os.environ["EXTAUTHZ_TEST_SECRET"] = HS_SECRET.decode()
    try:
        with ServerThread(app_factory(write_policies(tmp_path))) as server:
            client = GrpcClient(server.port)
            expired = make_token(claims(time.time(), exp=int(time.time()) - 5))
            before = render_latest().decode()
            for _ in range(3):
                client.check(check_request("/headers", {"authorization": f"Bearer {expired}"}))
            for _ in range(2):
                client.check(check_request("/headers", {"authorization": f"Bearer {GOOD}"}))
            for _ in range(4):
                http_check(server.http_port, "/check/-/get", [("authorization", f"Bearer {GOOD}")])
            expected = {
                (CHECKS, ("grpc", "deny", "expired")): 3,
                (CHECKS, ("grpc", "allow", "ok")): 2,
                (CHECKS, ("http", "deny", "path_not_allowed")): 4,
                (CHECKS, ("http", "allow", "ok")): 0,
            }

            def deltas(text: str) -> dict[tuple[str, tuple[str, ...]], float]:
                out: dict[tuple[str, tuple[str, ...]], float] = {}
                for name, (mode, result, reason) in expected:
                    labels = {"mode": mode, "result": result, "reason": reason}
                    out[(name, (mode, result, reason))] = sample(text, name, **labels) - sample(
                        before, name, **labels
                    )
                return out

            # Check metrics are aggregated per process and flushed every 0.5 s.
            deadline = time.monotonic() + 10
            while deltas(render_latest().decode()) != expected:
                assert time.monotonic() < deadline, deltas(render_latest().decode())
                time.sleep(0.05)
            after = render_latest().decode()
            for mode, count in (("grpc", 5), ("http", 4)):
                name = "meshplane_extauthz_check_duration_seconds_count"
                assert sample(after, name, mode=mode) - sample(before, name, mode=mode) == count
            client.close()
    finally:
        os.environ.pop("EXTAUTHZ_TEST_SECRET", None)


def test_metric_labels_are_bounded() -> None:
    # Only closed sets appear as labels: never policy names, paths or tokens.
    reasons = {reason.value for reason in Reason}
    for family in text_string_to_metric_families(render_latest().decode()):
        if family.name != CHECKS.removesuffix("_total"):
            continue
        for s in family.samples:
            if s.name != CHECKS:
                continue
            assert set(s.labels) == {"mode", "result", "reason"}
            assert s.labels["mode"] in {"grpc", "http"}
            assert s.labels["result"] in {"allow", "deny"}
            assert s.labels["reason"] in reasons


def test_flushed_histogram_matches_per_observation_semantics() -> None:
    decision = Decision(allowed=False, reason=Reason.EXPIRED)
    name = "meshplane_extauthz_check_duration_seconds"
    before = render_latest().decode()
    for seconds in (0.0003, 0.0005, 0.3):  # 0.0005 sits exactly on a bound (le is inclusive)
        metrics.record_check("http", decision, seconds)
    metrics.flush()
    after = render_latest().decode()

    def delta(suffix: str, **labels: str) -> float:
        full = name + suffix
        return sample(after, full, mode="http", **labels) - sample(
            before, full, mode="http", **labels
        )

    assert delta("_bucket", le="0.00025") == 0
    assert delta("_bucket", le="0.0005") == 2
    assert delta("_bucket", le="0.25") == 2
    assert delta("_bucket", le="+Inf") == 3
    assert delta("_count") == 3
    assert abs(delta("_sum") - 0.3008) < 1e-9
    checks = sample(after, CHECKS, mode="http", result="deny", reason="expired") - sample(
        before, CHECKS, mode="http", result="deny", reason="expired"
    )
    assert checks == 3
