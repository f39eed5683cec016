"""The JSONPatch (RFC 6902) that adds the sidecar to a pod: pure, from the pod and the config.

The patch only *adds*: a container at the end of ``spec.containers``, two
volumes (the projected token, the sockets' emptyDir), one annotation. It
never replaces what the pod has, so it cannot drop a field that the API
server or another webhook set. Anything that would make the result unsafe
(a volume or port already taken, a pod object of an unexpected shape)
raises :class:`Unsafe`, and the pod is admitted without the sidecar
(docs/injector.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from injector import shape
from injector.config import InjectorConfig
from injector.decision import SIDECAR_CONTAINER, STATUS_ANNOTATION, PodFacts
from meshplane.workload_contract import TOKEN_AUDIENCE

#: Labels naming the workload, first present wins; else the service account.
APP_LABELS = ("app.kubernetes.io/name", "app")
VERSION = "0.2.0"
#: The sidecar container's command (the sidecar agent's console script).
AGENT_COMMAND = "meshplane-sidecar-agent"


class Unsafe(ValueError):
    """The pod cannot be patched safely; the message says why (it becomes a warning)."""


def _pointer(token: str) -> str:
    """A JSON Pointer reference token (RFC 6901): ``~`` then ``/`` escaped."""
    return token.replace("~", "~0").replace("/", "~1")


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise Unsafe(f"{where} is not an object")
    return value


def _strings(value: Any, where: str) -> dict[str, str]:
    mapping = _mapping(value, where)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise Unsafe(f"{where} must map strings to strings")
    return dict(mapping)


def facts(namespace: str, pod: Any) -> PodFacts:
    """What the decision needs of a pod object; Unsafe when it is not a pod's shape."""
    pod = _mapping(pod, "request.object")
    metadata = _mapping(pod.get("metadata"), "metadata")
    spec = _mapping(pod.get("spec"), "spec")
    containers = spec.get("containers")
    if not isinstance(containers, list) or not all(isinstance(c, Mapping) for c in containers):
        raise Unsafe("spec.containers is not a list of containers")
    return PodFacts(
        namespace=namespace or str(metadata.get("namespace") or ""),
        labels=_strings(metadata.get("labels"), "metadata.labels"),
        annotations=_strings(metadata.get("annotations"), "metadata.annotations"),
        container_names=[str(c.get("name", "")) for c in containers],
        host_network=spec.get("hostNetwork") is True,
    )


def app_name(pod: PodFacts, service_account: str) -> str:
    """The workload's name in the sidecar's node metadata (and its gateway name)."""
    for label in APP_LABELS:
        if pod.labels.get(label):
            return pod.labels[label]
    return service_account or "default"


def sidecar_ports(config: InjectorConfig) -> frozenset[int]:
    """The ports the sidecar binds in the pod: inbound, outbound, metrics and (with a
    ``diagnosticsCaller``) diagnostics; its admin API itself is a Unix socket."""
    ports = {shape.LISTEN_PORT, shape.OUTBOUND_PORT, shape.PROMETHEUS_PORT}
    if config.diagnostics_caller:
        ports.add(shape.DIAGNOSTICS_PORT)
    return frozenset(ports)


def app_port(pod: PodFacts, spec: Mapping[str, Any], taken: frozenset[int]) -> int:
    """The port the inbound listener sends to: the annotation, else the first app
    container's first ``containerPort``; Unsafe when there is none, or it is not a
    port, or one of ``taken`` (:func:`sidecar_ports`)."""
    text = pod.annotations.get(shape.APP_PORT_ANNOTATION)
    if text is None:
        for container in spec.get("containers") or []:
            for port in _mapping(container, "spec.containers[]").get("ports") or []:
                value = _mapping(port, "ports[]").get("containerPort")
                if isinstance(value, int) and not isinstance(value, bool):
                    return _port(value, "containerPort", taken)
        raise Unsafe(f"no container port to send calls to: set {shape.APP_PORT_ANNOTATION}")
    if not text.isdigit():
        raise Unsafe(f"{shape.APP_PORT_ANNOTATION} must be a port number, not {text!r}")
    return _port(int(text), shape.APP_PORT_ANNOTATION, taken)


def _port(value: int, where: str, taken: frozenset[int]) -> int:
    if not 0 < value < 65536 or value in taken:
        raise Unsafe(f"{where} {value} is not a port the app can have beside the sidecar")
    return value


