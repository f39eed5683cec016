"""The agent's static proxies file: what it accepts and its located errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.discovery.static import load
from meshplane.config_error import ConfigError

ENTRY = "  - {namespace: shop, workload: web, instance: web-1, adminAddress: 10.0.0.7:15000}\n"


def test_both_forms_load(tmp_path: Path) -> None:
    path = tmp_path / "proxies.yaml"
    path.write_text(
        "proxies:\n"
        + ENTRY
        + "  - namespace: shop\n    workload: web\n    instance: web-2\n"
        + "    adminAddress: 10.0.0.8:15000\n    logFile: /var/log/envoy.log\n"
    )
    first, second = load(path)
    assert (first.namespace, first.pod_ip, first.log_file) == ("shop", "10.0.0.7", None)
    assert (second.instance, second.log_file) == ("web-2", "/var/log/envoy.log")
    path.write_text(ENTRY.lstrip())
    assert [p.instance for p in load(path)] == ["web-1"]
    path.write_text("")
    assert load(path) == []


def test_a_sidecar_is_reached_on_its_diagnostics_port_over_mtls(tmp_path: Path) -> None:
    path = tmp_path / "proxies.yaml"
    path.write_text(ENTRY + ENTRY.replace("web-1", "web-2").replace("admin", "diagnostics"))
    gateway, sidecar = load(path)
    assert (gateway.mtls, gateway.admin_address) == (False, "10.0.0.7:15000")
    assert (sidecar.mtls, sidecar.admin_address) == (True, "10.0.0.7:15000")


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        ("proxies: {a: 1}\n", 1, "proxies", "must be a list of proxies"),
        (
            "proxies:\n" + ENTRY.replace("instance", "instanse"),
            2,
            "proxies[0].instanse",
            "unknown key 'instanse' (did you mean 'instance'?)",
        ),
        (
            "proxies:\n" + ENTRY.replace("workload: web", "workload: ''"),
            2,
            "proxies[0].workload",
            "non-empty string",
        ),
        ("proxies:\n  - x\n", 2, "proxies[0]", "must be a mapping"),
        ("- namespace: shop\n  workload: web\n", 1, "[0].instance", "is required"),
        ("proxies:\n" + ENTRY.replace("shop", "Shop"), 2, "proxies[0].namespace", "DNS-1123"),
        (
            "proxies:\n" + ENTRY.replace("10.0.0.7:15000", "0.0.0.0:0"),
            2,
            "proxies[0].adminAddress",
            "host and a port",
        ),
        ("proxies:\n" + ENTRY + "\n" + ENTRY, 4, "proxies[1].instance", "listed twice"),
        (
            "proxies:\n" + ENTRY.replace("}", ", diagnosticsAddress: 10.0.0.7:15021}"),
            2,
            "proxies[0]",
            "exactly one of adminAddress and diagnosticsAddress",
        ),
        (
            "proxies:\n" + ENTRY.replace(", adminAddress: 10.0.0.7:15000", ""),
            2,
            "proxies[0]",
            "exactly one of adminAddress and diagnosticsAddress",
        ),
        (
            "proxies:\n" + ENTRY.replace("}", ", logFile: 3}"),
            2,
            "proxies[0].logFile",
            "non-empty string",
        ),
    ],
)
def test_errors_name_file_line_and_field(
    tmp_path: Path, text: str, line: int, field: str, message: str
) -> None:
    path = tmp_path / "proxies.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(path)
    error = info.value
    assert (error.source, error.line, error.field) == (str(path), line, field), str(error)
    assert message in error.message, str(error)
