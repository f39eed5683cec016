"""The whole platform on embedded defaults, in one foreground command.

``python -m mgmt_api.demo`` (what ``scripts/run`` runs):

1. ``mgmt-api serve`` on SQLite in ``STATE/mgmt`` with its policy stream;
2. the demo seeded through REST (:mod:`mgmt_api.demo.seed`; idempotent);
3. ``ratelimit serve`` (in-memory counters: the demo cluster says
   ``redis.disabled``) and ``extauthz serve`` (gRPC and HTTP mode), both
   subscribed with ``--control-plane`` and the cluster's key;
4. once both have applied the cluster's snapshots, the addresses and the
   copy-paste commands are printed, then a last line ``ready: ...``.

The children run in their own sessions, so Ctrl-C at the terminal reaches
only this process, which then stops them in order (services first, the
management plane last) with SIGTERM, as it does on its own SIGTERM. A child
that dies stops the rest, and the exit code is 1. Logs (JSON lines) go to
``STATE/logs/``; the admin password is kept in ``STATE/admin-password``.
"""

from __future__ import annotations

import argparse
import functools
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from meshplane import control_plane
from mgmt_api.demo.seed import DemoPlan, SeedError, demo_plan, seed

# Variables that would take the children off their embedded defaults.
_SCRUBBED_ENV = (
    "REDIS_URL",
    "REDIS_URL_FILE",
    "MESHPLANE_DATABASE_URL",
    "MESHPLANE_GRPC_LISTEN",
    "MESHPLANE_CONFIG",
)
STOP_GRACE_SECONDS = 15.0


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

    def at(self, port: int) -> str:
        return f"{self.host}:{port}"


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
        return self.proc.returncode

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


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
        self.plan = plan or demo_plan(extauthz_uri=f"grpc://{ports.at(ports.extauthz)}")
        self.stop_requested = threading.Event()
        self.children: list[Child] = []
        (self.state / "logs").mkdir(parents=True, exist_ok=True)
        (self.state / "mgmt").mkdir(exist_ok=True)
        self.password = _admin_password(self.state)
        self.credentials = self.state / "cluster-credentials.json"
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        self.env = {**env, "PYTHONUNBUFFERED": "1"}
        self._log: Callable[[str], None] = print

    @property
    def mgmt_url(self) -> str:
        return f"http://{self.ports.at(self.ports.mgmt)}"

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

    # -- processes -------------------------------------------------------

    def _spawn(self, name: str, module: str, *args: str) -> Child:
        child = Child(
            name,
            [sys.executable, "-m", module, "serve", *args],
            self.state / "logs" / f"{name}.log",
            self.env,
        )
        self.children.append(child)
        child.start()
        assert child.proc is not None
        self._log(f"  {name}: pid {child.proc.pid}, log {child.log}")
        return child

    def _subscribe_args(self, service: str) -> list[str]:
        return [
            "--control-plane",
            # Explicit plaintext on loopback (a bare HOST:PORT logs a warning).
            f"grpc://{self.ports.at(self.ports.grpc)}",
            "--cluster",
            f"{self.plan.organization}/{self.plan.cluster}",
            "--credentials",
            str(self.credentials),
            "--cache-dir",
            str(self.state / f"{service}-cache"),
        ]

    def start(self, log: Callable[[str], None]) -> dict[str, str]:
        """Bring everything up and seed; return the seed report. Raises Stopping."""
        self._log = log
        p = self.ports
        database = f"sqlite+pysqlite:///{self.state / 'mgmt' / 'mgmt-api.db'}"
        self.env["MESHPLANE_DATA_DIR"] = str(self.state / "mgmt")
        self.env["MESHPLANE_ADMIN_PASSWORD"] = self.password
        log(f"starting mgmt-api on {self.mgmt_url} (SQLite in {self.state / 'mgmt'})")
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
        with httpx.Client(
            base_url=self.mgmt_url, auth=("admin", self.password), timeout=10
        ) as client:
            self._wait("mgmt-api to be ready", lambda: self._http_ok(client, "/readyz"))
            log(f"seeding organization {self.plan.organization!r}, cluster {self.plan.cluster!r}")
            try:
                report = seed(client, self.plan, self.credentials)
            except (SeedError, httpx.HTTPError) as exc:
                raise Stopping(
                    f"seeding failed: {exc} (a state dir from another password? "
                    f"remove {self.state} to start over)"
                ) from None
            done = list(report.values())
            log(
                f"seeded: {done.count('created')} created, {done.count('updated')} updated,"
                f" {done.count('unchanged')} unchanged"
            )
            log("starting ratelimit and extauthz, subscribed to mgmt-api")
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
            self._wait("both services to apply their snapshots", lambda: self._converged(client))
        for port in (p.ratelimit, p.extauthz, p.extauthz_http):
            self._wait(
                f"{p.at(port)} to accept connections", functools.partial(self._listening, port)
            )
        # The snapshot is on disk and ACKed; give the workers one reload tick.
        if self.stop_requested.wait(3 * control_plane.RELOAD_INTERVAL):
            raise Stopping("")
        return report

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


