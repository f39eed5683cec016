"""The webhook over real HTTPS with real AdmissionReview v1 JSON: no Kubernetes API server
runs here, so these tests send the payloads kube-apiserver sends and apply the JSONPatch
it would apply (tests/injector/support.py), then check the resulting pod.

Scope: what a pod CREATE review gets back (patch or none, warnings, uid), the
refusals of malformed input, metrics, health and the drain on SIGTERM.
"""

from __future__ import annotations

import json
import signal
import socket
from typing import Any

import httpx
import pytest

from injector.decision import PodFacts
from injector.patch import Unsafe, app_port
from injector.shape import APP_PORT_ANNOTATION
from tests.injector.support import Injector, apply_patch, patch_of, pod, review
from tests.support.certs import CertificateAuthority
from tests.support.processes import wait_until

SIDECAR = "meshplane-sidecar"
STATUS = "sidecar.meshplane.io/status"


def mutate(injector: Injector, payload: Any) -> dict[str, Any]:
    with injector.client() as client:
        answer = client.post("/mutate", json=payload)
    assert answer.status_code == 200, answer.text
    doc: dict[str, Any] = answer.json()
    assert doc["apiVersion"] == "admission.k8s.io/v1"
    assert doc["kind"] == "AdmissionReview"
    assert doc["response"]["uid"] == payload["request"]["uid"]
    assert doc["response"]["allowed"] is True
    return doc


def injected(injector: Injector, obj: dict[str, Any], namespace: str = "shop") -> dict[str, Any]:
    ops = patch_of(mutate(injector, review(obj, namespace)))
    assert ops is not None, "expected a patch"
    result: dict[str, Any] = apply_patch(obj, ops)
    return result


def test_pod_in_an_onboarded_namespace_gets_the_sidecar_admission_review_payloads(
    injector: Injector,
) -> None:
    original = pod()
    patched = injected(injector, original)
    containers = patched["spec"]["containers"]
    assert [c["name"] for c in containers] == ["app", SIDECAR]
    assert containers[0] == original["spec"]["containers"][0]  # the app is untouched
    sidecar = containers[1]
    assert sidecar["image"] == "ghcr.io/meshplane/meshplane:0.1.0"
    # The pod-local agent runs Envoy; the identity is the projected token's.
    assert sidecar["command"] == ["meshplane-sidecar-agent"]
    args = sidecar["args"]
    assert args[args.index("--cluster") + 1] == "acme/east"
    assert args[args.index("--control-plane") + 1] == "grpcs://mgmt.test:8444"
    assert args[args.index("--service") + 1] == "cart"
    assert args[args.index("--node-id") + 1] == "$(POD_NAME)"
    assert args[args.index("--inbound") + 1] == "$(POD_IP):15006"
    assert args[args.index("--token-file") + 1] == "/var/run/secrets/meshplane.io/token"
    assert args[args.index("--socket-dir") + 1] == "/var/run/meshplane"
    assert not any("admin" in a or "credentials" in a for a in args)
    env = {e["name"]: e for e in sidecar["env"]}
    assert set(env) == {"POD_NAME", "POD_IP", "MESHPLANE_CONTROL_PLANE_CA"}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert "BEGIN CERTIFICATE" in env["MESHPLANE_CONTROL_PLANE_CA"]["value"]
    assert sidecar["resources"] == {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "1", "memory": "256Mi"},
    }
    security = sidecar["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    volumes = {v["name"]: v for v in patched["spec"]["volumes"]}
    # No cluster credential: no Secret volume at all; the pod's own projected token.
    assert not any("secret" in v for v in volumes.values())
    assert volumes["meshplane-token"]["projected"]["sources"] == [
        {
            "serviceAccountToken": {
                "audience": "meshplane",
                "expirationSeconds": 3600,
                "path": "token",
            }
        }
    ]
    assert volumes["meshplane-sockets"]["emptyDir"]["medium"] == "Memory"
    mounts = {m["name"]: m for m in sidecar["volumeMounts"]}
    assert set(mounts) == set(volumes)
    assert mounts["meshplane-token"]["mountPath"] == "/var/run/secrets/meshplane.io"
    assert mounts["meshplane-token"]["readOnly"] is True
    assert mounts["meshplane-sockets"]["mountPath"] == "/var/run/meshplane"
    # Envoy's admin API is a socket: the sidecar exposes the inbound listener's port and
    # the metrics-only port (no diagnosticsCaller in this config: no diagnostics port).
    assert sidecar["ports"] == [
        {"name": "mesh-listener", "containerPort": 15006},
        {"name": "mesh-metrics", "containerPort": 15090},
    ]
    annotations = patched["metadata"]["annotations"]
    assert json.loads(annotations[STATUS])["containers"] == [SIDECAR]
    assert annotations["prometheus.io/port"] == "15090"
    # Only additions: every field of the original pod is still there, unchanged; the
    # label the cluster agent selects sidecars by is added.
    assert patched["metadata"]["labels"] == {
        **original["metadata"]["labels"],
        "security.istio.io/tlsMode": "istio",
    }
    assert patched["spec"]["serviceAccountName"] == "cart"


def test_existing_volumes_and_annotations_are_kept_admission_review_payloads(
    injector: Injector,
) -> None:
    data = {"name": "data", "emptyDir": {}}
    original = pod(volumes=[data], annotations={"team": "payments", "a/b~c": "x"})
    patched = injected(injector, original)
    assert patched["spec"]["volumes"][0] == data
    assert [v["name"] for v in patched["spec"]["volumes"]] == [
        "data",
        "meshplane-token",
        "meshplane-sockets",
    ]
    annotations = patched["metadata"]["annotations"]
    assert annotations["team"] == "payments" and annotations["a/b~c"] == "x"
    assert STATUS in annotations


def test_injected_pod_validates_against_the_kubernetes_schema_admission_review_payloads(
    injector: Injector,
) -> None:
    validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not in the lock yet (charts branch)"
    )
    patched = injected(injector, pod())
    patched["metadata"]["name"] = "cart-7d4f9c-x2x9q"  # what the API server sets from generateName
    validate.validate(patched, "1.30", strict=True)


