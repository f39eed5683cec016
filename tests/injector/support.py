"""Test-side helpers of the injector tests: AdmissionReview payloads, a JSONPatch applier,
the cluster credentials, and the injector run as a subprocess over real HTTPS.

``apply_patch`` is a tiny RFC 6902 implementation (add/replace/remove with
RFC 6901 pointers), written here because no JSONPatch library is in the lock;
it is strict (a missing parent, an index out of range or a ``-`` outside
``add`` raises), so a wrong patch fails the test the way the API server would
refuse it.
"""

from __future__ import annotations

import base64
import copy
import json
import ssl
import uuid
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from tests.support.certs import CertificateAuthority, Issued
from tests.support.net import free_port
from tests.support.processes import Service

ORG, CLUSTER = "acme", "east"


def _tokens(pointer: str) -> list[str]:
    if not pointer.startswith("/"):
        raise ValueError(f"bad pointer {pointer!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def apply_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = _tokens(op["path"])
        target = doc
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        kind = op["op"]
        if isinstance(target, list):
            if kind == "add" and last == "-":
                target.append(copy.deepcopy(op["value"]))
                continue
            index = int(last)
            if kind == "add":
                if not 0 <= index <= len(target):
                    raise IndexError(op["path"])
                target.insert(index, copy.deepcopy(op["value"]))
            elif kind == "replace":
                target[index] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del target[index]
            else:
                raise ValueError(kind)
        elif isinstance(target, dict):
            if kind == "add":
                target[last] = copy.deepcopy(op["value"])
            elif kind in ("replace", "remove"):
                if last not in target:
                    raise KeyError(op["path"])
                if kind == "replace":
                    target[last] = copy.deepcopy(op["value"])
                else:
                    del target[last]
            else:
                raise ValueError(kind)
        else:
            raise TypeError(f"{op['path']}: parent is not a container")
    return doc


def pod(
    namespace: str = "shop",
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Pod as a Deployment's ReplicaSet creates it (generateName, no name yet)."""
    metadata: dict[str, Any] = {
        "generateName": "cart-7d4f9c-",
        "namespace": namespace,
        "labels": labels if labels is not None else {"app": "cart", "pod-template-hash": "7d4f9c"},
    }
    if annotations is not None:
        metadata["annotations"] = annotations
    spec: dict[str, Any] = {
        "serviceAccountName": "cart",
        "containers": containers
        or [
            {
                "name": "app",
                "image": "registry.example/cart:1.4",
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
            }
        ],
    }
    if volumes is not None:
        spec["volumes"] = volumes
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def review(
    obj: Any,
    namespace: str = "shop",
    *,
    operation: str = "CREATE",
    kind: str = "Pod",
    resource: str = "pods",
    uid: str | None = None,
) -> dict[str, Any]:
    """A v1 AdmissionReview as kube-apiserver sends it for a pod CREATE."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": resource},
            "requestKind": {"group": "", "version": "v1", "kind": kind},
            "requestResource": {"group": "", "version": "v1", "resource": resource},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "groups": ["system:serviceaccounts", "system:authenticated"],
            },
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]] | None:
    response = answer["response"]
    if "patch" not in response:
        return None
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def credentials(path: Path) -> Path:
    """A cluster credentials file in the install template's shape."""
    private = ec.generate_private_key(ec.SECP256R1())
    jwk = ECAlgorithm.to_jwk(private, as_dict=True) | {"kid": "injector-test"}
    path.write_text(
        json.dumps(
            {
                "clusterFqn": f"organizations/{ORG}/clusters/{CLUSTER}",
                "serviceAccountFqn": f"organizations/{ORG}/clusters/{CLUSTER}"
                "/serviceaccounts/agent",
                "jwk": json.dumps(jwk),
            }
        )
    )
    return path


def write_config(
    path: Path, ca: Path | None, control_plane: str = "grpcs://mgmt.test:8444"
) -> Path:
    lines = [
        f"cluster: {ORG}/{CLUSTER}",
        f"controlPlane: {control_plane}",
        *([f"controlPlaneCaFile: {ca}"] if ca else []),
        "sidecar:",
        "  image: ghcr.io/meshplane/meshplane:0.1.0",
        "  resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {cpu: '1', memory: 256Mi}}",
        "systemNamespaces: [kube-system, kube-public, kube-node-lease, meshplane-system]",
        "optOut:",
        "  label: sidecar.meshplane.io/inject",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


#: The name on the client certificate the tests' fake API server presents.
APISERVER = "kube-apiserver"


class Injector:
    """``python -m injector serve`` on free ports, with a server certificate of ``ca``.

    As in the chart, the webhook requires a client certificate: ``ca`` also
    signs the one this fake API server presents (:meth:`tls_context`).
    """

    def __init__(self, tmp: Path, ca: CertificateAuthority, server: Issued, *extra: str) -> None:
        self.tmp, self.ca, self.server = tmp, ca, server
        self.apiserver = ca.issue(APISERVER, client=True)
        self.port, self.metrics_port = free_port(), free_port()
        self.config = write_config(tmp / "injector.yaml", ca.path)
        self.log = tmp / "injector.log"
        self.service = Service(
            [
                "injector",
                "serve",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--metrics-listen",
                f"127.0.0.1:{self.metrics_port}",
                "--tls-cert",
                str(server.cert),
                "--tls-key",
                str(server.key),
                "--client-ca",
                str(ca.path),
                "--config",
                str(self.config),
                *extra,
            ],
            self.port,
            self.log,
        )

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def tls_context(self, client: Issued | None = None) -> ssl.SSLContext:
        """A TLS client context that trusts the webhook and presents ``client`` (default:
        the fake API server's certificate)."""
        context = ssl.create_default_context(cafile=str(self.ca.path))
        chosen = client or self.apiserver
        context.load_cert_chain(str(chosen.cert), str(chosen.key))
        return context

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=self.tls_context(), timeout=30)

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30).text
