"""``meshctl get workloads``'s pure parts: rows, callers and expiry words (clock given)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from meshctl import workloads

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        ("2026-11-30T11:00:00Z", "in 23h"),
        ("2026-11-29T11:55:00Z", "expired 5m ago"),
        (None, "-"),
        ("not a time", "-"),
    ],
)
def test_until(stamp: Any, expected: str) -> None:
    assert workloads.until(stamp, NOW) == expected


@pytest.mark.parametrize(
    ("authorization", "expected"),
    [
        ({"setting": None, "mode": None, "principals": None}, "anyone (no setting)"),
        ({"setting": "s", "mode": "UNSET", "principals": None}, "anyone (mode UNSET)"),
        ({"setting": "s", "mode": "RULES", "principals": []}, "nobody"),
        ({"mode": "CUSTOM", "principals": ["spiffe://td/ns/a/sa/b", "spiffe://td/ns/c/sa/*"]},
         "spiffe://td/ns/a/sa/b, spiffe://td/ns/c/sa/*"),
    ],
)  # fmt: skip
def test_callers(authorization: dict[str, Any], expected: str) -> None:
    assert workloads.callers(authorization) == expected


def test_the_table_has_one_row_per_sidecar_and_the_trust_domain() -> None:
    view = {
        "trustDomain": "c.o.mesh.local",
        "namespaces": [{"name": "shop"}],
        "workloads": [
            {
                "namespace": "shop",
                "service": "web",
                "spiffeId": "spiffe://c.o.mesh.local/ns/shop/sa/web",
                "certificate": {"notAfter": "2026-11-29T13:00:00Z"},
                "authorization": {"mode": "NAMESPACE", "principals": ["x*"]},
                "config": {"connected": True, "upToDate": True, "lastResult": "ACK"},
                "replica": "r1",
            },
            {"namespace": "shop", "service": "api", "config": None},
        ],
    }
    out = workloads.render_table(view, NOW)
    lines = out.splitlines()
    assert lines[:2] == ["Trust domain: c.o.mesh.local", "Mesh namespaces: shop"]
    assert lines[2].split() == [
        "NAMESPACE", "SERVICE", "IDENTITY", "CERT", "EXPIRES", "MODE", "CALLERS", "CONFIG",
        "REPLICA",
    ]  # fmt: skip
    assert lines[3].split() == [
        "shop", "web", "spiffe://c.o.mesh.local/ns/shop/sa/web", "in", "1h", "NAMESPACE",
        "x*", "ACK", "r1",
    ]  # fmt: skip
    assert "anyone (no setting)" in lines[4] and lines[4].split()[-1] == "-"
    assert workloads.render_table({"workloads": []}, NOW).endswith("No sidecar is connected.\n")
