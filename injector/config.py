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

from meshplane import gateway_contract, sidecar_contract
from meshplane.config_error import ConfigError
from meshplane.validate import Node
from meshplane.yamlconf import load_yaml

#: Spec 2.1's default system namespaces: never injected, whatever the selector lets through.
DEFAULT_SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", "meshplane-system")
DEFAULT_OPT_OUT_LABEL = "sidecar.meshplane.io/inject"
#: A CA bundle is a few KiB; the injector copies it into every pod it patches.
MAX_CA_BYTES = 64 * 1024


@dataclass(frozen=True)
class SidecarSettings:
    image: str
    resources: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InjectorConfig:
    """What every injected sidecar shares: the cluster, the ADS address, the image."""

    organization: str
    cluster: str
    control_plane: str
    sidecar: SidecarSettings
    control_plane_ca_file: str | None = None
    system_namespaces: frozenset[str] = frozenset(DEFAULT_SYSTEM_NAMESPACES)
    opt_out_label: str = DEFAULT_OPT_OUT_LABEL
    #: ``NAMESPACE/SERVICEACCOUNT`` of the cluster agent: the one client certificate the
    #: sidecars' diagnostics port accepts ("" : no diagnostics port).
    diagnostics_caller: str = ""

    @property
    def cluster_ref(self) -> str:
        return f"{self.organization}/{self.cluster}"


_TOP_REQUIRED = ("cluster", "controlPlane", "sidecar")
_TOP_OPTIONAL = ("controlPlaneCaFile", "systemNamespaces", "optOut", "diagnosticsCaller")


def _plain(value: Any) -> Any:
    """Located YAML containers as plain dicts and lists (they end up in JSON patches)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _sidecar(node: Node) -> SidecarSettings:
    fields = node.fields(required=("image",), optional=("resources",))
    resources = fields.optional("resources")
    if resources is not None:
        resources.fields(optional=("requests", "limits"))
    return SidecarSettings(
        image=fields.required("image").string(strip=True),
        resources=_plain(resources.value) if resources is not None else {},
    )


def _cluster(node: Node) -> tuple[str, str]:
    text = node.string(strip=True)
    organization, sep, name = text.partition("/")
    if not sep or not organization or not name or "/" in name:
        raise node.error(f"must be ORGANIZATION/CLUSTER, not {text!r}")
    return organization, name


def _control_plane(node: Node, ca_file: str | None) -> str:
    address = node.string(strip=True)
    try:
        _host, _port, tls = gateway_contract.grpc_address(address, "controlPlane")
    except gateway_contract.NodeError as exc:
        raise node.error(str(exc)) from None
    if tls and not ca_file:
        raise node.error(
            "a grpcs:// controlPlane needs controlPlaneCaFile (the CA that signs mgmt-api's "
            "certificate): sidecars must not take their configuration from whoever answers"
        )
    return address


def parse(doc: Any, source: str | None = None) -> InjectorConfig:
    """The configuration of a parsed YAML document; ConfigError names what is wrong."""
    fields = Node(doc, source=source).fields(_TOP_REQUIRED, _TOP_OPTIONAL)
    organization, name = _cluster(fields.required("cluster"))
    ca = fields.present("controlPlaneCaFile")
    ca_file = ca.string(strip=True) if ca is not None else None
    namespaces = fields.optional("systemNamespaces")
    opt_out = fields.optional("optOut")
    label = None
    if opt_out is not None:
        label = opt_out.fields(optional=("label",)).present("label")
    caller_node = fields.present("diagnosticsCaller")
    caller = ""
    if caller_node is not None:
        try:
            caller = sidecar_contract.parse_caller(caller_node.string(strip=True))
        except ValueError as exc:
            raise caller_node.error(str(exc)) from None
    return InjectorConfig(
        diagnostics_caller=caller,
        organization=organization,
        cluster=name,
        control_plane=_control_plane(fields.required("controlPlane"), ca_file),
        sidecar=_sidecar(fields.required("sidecar")),
        control_plane_ca_file=ca_file,
        system_namespaces=(
            frozenset(n.string(strip=True) for n in namespaces.items(of="namespace names"))
            if namespaces is not None
            else frozenset(DEFAULT_SYSTEM_NAMESPACES)
        ),
        opt_out_label=label.string(strip=True) if label is not None else DEFAULT_OPT_OUT_LABEL,
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