def sidecar_container(
    config: InjectorConfig, app: str, port: int, ca_pem: str | None
) -> dict[str, Any]:
    """The container: ``meshplane-sidecar-agent`` proves the pod's identity, then runs Envoy.

    Its arguments expand the downward-API variables (``$(POD_NAME)``), as the
    kubelet does; the namespace and service account are the token's.
    """
    args = ["--control-plane", config.control_plane, "--cluster", config.cluster_ref]
    args += ["--service", app, "--app-port", str(port)]
    args += ["--node-id", f"$({shape.POD_NAME_ENV})"]
    args += ["--inbound", f"$({shape.POD_IP_ENV}):{shape.LISTEN_PORT}"]
    args += ["--outbound-port", str(shape.OUTBOUND_PORT)]
    args += ["--token-file", str(shape.TOKEN_PATH), "--socket-dir", str(shape.SOCKET_DIR)]
    args += ["--prometheus-port", str(shape.PROMETHEUS_PORT)]
    ports = [
        {"name": "mesh-listener", "containerPort": shape.LISTEN_PORT},
        {"name": shape.METRICS_PORT_NAME, "containerPort": shape.PROMETHEUS_PORT},
    ]
    if config.diagnostics_caller:
        args += ["--diagnostics-caller", config.diagnostics_caller]
        args += ["--diagnostics-port", str(shape.DIAGNOSTICS_PORT)]
        ports.append({"name": "mesh-diag", "containerPort": shape.DIAGNOSTICS_PORT})
    env: list[dict[str, Any]] = [
        {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}
        for name, path in (
            (shape.POD_NAME_ENV, "metadata.name"),
            (shape.POD_IP_ENV, "status.podIP"),
        )
    ]
    if ca_pem is not None:
        env.append({"name": shape.CA_ENV, "value": ca_pem})
    container: dict[str, Any] = {
        "name": SIDECAR_CONTAINER,
        "image": config.sidecar.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [AGENT_COMMAND],
        "args": args,
        "env": env,
        "ports": ports,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": shape.RUN_AS_USER,
            "runAsGroup": shape.RUN_AS_USER,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {
                "name": shape.TOKEN_VOLUME,
                "mountPath": str(shape.TOKEN_PATH.parent),
                "readOnly": True,
            },
            {"name": shape.SOCKET_VOLUME, "mountPath": str(shape.SOCKET_DIR)},
        ],
    }
    if config.sidecar.resources:
        container["resources"] = json.loads(json.dumps(config.sidecar.resources))
    return container


def volumes(config: InjectorConfig) -> list[dict[str, Any]]:
    """The projected token (audience ``meshplane``, one hour) and the sockets' emptyDir."""
    del config
    token = {
        "serviceAccountToken": {
            "audience": TOKEN_AUDIENCE,
            "expirationSeconds": shape.TOKEN_EXPIRATION_SECONDS,
            "path": shape.TOKEN_PATH.name,
        }
    }
    return [
        {"name": shape.TOKEN_VOLUME, "projected": {"sources": [token]}},
        {"name": shape.SOCKET_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
    ]


def _check_free(spec: Mapping[str, Any], config: InjectorConfig) -> None:
    """Volume names and container ports the sidecar needs must not be the pod's already."""
    taken_volumes = {v.get("name") for v in spec.get("volumes") or [] if isinstance(v, Mapping)}
    for name in (shape.TOKEN_VOLUME, shape.SOCKET_VOLUME):
        if name in taken_volumes:
            raise Unsafe(f"the pod already has a volume named {name}")
    ports = sidecar_ports(config)
    for container in [*spec.get("containers", []), *(spec.get("initContainers") or [])]:
        for port in container.get("ports") or []:
            if isinstance(port, Mapping) and port.get("containerPort") in ports:
                raise Unsafe(
                    f"container {container.get('name')} uses port {port.get('containerPort')},"
                    " which the sidecar needs"
                )


def operations(
    pod: Any, facts_: PodFacts, config: InjectorConfig, ca_pem: str | None
) -> list[dict[str, Any]]:
    """The patch adding the sidecar to ``pod`` (whose :func:`facts` are ``facts_``)."""
    spec = _mapping(pod.get("spec"), "spec")
    volumes_value = spec.get("volumes")
    if volumes_value is not None and not isinstance(volumes_value, list):
        raise Unsafe("spec.volumes is not a list")
    _check_free(spec, config)
    account = spec.get("serviceAccountName")
    app = app_name(facts_, account if isinstance(account, str) else "")
    container = sidecar_container(
        config, app, app_port(facts_, spec, sidecar_ports(config)), ca_pem
    )
    ops: list[dict[str, Any]] = [{"op": "add", "path": "/spec/containers/-", "value": container}]
    if volumes_value is None:
        ops.append({"op": "add", "path": "/spec/volumes", "value": volumes(config)})
    else:
        ops += [{"op": "add", "path": "/spec/volumes/-", "value": v} for v in volumes(config)]
    status = json.dumps({"version": VERSION, "containers": [SIDECAR_CONTAINER]})
    if "metadata" not in pod:
        ops.append({"op": "add", "path": "/metadata", "value": {}})
    if _mapping(pod.get("metadata"), "metadata").get("annotations") is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    ops.append(
        {
            "op": "add",
            "path": f"/metadata/annotations/{_pointer(STATUS_ANNOTATION)}",
            "value": status,
        }
    )
    if _mapping(pod.get("metadata"), "metadata").get("labels") is None:
        ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
    name, value = shape.PROXY_LABEL
    ops.append({"op": "add", "path": f"/metadata/labels/{_pointer(name)}", "value": value})
    if not any(name.startswith("prometheus.io/") for name in facts_.annotations):
        # The pod's own scrape annotations win; the meshplane-sidecars job needs none.
        ops += [
            {"op": "add", "path": f"/metadata/annotations/{_pointer(name)}", "value": value}
            for name, value in shape.PROMETHEUS_ANNOTATIONS.items()
        ]
    return ops