@pytest.mark.parametrize("namespace", ["kube-system", "kube-public", "meshplane-system"])
def test_system_namespace_is_untouched_admission_review_payloads(
    injector: Injector, namespace: str
) -> None:
    untouched(injector, review(pod(namespace), namespace))


@pytest.mark.parametrize("value", ["false", "False"])
def test_opted_out_pod_is_untouched_label_admission_review_payloads(
    injector: Injector, value: str
) -> None:
    obj = pod(labels={"app": "cart", "sidecar.meshplane.io/inject": value})
    untouched(injector, review(obj))


def test_opted_out_pod_is_untouched_annotation_admission_review_payloads(
    injector: Injector,
) -> None:
    obj = pod(annotations={"sidecar.meshplane.io/inject": "false"})
    untouched(injector, review(obj))


def test_already_injected_pod_is_untouched_admission_review_payloads(injector: Injector) -> None:
    once = injected(injector, pod())
    untouched(injector, review(once))


def test_pod_that_cannot_be_patched_safely_is_admitted_unchanged_with_a_warning(
    injector: Injector,
) -> None:
    taken = pod(volumes=[{"name": "meshplane-sockets", "emptyDir": {}}])
    answer = mutate(injector, review(taken))
    assert patch_of(answer) is None
    assert any("meshplane-sockets" in w for w in answer["response"]["warnings"])
    port = pod(containers=[{"name": "app", "image": "x", "ports": [{"containerPort": 15006}]}])
    answer = mutate(injector, review(port))
    assert patch_of(answer) is None
    assert any("15006" in w for w in answer["response"]["warnings"])
    portless = pod(containers=[{"name": "app", "image": "x"}])
    answer = mutate(injector, review(portless))
    assert patch_of(answer) is None
    assert any(APP_PORT_ANNOTATION in w for w in answer["response"]["warnings"])


TAKEN = frozenset((15006, 15001))  # sidecar_ports of the default config


@pytest.mark.parametrize(
    ("annotations", "ports", "expected"),
    [
        ({}, [{"containerPort": 8080}], 8080),
        ({APP_PORT_ANNOTATION: "9000"}, [{"containerPort": 8080}], 9000),
        ({APP_PORT_ANNOTATION: "9000"}, [], 9000),
        ({APP_PORT_ANNOTATION: "nine"}, [{"containerPort": 8080}], None),
        ({APP_PORT_ANNOTATION: "70000"}, [], None),
        ({APP_PORT_ANNOTATION: "15001"}, [], None),  # the sidecar's outbound port
        ({APP_PORT_ANNOTATION: "15006"}, [], None),  # its inbound port
        ({APP_PORT_ANNOTATION: "15000"}, [], 15000),  # no admin port: Envoy's is a socket
        ({}, [], None),
    ],
)
def test_the_app_port_comes_from_the_annotation_else_the_first_container_port(
    annotations: dict[str, str], ports: list[dict[str, Any]], expected: int | None
) -> None:
    facts = PodFacts("shop", {}, annotations, ["app"])
    spec = {"containers": [{"name": "app", "ports": ports}]}
    if expected is None:
        with pytest.raises(Unsafe):
            app_port(facts, spec, TAKEN)
    else:
        assert app_port(facts, spec, TAKEN) == expected


@pytest.mark.parametrize(
    ("operation", "kind", "resource"),
    [("UPDATE", "Pod", "pods"), ("CREATE", "Deployment", "deployments")],
)
def test_other_operations_and_kinds_are_admitted_unchanged_admission_review_payloads(
    injector: Injector, operation: str, kind: str, resource: str
) -> None:
    payload = review(pod(), operation=operation, kind=kind, resource=resource)
    untouched(injector, payload)


