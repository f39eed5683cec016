"""The pure decision, table-tested: namespace, labels, annotations, config -> inject or not, why."""

from __future__ import annotations

import pytest

from injector.config import InjectorConfig, SidecarSettings
from injector.decision import Decision, PodFacts, Reason, decide, opted_out

CONFIG = InjectorConfig(
    organization="acme",
    cluster="east",
    control_plane="grpc://10.0.0.1:8443",
    sidecar=SidecarSettings("img"),
    system_namespaces=frozenset({"kube-system", "meshplane-system"}),
)
CUSTOM_LABEL = InjectorConfig(
    organization="acme",
    cluster="east",
    control_plane="grpc://10.0.0.1:8443",
    sidecar=SidecarSettings("img"),
    system_namespaces=frozenset({"ops"}),
    opt_out_label="mesh.example/sidecar",
)
OPT = "sidecar.meshplane.io/inject"
STATUS = "sidecar.meshplane.io/status"


def facts(
    namespace: str = "shop",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    containers: tuple[str, ...] = ("app",),
    host_network: bool = False,
) -> PodFacts:
    return PodFacts(namespace, labels or {}, annotations or {}, list(containers), host_network)


CASES = [
    ("plain pod", facts(), CONFIG, Decision(True, Reason.INJECTED)),
    ("system namespace", facts("kube-system"), CONFIG, Decision(False, Reason.SYSTEM_NAMESPACE)),
    (
        "system namespace wins over everything",
        facts("meshplane-system", labels={OPT: "true"}),
        CONFIG,
        Decision(False, Reason.SYSTEM_NAMESPACE),
    ),
    (
        "configured system list",
        facts("ops"),
        CUSTOM_LABEL,
        Decision(False, Reason.SYSTEM_NAMESPACE),
    ),
    ("kube-system not listed", facts("kube-system"), CUSTOM_LABEL, Decision(True, Reason.INJECTED)),
    ("label false", facts(labels={OPT: "false"}), CONFIG, Decision(False, Reason.OPTED_OUT_LABEL)),
    (
        "label FALSE",
        facts(labels={OPT: " FALSE "}),
        CONFIG,
        Decision(False, Reason.OPTED_OUT_LABEL),
    ),
    ("label true", facts(labels={OPT: "true"}), CONFIG, Decision(True, Reason.INJECTED)),
    ("label no", facts(labels={OPT: "no"}), CONFIG, Decision(True, Reason.INJECTED)),
    (
        "annotation false",
        facts(annotations={OPT: "false"}),
        CONFIG,
        Decision(False, Reason.OPTED_OUT_ANNOTATION),
    ),
    (
        "custom label",
        facts(labels={"mesh.example/sidecar": "false"}),
        CUSTOM_LABEL,
        Decision(False, Reason.OPTED_OUT_LABEL),
    ),
    (
        "default label ignored",
        facts(labels={OPT: "false"}),
        CUSTOM_LABEL,
        Decision(True, Reason.INJECTED),
    ),
    (
        "sidecar container",
        facts(containers=("app", "meshplane-sidecar")),
        CONFIG,
        Decision(False, Reason.ALREADY_INJECTED),
    ),
    (
        "status annotation",
        facts(annotations={STATUS: "{}"}),
        CONFIG,
        Decision(False, Reason.ALREADY_INJECTED),
    ),
    ("host network", facts(host_network=True), CONFIG, Decision(False, Reason.HOST_NETWORK)),
]


@pytest.mark.parametrize(("name", "pod", "config", "expected"), CASES, ids=[c[0] for c in CASES])
def test_decision_table(
    name: str, pod: PodFacts, config: InjectorConfig, expected: Decision
) -> None:
    assert decide(pod, config) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, False), ("", False), ("false", True), ("False", True), ("0", False), ("true", False)],
)
def test_opted_out_values(value: str | None, expected: bool) -> None:
    assert opted_out(value) is expected