def commands(stack: Stack) -> list[tuple[str, str]]:
    """(what it shows, the shell command) for the banner, in order."""
    p, plan = stack.ports, stack.plan
    descriptor_args = " ".join(
        "--descriptor " + shlex.quote(",".join(f"{k}={v}" for k, v in d))
        for d in plan.rate_limit_descriptors
    )
    base = f"/v2/organizations/{plan.organization}/clusters/{plan.cluster}"
    check = f"http://{p.at(p.extauthz_http)}/check/{plan.extauthz_policy}"
    requests = int(plan.limit.split("/")[0])
    return [
        (
            f"{requests + 1} calls against the {plan.limit} limit: the last is OVER_LIMIT (exit 7)",
            f"uv run meshctl diag ratelimit --server {p.at(p.ratelimit)}"
            f" --domain {shlex.quote(plan.rate_limit_domain)} {descriptor_args}"
            f" --repeat {requests + 1}",
        ),
        (
            "a demo token whose path claim grants /headers",
            f"TOKEN=$(uv run extauthz token --secret {shlex.quote(plan.hmac_secret)}"
            " --path /headers)",
        ),
        (
            "Envoy's HTTP ext_authz mode: 200 for /headers",
            f'curl -i -H "authorization: Bearer $TOKEN" {check}/headers',
        ),
        (
            "403 for /admin (x-ext-authz-reason: path_not_allowed)",
            f'curl -i -H "authorization: Bearer $TOKEN" {check}/admin',
        ),
        (
            "the same deny over gRPC, as Envoy sends it (exit 7)",
            f"uv run meshctl diag check --server {p.at(p.extauthz)} --path /admin"
            f' --header "authorization=Bearer $TOKEN"'
            f" --context-extension meshplane.policy={plan.extauthz_policy}",
        ),
        (
            "which snapshot each instance applied",
            f"curl -s -u admin:{shlex.quote(stack.password)} {stack.mgmt_url}{base}/status",
        ),
    ]


def banner(stack: Stack) -> str:
    p = stack.ports
    lines = [
        "",
        "meshplane is up:",
        f"  mgmt-api   REST {stack.mgmt_url}/v2  (user admin, password {stack.password})"
        f"  policy stream {p.at(p.grpc)}",
        f"  ratelimit  gRPC {p.at(p.ratelimit)}  (in-memory counters)"
        f"  metrics http://{p.at(p.ratelimit_metrics)}/metrics",
        f"  extauthz   gRPC {p.at(p.extauthz)}  HTTP mode http://{p.at(p.extauthz_http)}"
        f"  metrics http://{p.at(p.extauthz_metrics)}/metrics",
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
        prog="python -m mgmt_api.demo",
        description="Run mgmt-api, ratelimit and extauthz with a seeded demo.",
    )
    defaults = Ports()
    parser.add_argument("--state-dir", default=".run", help="where state and logs live")
    parser.add_argument("--host", default=defaults.host, help="address every service binds")
    for name in (
        "mgmt",
        "grpc",
        "ratelimit",
        "ratelimit_metrics",
        "extauthz",
        "extauthz_http",
        "extauthz_metrics",
    ):
        flag = "--" + name.replace("_", "-") + "-port"
        parser.add_argument(flag, dest=name, type=int, default=getattr(defaults, name))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    fields: dict[str, Any] = {k: getattr(args, k) for k in Ports.__dataclass_fields__}
    stack = Stack(Path(args.state_dir), Ports(**fields))

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