def untouched(injector: Injector, payload: dict[str, Any]) -> None:
    """Admitted as it is, no patch and no warning (a clean skip, not an unsafe pod)."""
    answer = mutate(injector, payload)
    assert patch_of(answer) is None
    assert "warnings" not in answer["response"], answer


def _refused(answer: httpx.Response, status: int, word: str) -> None:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"code", "message", "details"}
    assert word.lower() in json.dumps(body).lower()


def test_malformed_review_gets_a_clear_refusal_never_a_5xx_admission_review_payloads(
    injector: Injector,
) -> None:
    good = review(pod())
    no_uid = review(pod())
    del no_uid["request"]["uid"]
    cases: list[tuple[bytes, str, int, str]] = [
        (b"{not json", "application/json", 400, "not JSON"),
        (b"[1, 2]", "application/json", 400, "JSON object"),
        (
            json.dumps({**good, "apiVersion": "admission.k8s.io/v1beta1"}).encode(),
            "application/json",
            400,
            "apiVersion",
        ),
        (json.dumps({**good, "kind": "Pod"}).encode(), "application/json", 400, "kind"),
        (json.dumps(no_uid).encode(), "application/json", 400, "request.uid"),
        (json.dumps({**good, "request": "x"}).encode(), "application/json", 400, "request"),
        (json.dumps(good).encode(), "text/plain", 415, "Content-Type"),
        (b"\xff\xfe", "application/json", 400, "not JSON"),
    ]
    with injector.client() as client:
        for body, ctype, status, word in cases:
            _refused(
                client.post("/mutate", content=body, headers={"content-type": ctype}), status, word
            )
        big = b'{"x": "' + b"a" * (2 * 1024 * 1024) + b'"}'
        _refused(
            client.post("/mutate", content=big, headers={"content-type": "application/json"}),
            413,
            "larger",
        )
        _refused(client.get("/mutate"), 405, "POST")
        _refused(client.get("/nowhere"), 404, "route")
        # After all that, the same connection pool still gets answers.
        assert client.post("/mutate", json=good).status_code == 200


def _raw(injector: Injector, request: bytes) -> bytes:
    context = injector.tls_context()
    with socket.create_connection(("127.0.0.1", injector.port), timeout=30) as sock:
        with context.wrap_socket(sock, server_hostname="localhost") as tls:
            tls.sendall(request)
            chunks = []
            while chunk := tls.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def test_chunked_and_oversized_headers_are_refused_over_raw_tls(injector: Injector) -> None:
    chunked = _raw(
        injector,
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    )
    assert chunked.startswith(b"HTTP/1.1 411 ")
    huge = _raw(injector, b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n")
    assert huge.startswith((b"HTTP/1.1 431 ", b"HTTP/1.1 414 "))
    garbage = _raw(injector, b"HELLO\r\n\r\n")
    assert garbage.startswith(b"HTTP/1.1 400 ")


def test_health_readiness_and_metrics_by_result(injector: Injector) -> None:
    with injector.client() as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 200
        client.post("/mutate", json=review(pod("kube-system"), "kube-system"))
        client.post("/mutate", content=b"nope", headers={"content-type": "application/json"})
        client.post("/mutate", json=review(pod()))
        big = b"{" + b" " * (2 * 1024 * 1024) + b"}"  # refused before it is read
        client.post("/mutate", content=big, headers={"content-type": "application/json"})
    text = injector.metrics()
    for line in (
        'meshplane_injector_reviews_total{reason="system-namespace",result="skipped"}',
        'meshplane_injector_reviews_total{reason="malformed",result="refused"}',
        'meshplane_injector_reviews_total{reason="injected",result="injected"}',
        'meshplane_injector_reviews_total{reason="http-413",result="refused"}',
    ):
        assert line in text, text


def test_sigterm_answers_the_review_in_progress_then_exits_zero(tmp_path: Any) -> None:
    ca = CertificateAuthority(tmp_path)
    running = Injector(tmp_path, ca, ca.issue("injector"))
    running.service.start()
    assert running.service.proc is not None
    body = json.dumps(review(pod())).encode()
    head = (
        f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    context = running.tls_context()
    with socket.create_connection(("127.0.0.1", running.port), timeout=30) as sock:
        with context.wrap_socket(sock, server_hostname="localhost") as tls:
            tls.sendall(head + body[:100])  # a review in progress when SIGTERM comes
            running.service.proc.send_signal(signal.SIGTERM)
            wait_until(lambda: '"draining"' in running.log.read_text(), timeout=60, what="drain")
            tls.sendall(body[100:])
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert b"Connection: close" in answer
    assert running.service.proc.wait(timeout=60) == 0
    running.service.stop()
    logs = [
        json.loads(line) for line in running.log.read_text().splitlines() if line.startswith("{")
    ]
    assert [e["msg"] for e in logs][-3:] == ["draining", "admission review", "injector stopped"]
