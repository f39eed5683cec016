"""``meshplane-injector sidecar``: what runs in an injected sidecar container.

It renders the Envoy bootstrap of this pod, then runs Envoy and keeps its
ADS token fresh:

1. who the pod is comes from the downward API (:mod:`injector.shape`): the
   node id is the pod's name, ``node.cluster`` the configured
   ``ORGANIZATION/CLUSTER``, and ``node.metadata`` is a sidecar's
   (:class:`meshplane.sidecar_contract.SidecarNode`: namespace, service
   account, service = the app, the app's port, inbound on the pod IP at
   :data:`~injector.shape.LISTEN_PORT`, outbound on loopback at
   :data:`~injector.shape.OUTBOUND_PORT`), so mgmt-api serves it the mesh's
   listeners, its SPIFFE certificate and its authorization (docs/mesh.md);
2. the token is signed with the cluster's credentials (the mounted Secret),
   audience :data:`~meshplane.gateway_contract.XDS_AUDIENCE`, lifetime
   :data:`~meshplane.gateway_contract.GATEWAY_TOKEN_TTL_SECONDS`, exactly as
   ``meshctl gateway bootstrap`` makes one;
3. Envoy runs as a child. After :func:`renew_after` (80 % of the token's
   life) a fresh bootstrap is rendered and Envoy is hot-restarted on it
   (``--restart-epoch``): the new process takes the listeners over and the
   old one drains, so no connection is refused and the ADS stream never
   outlives its token. SIGTERM/SIGINT go to Envoy; the launcher exits with
   Envoy's code, and if Envoy dies the container ends and the kubelet
   restarts it (which renders a fresh bootstrap).

The bootstrap holds a bearer token: it is written mode 0600 in an in-memory
emptyDir. Not built yet: a per-workload credential instead of the cluster
key in every pod (the workload's certificate already comes over SDS).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from injector import shape
from meshplane import control_plane, gateway_contract
from meshplane import sidecar_contract as sc
from meshplane.config_error import ConfigError
from meshplane.envoy_binary import envoy_path
from meshplane.secret_file import write_secret

log = logging.getLogger("injector.sidecar")

#: Renew when this share of the token's life has passed.
RENEW_FRACTION = 0.8
#: How long an old Envoy keeps serving its connections after a hot restart.
PARENT_SHUTDOWN_SECONDS = 30
#: Wait before retrying a hot restart Envoy refused.
RETRY_SECONDS = 60.0
#: Files a mounted Secret may name the credentials under (the agent's manifest uses the first).
CREDENTIAL_FILES = ("credentials.json", "credentials.yaml", "clusterServiceAccount")


def renew_after(ttl_seconds: int, fraction: float = RENEW_FRACTION) -> float:
    """Seconds from rendering a bootstrap to rendering the next one (pure)."""
    return ttl_seconds * fraction


@dataclass(frozen=True)
class PodIdentity:
    name: str
    namespace: str
    service_account: str
    app: str
    ip: str


_DOWNWARD = (
    shape.POD_NAME_ENV,
    shape.POD_NAMESPACE_ENV,
    shape.SERVICE_ACCOUNT_ENV,
    shape.POD_IP_ENV,
)


def identity(env: dict[str, str] | os._Environ[str], app: str) -> PodIdentity:
    """The pod as the downward API describes it; ConfigError names a missing variable."""
    values = []
    for variable in _DOWNWARD:
        value = env.get(variable, "")
        if not value:
            raise ConfigError("is not set (the downward API gives it)", field=variable)
        values.append(value)
    return PodIdentity(values[0], values[1], values[2], app, values[3])


def credentials_file(path: Path) -> Path:
    """The credentials file in a mounted Secret directory (or ``path`` if it is a file)."""
    if not path.is_dir():
        return path
    for name in CREDENTIAL_FILES:
        if (path / name).is_file():
            return path / name
    visible = sorted(p for p in path.iterdir() if not p.name.startswith(".") and p.is_file())
    if len(visible) == 1:
        return visible[0]
    raise ConfigError(
        f"{path} holds no {CREDENTIAL_FILES[0]} and not exactly one file", field="--credentials"
    )


def render(args: argparse.Namespace, pod: PodIdentity, ca_pem: str | None) -> dict[str, Any]:
    """The pod's bootstrap (with a fresh token); CA bundle written beside it if given."""
    organization, _, cluster = args.cluster.partition("/")
    account = control_plane.load_credentials(credentials_file(Path(args.credentials)))
    expected = f"organizations/{organization}/clusters/{cluster}"
    if account.cluster_fqn and account.cluster_fqn != expected:
        raise ConfigError(f"the credentials are the key of {account.cluster_fqn}, not {expected}")
    ca_file = None
    if ca_pem:
        ca_file = str(Path(args.bootstrap_dir) / "ca.crt")
        Path(ca_file).write_text(ca_pem, encoding="ascii")
    node = sc.SidecarNode(
        organization,
        cluster,
        pod.name,
        pod.namespace,
        pod.service_account,
        pod.app,
        args.app_port,
        inbound_host=pod.ip,
        inbound_port=shape.LISTEN_PORT,
        outbound_port=shape.OUTBOUND_PORT,
    )
    try:
        sc.parse_node(node.instance, node.node_cluster, node.metadata())
        return sc.bootstrap(
            node,
            ads=args.control_plane,
            token=account.token(
                ttl=gateway_contract.GATEWAY_TOKEN_TTL_SECONDS,
                audience=gateway_contract.XDS_AUDIENCE,
            ),
            admin=("127.0.0.1", args.admin_port),
            ca_file=ca_file,
        )
    except gateway_contract.NodeError as exc:
        raise ConfigError(str(exc)) from None


