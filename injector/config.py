"""The injector's configuration file (docs/injector.md), loaded once at start.

Errors name the file, the line and the field (:class:`~meshplane.config_error.ConfigError`),
so a wrong value in the chart's ConfigMap is found from the pod's log alone.
Pure apart from :func:`load`, which reads the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshplane import gateway_contract
from meshplane.config_error import ConfigError
from meshplane.yamlconf import load_yaml

#: Spec 2.1's default system namespaces: never injected, whatever the selector lets through.
DEFAULT_SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", "meshplane-system")
DEFAULT_OPT_OUT_LABEL = "sidecar.meshplane.io/inject"
DEFAULT_CREDENTIALS_SECRET = "meshplane-cluster-credentials"  # noqa: S105 - a Secret's name
DEFAULT_ADMIN_PORT = 15000
#: A CA bundle is a few KiB; the injector copies it into every pod it patches.
MAX_CA_BYTES = 64 * 1024
_KEYS = frozenset(
    {"cluster", "controlPlane", "controlPlaneCaFile", "credentialsSecret", "sidecar"}
    | {"systemNamespaces", "optOut"}
)
_SIDECAR_KEYS = frozenset({"image", "adminPort", "resources"})


@dataclass(frozen=True)
class SidecarSettings:
    image: str
    admin_port: int = DEFAULT_ADMIN_PORT
    resources: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InjectorConfig:
    """What every injected sidecar shares: the cluster, the ADS address, the image."""

    organization: str
    cluster: str
    control_plane: str
    sidecar: SidecarSettings
    control_plane_ca_file: str | None = None
    credentials_secret: str = DEFAULT_CREDENTIALS_SECRET
    system_namespaces: frozenset[str] = frozenset(DEFAULT_SYSTEM_NAMESPACES)
    opt_out_label: str = DEFAULT_OPT_OUT_LABEL

    @property
    def cluster_ref(self) -> str:
        return f"{self.organization}/{self.cluster}"


def _line(doc: Any, key: str) -> int | None:
    line_of = getattr(doc, "line_of", None)
    return line_of(key) if line_of is not None else None


def _string(doc: Mapping[str, Any], key: str, path: str, source: str | None) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            "must be a non-empty string", source=source, line=_line(doc, key), field=path
        )
    return value


def _mapping(doc: Mapping[str, Any], key: str, source: str | None) -> Mapping[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError("must be a mapping", source=source, line=_line(doc, key), field=key)
    return value


def _unknown(
    doc: Mapping[str, Any], known: frozenset[str], prefix: str, source: str | None
) -> None:
    for key in doc:
        if key not in known:
            raise ConfigError(
                "unknown field", source=source, line=_line(doc, key), field=f"{prefix}{key}"
            )


def _sidecar(doc: Mapping[str, Any], source: str | None) -> SidecarSettings:
    if "sidecar" not in doc:
        raise ConfigError("is required", source=source, field="sidecar")
    sidecar = _mapping(doc, "sidecar", source)
    _unknown(sidecar, _SIDECAR_KEYS, "sidecar.", source)
    if "image" not in sidecar:
        raise ConfigError(
            "is required", source=source, line=_line(doc, "sidecar"), field="sidecar.image"
        )
    image = _string(sidecar, "image", "sidecar.image", source)
    port = sidecar.get("adminPort", DEFAULT_ADMIN_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigError(
            "must be a port 1-65535",
            source=source,
            line=_line(sidecar, "adminPort"),
            field="sidecar.adminPort",
        )
    resources = sidecar.get("resources", {})
    if not isinstance(resources, Mapping) or not set(resources) <= {"requests", "limits"}:
        raise ConfigError(
            "must be {requests, limits}",
            source=source,
            line=_line(sidecar, "resources"),
            field="sidecar.resources",
        )
    return SidecarSettings(image, port, _plain(resources))


def _plain(value: Any) -> Any:
    """Located YAML containers as plain dicts and lists (they end up in JSON patches)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _names(doc: Mapping[str, Any], source: str | None) -> frozenset[str]:
    value = doc.get("systemNamespaces", list(DEFAULT_SYSTEM_NAMESPACES))
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(
            "must be a list of namespace names",
            source=source,
            line=_line(doc, "systemNamespaces"),
            field="systemNamespaces",
        )
    return frozenset(value)


def parse(doc: Any, source: str | None = None) -> InjectorConfig:
    """The configuration of a parsed YAML document; ConfigError names what is wrong."""
    if not isinstance(doc, Mapping):
        raise ConfigError("the configuration must be a mapping", source=source)
    _unknown(doc, _KEYS, "", source)
    cluster = _string(doc, "cluster", "cluster", source)
    organization, sep, name = cluster.partition("/")
    if not sep or not organization or not name or "/" in name:
        raise ConfigError(
            f"must be ORGANIZATION/CLUSTER, not {cluster!r}",
            source=source,
            line=_line(doc, "cluster"),
            field="cluster",
        )
    control_plane = _string(doc, "controlPlane", "controlPlane", source)
    ca_file = doc.get("controlPlaneCaFile")
    try:
        _host, _port, tls = gateway_contract.grpc_address(control_plane, "controlPlane")
        if ca_file is not None and not isinstance(ca_file, str):
            raise gateway_contract.NodeError("controlPlaneCaFile must be a file path")
        if tls and not ca_file:
            raise gateway_contract.NodeError(
                "a grpcs:// controlPlane needs controlPlaneCaFile (the CA that signs mgmt-api's "
                "certificate): sidecars must not take their configuration from whoever answers"
            )
    except gateway_contract.NodeError as exc:
        raise ConfigError(
            str(exc), source=source, line=_line(doc, "controlPlane"), field="controlPlane"
        ) from None
    opt_out = _mapping(doc, "optOut", source)
    _unknown(opt_out, frozenset({"label"}), "optOut.", source)
    return InjectorConfig(
        organization=organization,
        cluster=name,
        control_plane=control_plane,
        sidecar=_sidecar(doc, source),
        control_plane_ca_file=ca_file,
        credentials_secret=(
            _string(doc, "credentialsSecret", "credentialsSecret", source)
            if "credentialsSecret" in doc
            else DEFAULT_CREDENTIALS_SECRET
        ),
        system_namespaces=_names(doc, source),
        opt_out_label=(
            _string(opt_out, "label", "optOut.label", source)
            if "label" in opt_out
            else DEFAULT_OPT_OUT_LABEL
        ),
    )


def load(path: Path) -> InjectorConfig:
    return parse(load_yaml(path), str(path))


def read_ca(config: InjectorConfig) -> str | None:
    """The control plane's CA bundle (PEM text) that sidecars are given, or None.

    Read by the injector, not mounted from a Secret: a CA certificate is
    public, and a volume would need an object in every onboarded namespace.
    """
    if not config.control_plane_ca_file:
        return None
    path = Path(config.control_plane_ca_file)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", field="controlPlaneCaFile") from None
    if len(data) > MAX_CA_BYTES or b"-----BEGIN CERTIFICATE-----" not in data:
        raise ConfigError(
            f"{path} must be a PEM CA bundle of at most {MAX_CA_BYTES} bytes",
            field="controlPlaneCaFile",
        )
    return data.decode("ascii", "replace")
