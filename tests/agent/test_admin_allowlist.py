"""The admin allow-list and request builder (agent.admin), table-tested: pure, no Envoy."""

from __future__ import annotations

import pytest

from agent import admin, contract
from agent.admin import AdminRefused, AdminRequest


@pytest.mark.parametrize(
    "request_",
    [
        AdminRequest("POST", "/quitquitquit"),
        AdminRequest("GET", "/quitquitquit"),
        AdminRequest("POST", "/healthcheck/fail"),
        AdminRequest("POST", "/drain_listeners"),
        AdminRequest("GET", "/certs"),
        AdminRequest("POST", "/reopen_logs"),
        AdminRequest("POST", "/runtime_modify", (("a", "b"),)),
        AdminRequest("GET", "/stats/../quitquitquit"),
        AdminRequest("GET", "/stats/"),
        AdminRequest("POST", "/stats"),  # wrong method
        AdminRequest("GET", "/logging"),  # Envoy's /logging is POST
        AdminRequest("GET", "/stats", (("format", "json"), ("format", "text"))),
        AdminRequest("GET", "/stats", (("recentlookups", ""),)),
        AdminRequest("POST", "/logging", (("admin", "debug"),)),  # only level= and paths=
        AdminRequest("GET", "/stats", (("filter", "a\r\nPOST /quitquitquit"),)),
    ],
)
def test_everything_outside_the_allow_list_is_refused(request_: AdminRequest) -> None:
    with pytest.raises(AdminRefused):
        admin.check(request_)


@pytest.mark.parametrize(
    ("built", "target"),
    [
        (admin.cluster_stats(), "/clusters?format=json"),
        (admin.server_info(), "/server_info"),
        (admin.server_stats("", False), "/stats?format=json"),
        (
            admin.server_stats(r"^server\.live$", True),
            "/stats?format=json&filter=%5Eserver%5C.live%24&usedonly",
        ),
        # a value can never add a parameter or change the path
        (
            admin.server_stats("x&quitquitquit=1", False),
            "/stats?format=json&filter=x%26quitquitquit%3D1",
        ),
        (
            admin.server_stats("/../quitquitquit?#", False),
            "/stats?format=json&filter=%2F..%2Fquitquitquit%3F%23",
        ),
        (admin.config_dump("", "", False), "/config_dump"),
        (
            admin.config_dump("dynamic_active_clusters", "cluster.name", True),
            "/config_dump?resource=dynamic_active_clusters&mask=cluster.name&include_eds",
        ),
        (admin.get_loggers(), "/logging"),
        (admin.set_loggers("debug", {}), "/logging?level=debug"),
        (
            admin.set_loggers("", {"upstream": "trace", "http": "info"}),
            "/logging?paths=http%3Ainfo%2Cupstream%3Atrace",
        ),
    ],
)
def test_builders_encode_every_value(built: AdminRequest, target: str) -> None:
    assert built.target() == target
    assert admin.check(built) is built


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: admin.set_loggers("loud", {}), "level"),
        (lambda: admin.set_loggers("", {"../quitquitquit": "info"}), "loggers"),
        (lambda: admin.set_loggers("", {"admin": "info&x"}), "loggers.admin"),
        (lambda: admin.set_loggers("info", {"admin": "info"}), "level"),
        (lambda: admin.set_loggers("", {}), "level"),
        (lambda: admin.config_dump("quit/quit", "", False), "resource"),
        (lambda: admin.config_dump("", "a&b", False), "mask"),
        (lambda: admin.server_stats("(unclosed", False), "filter"),
        (lambda: admin.server_stats("a\nb", False), "filter"),
        (lambda: admin.server_stats("x" * 2000, False), "filter"),
    ],
)
def test_bad_fields_name_the_field(build: object, field: str) -> None:
    with pytest.raises(contract.FieldError) as info:
        build()  # type: ignore[operator]
    assert info.value.field == field


@pytest.mark.parametrize(
    ("namespace", "workload", "instance", "field"),
    [
        ("", "web", "", "namespace"),
        ("shop", "", "", "workload"),
        ("Shop", "web", "", "namespace"),
        ("shop", "web/../x", "", "workload"),
        ("shop", "web", "web-1/../../quitquitquit", "instance"),
        ("shop", "web", "web-1?x", "instance"),
    ],
)
def test_workload_names(namespace: str, workload: str, instance: str, field: str) -> None:
    with pytest.raises(contract.FieldError) as info:
        contract.check_workload(namespace, workload, instance)
    assert info.value.field == field


def test_logging_answer_is_parsed() -> None:
    text = "active loggers:\n  admin: debug\n  http: info\n  bogus: loud\nusage: x\n"
    assert admin.parse_loggers(text) == {"admin": "debug", "http": "info"}