def write_bootstrap(args: argparse.Namespace, pod: PodIdentity) -> Path:
    path = Path(args.bootstrap_dir) / "envoy.yaml"
    doc = render(args, pod, os.environ.get(shape.CA_ENV))
    write_secret(path, gateway_contract.bootstrap_text(doc))
    return path


class Supervisor:
    """Envoy as a child, hot-restarted on a fresh bootstrap before the token expires."""

    def __init__(self, args: argparse.Namespace, pod: PodIdentity) -> None:
        self.args = args
        self.pod = pod
        self.stop = threading.Event()
        self.base_id_path = Path(args.bootstrap_dir) / "base-id"
        self.children: list[subprocess.Popen[bytes]] = []
        self.signum: int = signal.SIGTERM

    def _start(self, epoch: int) -> subprocess.Popen[bytes]:
        path = write_bootstrap(self.args, self.pod)
        command = [str(envoy_path()), "-c", str(path), "--restart-epoch", str(epoch)]
        command += ["--parent-shutdown-time-s", str(PARENT_SHUTDOWN_SECONDS)]
        command += ["--drain-time-s", str(PARENT_SHUTDOWN_SECONDS // 2)]
        if epoch == 0:
            command += ["--use-dynamic-base-id", "--base-id-path", str(self.base_id_path)]
        else:
            command += ["--base-id", self.base_id_path.read_text().strip()]
        log.info("starting envoy", extra={"epoch": epoch, "pod": self.pod.name})
        child = subprocess.Popen(command)  # noqa: S603 - our Envoy, our bootstrap
        self.children = [c for c in self.children if c.poll() is None]
        self.children.append(child)
        return child

    def _signal(self, signum: int, _frame: object) -> None:
        self.signum = signum
        self.stop.set()

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._signal)
        interval = self.args.renew_after or renew_after(gateway_contract.GATEWAY_TOKEN_TTL_SECONDS)
        epoch, current = 0, self._start(0)
        parent: subprocess.Popen[bytes] | None = None
        renew_at = time.monotonic() + interval
        while not self.stop.is_set():
            code = current.poll()
            if code is not None and parent is not None and parent.poll() is None:
                # The hot restart failed (Envoy refuses one while the previous
                # epoch is still initializing): keep the running Envoy, retry.
                log.warning("hot restart refused; retrying", extra={"epoch": epoch, "code": code})
                epoch, current, parent = epoch - 1, parent, None
                renew_at = time.monotonic() + min(interval, RETRY_SECONDS)
            elif code is not None:
                break
            elif time.monotonic() >= renew_at:
                epoch, parent = epoch + 1, current
                current = self._start(epoch)
                renew_at = time.monotonic() + interval
            self.stop.wait(0.5)
        return self._finish(current)

    def _finish(self, current: subprocess.Popen[bytes]) -> int:
        """Stop the epochs newest first, each after the one it may be talking to.

        An epoch in the middle of its hot restart talks to its parent over the
        hot-restart socket; if the parent went first, the child's ``sendmsg``
        is refused and Envoy aborts (SIGABRT) instead of exiting cleanly. So
        the newest epoch is signalled and reaped before its parent is.
        """
        for child in reversed(self.children):
            if self.stop.is_set() and child.poll() is None:
                child.send_signal(self.signum)
            try:
                child.wait(timeout=PARENT_SHUTDOWN_SECONDS)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        code = current.wait()
        log.info("envoy exited", extra={"code": code})
        if self.stop.is_set() and code in (0, -signal.SIGTERM, -signal.SIGINT):
            return 0
        return code if code > 0 else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", required=True, help="ORGANIZATION/CLUSTER")
    parser.add_argument(
        "--control-plane", required=True, help="grpcs://HOST:PORT of mgmt-api's ADS"
    )
    parser.add_argument("--credentials", required=True, help="the credentials file or Secret dir")
    parser.add_argument("--bootstrap-dir", required=True, help="where the bootstrap is written")
    parser.add_argument("--app", required=True, help="the workload's name (its service)")
    parser.add_argument(
        "--app-port", type=int, required=True, help="the app's port (the inbound listener's target)"
    )
    parser.add_argument("--admin-port", type=int, default=15000, help="Envoy's admin port")
    parser.add_argument(
        "--render-only", action="store_true", help="write the bootstrap, do not run Envoy"
    )
    parser.add_argument("--renew-after", type=float, help=argparse.SUPPRESS)  # tests


def main(args: argparse.Namespace) -> int:
    pod = identity(os.environ, args.app)
    if args.render_only:
        print(write_bootstrap(args, pod))
        return 0
    return Supervisor(args, pod).run()
