"""The README's run command: the whole platform, seeded, behind a real gateway.

Starts ``python -m demo`` (what ``scripts/run`` execs after setup)
on a free ``--port-base`` in a temporary state directory and waits for its ``ready:``
line: mgmt-api, ratelimit, extauthz, the demo upstream, an Envoy gateway
configured over ADS and the cluster agent. Then it sends the requests of the
tour the banner prints, in its order, with httpx to the gateway (a token minted by the
printed command, 200 with x-ratelimit-*, the two 403s, 429 with
x-proxy-ratelimited, 503s from the circuit breakers), runs the printed
policy change as printed (``uv run ...`` replaced by this interpreter's
``-m ...``), waits until the gateway enforces it, and reads the gateway's
ACK in the status and the gateway's logger levels through the agent (the
printed proxy diagnostics call). The tour's denial's decision line names the
trace the gateway started (the demo cluster traces every request). Then every
concrete ``meshctl`` example of docs/meshctl.md and every complete command the
README's prose names runs as printed against the same demo and exits 0
(:func:`check_doc_examples`). Then SIGTERM must stop the orchestrator
and every child it started, and a second run on the same state keeps the
tour's live change, a user's edit of a seeded policy (:func:`check_second_run`).
A busy port must stop the command before anything starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from demo import mesh
from demo.stack import BURST, PORT_OFFSETS, PORT_ROLES, Ports, port_flag
from demo.stack import RAISED_REQUESTS as RAISED
from tests.support import doc_commands
from tests.support.net import free_port, free_ports
from tests.support.processes import wait_until

PORT_FLAGS = tuple(port_flag(name) for name in PORT_ROLES)
CLUSTER_PATH = "/v2/organizations/demo/clusters/demo"
DEMO_REQUESTS = 3  # the demo limit, per minute
#: The mesh part of the tour, after the gateway's (what each printed command holds).
MESH_KINDS = (
    "-H 'host: web.shop' -H \"authorization: Bearer $TOKEN\"",
    "-H 'host: web.shop' -H \"authorization: Bearer not-a-valid-token\"",
    "-H 'host: payments.billing' -H \"authorization: Bearer $TOKEN\"",
    "-H 'host: payments.billing' -H \"authorization: Bearer $TOKEN\"",
)
# org, cluster, Backend, 2 HTTPRoutes, the limit, tenant, workspace, group, JWT policy, setting,
# and the mesh's: 2 groups, shop's JWT policy, 2 settings
SEEDED = 16


def free_port_base() -> int:
    """A base whose every offset is a free port now (the tour runs on ``--port-base``).

    Below the kernel's ephemeral range: the ports are released between the
    probe and the stack's binds, and between the first run and the second, and
    no process's outgoing connection may take one meanwhile.
    """
    span = max(PORT_OFFSETS.values()) + 1
    low, _ = (int(p) for p in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for _ in range(50):
        base = random.randrange(10000, min(low, 60000) - span)
        try:
            with contextlib.ExitStack() as held:
                for port in range(base, base + span):
                    probe = held.enter_context(socket.socket())
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError("no free run of ports for --port-base")


class Orchestrator:
    def __init__(
        self, state: Path, ports: list[int] | None = None, port_base: int | None = None
    ) -> None:
        self.state = state
        argv = [sys.executable, "-m", "demo", "--state-dir", str(state)]
        if port_base is not None:
            argv += ["--port-base", str(port_base)]
        else:
            for flag, port in zip(PORT_FLAGS, ports or free_ports(len(PORT_FLAGS)), strict=True):
                argv += [flag, str(port)]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("ready:"):
                self.ready.set()
        self.ready.set()  # EOF: let the waiter see what happened

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def child_pids(self) -> dict[str, int]:
        found = (re.match(r"\s+([\w-]+): pid (\d+),", line) for line in self.lines)
        return {m.group(1): int(m.group(2)) for m in found if m}

    def printed_commands(self) -> list[str]:
        start = next(i for i, line in enumerate(self.lines) if line.startswith("Try, in"))
        return [
            line.strip()
            for line in self.lines[start + 1 :]
            if line.startswith("  ") and not line.strip().startswith("#")
        ]

    def kill_everything(self) -> None:
        """Last resort in ``finally``: nothing this test started may outlive it."""
        for pid in self.child_pids().values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); its state letter says it is gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture
def orchestrator(tmp_path: Path) -> Iterator[Orchestrator]:
    orch = Orchestrator(tmp_path / ".run", port_base=free_port_base())
    try:
        yield orch
    finally:
        orch.kill_everything()


def localize(command: str) -> str:
    return command.replace("uv run meshctl", f"{sys.executable} -m meshctl").replace(
        "uv run extauthz", f"{sys.executable} -m extauthz.cli"
    )


def run_printed(commands: list[str]) -> list[tuple[int, str]]:
    """Run the printed commands in one shell (``TOKEN=...`` carries over);
    return (exit code, output) per command."""
    script = "".join(f"{{ {localize(c)}\n}} 2>&1\nrc=$?; echo; echo ::exit=$rc\n" for c in commands)
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=180, check=False
    )
    parts = re.split(r"::exit=(\d+)\n", done.stdout)
    return [(int(parts[i + 1]), parts[i]) for i in range(0, len(parts) - 1, 2)]


def _banner_value(output: str, pattern: str) -> str:
    found = re.search(pattern, output)
    assert found, (pattern, output)
    return found.group(1)


def _printed_token(command: str, name: str) -> str:
    """Run a printed ``NAME=$(uv run extauthz token ...)`` line; its value."""
    done = subprocess.run(
        ["bash", "-c", f'{localize(command)}\necho "${name}"'],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def _burst(url: str, token: str, n: int) -> Counter[int]:
    """``n`` concurrent GETs (the banner's ``seq n | xargs -Pn curl``); status counts."""

    def one(_: int) -> int:
        return httpx.get(url, headers={"authorization": f"Bearer {token}"}, timeout=60).status_code

    with ThreadPoolExecutor(n) as pool:
        return Counter(pool.map(one, range(n)))


# A first start is ~30 CPU-seconds of a dozen processes: on a loaded two-core
# machine the wall time is several times that, past pytest's default timeout.
@pytest.mark.timeout(600)
def test_run_command_brings_up_the_gateway_and_the_tour_through_it_holds(
    orchestrator: Orchestrator,
) -> None:
    """Every request the banner prints, sent with httpx to the gateway, in its order."""
    assert orchestrator.ready.wait(420), orchestrator.output
    assert any(line.startswith("ready:") for line in orchestrator.lines), orchestrator.output
    pids = orchestrator.child_pids()
    workloads = {f"{w.name}-{part}" for w in mesh.WORKLOADS for part in ("app", "sidecar")}
    assert set(pids) == {
        "mgmt-api",
        "ratelimit",
        "extauthz",
        "upstream",
        "gateway",
        "agent",
        *workloads,
    }

    output = orchestrator.output
    gateway = _banner_value(output, r"gateway\s+(http://\S+)")
    mgmt = _banner_value(output, r"REST (http://\S+)/v2")
    # --port-base moved every port: each is the base plus its offset.
    base = int(mgmt.rsplit(":", 1)[1])
    assert gateway == f"http://127.0.0.1:{base + PORT_OFFSETS['gateway']}", output
    password = _banner_value(output, r"password (\S+)\)")
    commands = orchestrator.printed_commands()
    kinds = [
        "TOKEN=$(uv run extauthz token",
        f'curl -i -H "authorization: Bearer $TOKEN" {gateway}/headers',
        f'curl -i -H "authorization: Bearer not-a-valid-token" {gateway}/headers',
        f'curl -i -H "authorization: Bearer $TOKEN" {gateway}/admin',
        f"for i in $(seq {DEMO_REQUESTS - 1}); do curl",
        f'curl -i -H "authorization: Bearer $TOKEN" {gateway}/headers',
        "SLOW=$(uv run extauthz token",
        f"seq {BURST} | xargs -P{BURST}",
        "-X PUT",
        f'curl -i --retry 5 --retry-delay 1 -H "authorization: Bearer $TOKEN" {gateway}/headers',
        "/status",
        "/proxytools/loggerlevels",
        *MESH_KINDS,
    ]
    assert len(commands) == len(kinds), commands
    assert all(kind in command for kind, command in zip(kinds, commands, strict=True)), commands
    token = _printed_token(commands[0], "TOKEN")
    slow_token = _printed_token(commands[6], "SLOW")
    assert "--path /slow" in commands[6]
    auth = {"authorization": f"Bearer {token}"}
    # The limit is per minute: do not let the over-limit calls straddle two.
    if 60 - time.time() % 60 < 15:
        time.sleep(60 - time.time() % 60 + 0.1)

    with httpx.Client(base_url=gateway, timeout=30) as http:
        first = http.get("/headers", headers=auth)
        assert first.status_code == 200, first.text
        assert first.headers["x-ratelimit-limit"] == f"{DEMO_REQUESTS}, {DEMO_REQUESTS};w=60"
        assert first.headers["x-ratelimit-remaining"] == str(DEMO_REQUESTS - 1)
        assert int(first.headers["x-ratelimit-reset"]) <= 60
        echoed = {k.lower(): v for k, v in first.json()["headers"].items()}
        assert echoed["authorization"] == auth["authorization"]  # the upstream answered

        bad = http.get("/headers", headers={"authorization": "Bearer not-a-valid-token"})
        assert bad.status_code == 403, bad.text
        denial_id = bad.headers["x-decision-id"]
        denied = http.get("/admin", headers=auth)
        assert denied.status_code == 403, denied.text
        assert denied.headers["x-ext-authz-reason"] == "path_not_allowed"

        rest = [http.get("/headers", headers=auth).status_code for _ in range(DEMO_REQUESTS - 1)]
        assert rest == [200] * (DEMO_REQUESTS - 1)  # the two 403s consumed nothing
        over = http.get("/headers", headers=auth)
        assert over.status_code == 429, over.text
        assert over.headers["x-proxy-ratelimited"] == "true"

        codes = _burst(f"{gateway}/slow?seconds=2", slow_token, BURST)
        assert codes[503] > 0 and codes[200] > 0, codes
        assert set(codes) <= {200, 503}, codes  # the circuit breakers, not the limit

        # The live change: the printed read-change-write line, run as printed.
        ((code, text),) = run_printed([commands[8]])
        assert code == 0, text
        assert json.loads(text)["spec"]["rateLimit"]["global"]["rules"][0]["limit"] == {
            "requests": RAISED,
            "unit": "Minute",
        }
        with httpx.Client(base_url=mgmt, auth=("admin", password), timeout=30) as api:

            def raised() -> httpx.Response | None:
                answer = http.get("/headers", headers=auth)
                return answer if answer.status_code == 200 else None

            after = wait_until(raised, timeout=30, what="the raised limit at the gateway")
            assert after.headers["x-ratelimit-limit"] == f"{RAISED}, {RAISED};w=60"
            assert after.headers["x-ratelimit-remaining"] == str(RAISED - DEMO_REQUESTS - 1)

            status = api.get(f"{CLUSTER_PATH}/status").json()
            gateways = [i for i in status["instances"] if i["kind"] == "gateway"]
            assert [g["instance"] for g in gateways] == ["demo-gateway"], status
            assert gateways[0]["lastResult"] == "ACK" and gateways[0]["upToDate"], status
            assert gateways[0]["appliedVersion"] == status["desiredVersions"]["gateway"]

        # Proxy diagnostics, as printed: mgmt-api asks the agent, which asks the gateway.
        ((code, text),) = run_printed([commands[11]])
        assert code == 0, text
        (instance,) = json.loads(text)["instances"]
        assert instance["instance"] == "demo-gateway", text
        assert instance["levels"]["admin"] in {"trace", "debug", "info", "warning", "error"}

        # A sidecar's too (docs/meshctl.md's `proxy stats web -n shop`): the agent reaches
        # it on its mTLS diagnostics port with its own mesh certificate.
        def sidecar_stats() -> Any:
            body = {"namespace": "shop", "workload": "web", "filter": r"^server\.live$"}
            with httpx.Client(base_url=mgmt, auth=("admin", password), timeout=30) as client:
                answer = client.post(f"{CLUSTER_PATH}/proxytools/serverstats", json=body)
            instances = answer.json().get("instances") if answer.status_code == 200 else None
            return instances if instances and "stats" in instances[0] else None

        (sidecar,) = wait_until(sidecar_stats, timeout=60, what="the web sidecar's stats")
        assert sidecar["instance"] == "shop-web", sidecar
        assert sidecar["stats"] == [{"name": "server.live", "value": 1}], sidecar

    check_mesh_tour(commands[len(kinds) - len(MESH_KINDS) :], commands[0])
    check_trace_id(orchestrator.state, denial_id)
    check_doc_examples(orchestrator.state, base, password)

    orchestrator.proc.send_signal(signal.SIGTERM)
    assert orchestrator.proc.wait(timeout=60) == 0, orchestrator.output
    orchestrator.reader.join(timeout=10)
    assert any(line.startswith("stopped:") for line in orchestrator.lines), orchestrator.output
    assert not [name for name, pid in pids.items() if pid_alive(pid)], orchestrator.output
    # The gateway's own log is JSON lines, like the services'.
    gateway_log = (orchestrator.state / "logs" / "gateway.log").read_text().splitlines()
    assert gateway_log
    assert {json.loads(line)["service"] for line in gateway_log if line.strip()} == {"gateway"}
    check_second_run(orchestrator, base)


def check_mesh_tour(commands: list[str], token_command: str) -> None:
    """The mesh calls, run as printed (after the printed ``TOKEN=...``), in order."""
    allowed, bad_token, local_rule, by_mode = run_printed([token_command, *commands])[1:]
    assert allowed[0] == 0 and json.loads(allowed[1])["app"] == "web", allowed
    assert bad_token[0] == 0 and "HTTP/1.1 403" in bad_token[1], bad_token
    assert "x-ext-authz-reason:" in bad_token[1].lower(), bad_token  # ext_authz said no
    assert "x-meshplane-denied: extauthz " in bad_token[1].lower(), bad_token
    assert local_rule[0] == 0 and json.loads(local_rule[1])["app"] == "payments", local_rule
    assert by_mode[0] == 0 and "HTTP/1.1 403" in by_mode[1], by_mode
    assert "x-meshplane-denied: mode CUSTOM" in by_mode[1], by_mode


def check_trace_id(state: Path, decision_id: str) -> None:
    """The gateway started a trace for the tour's request (it sent none): the
    denial's decision line names it (from the ext_authz call's metadata)."""

    def line() -> dict[str, object] | None:
        text = (state / "logs" / "extauthz.log").read_text(errors="replace")
        found = [json.loads(x) for x in text.splitlines() if decision_id in x]
        return next((x for x in found if x.get("decision_id") == decision_id), None)

    entry = wait_until(line, timeout=30, what="the denial's decision line")
    assert re.fullmatch(r"[0-9a-f]{32}", str(entry["trace_id"])), entry


#: The docs' scratch organization and clusters, made for the examples that
#: change or delete things (docs/meshctl.md says so); the demo's stay intact.
SCRATCH = ("acme", ("c1", "east"))


#: What some examples print (a cheap sanity check beside the exit code), by the line.
EXPECTED = (
    (r"meshctl get clusters --org acme", "east"),
    (r"meshctl status --cluster demo/demo(\s+#.*)?", "demo-gateway"),
    (r"meshctl status --cluster demo/demo --kind sidecar", "sidecar"),
    (r"meshctl proxy loggers \S+ -n \S+ --cluster \S+ --org \S+\s+# read", '"admin"'),
    (r"meshctl rotate meshca --cluster acme/east", "acme/east"),
)


def doc_examples() -> list[tuple[str, str]]:
    """(where, shell line) of every example to run: docs/meshctl.md's first (its
    login comes first), then the README's; deletes last, so the rest find what
    they name."""
    readme, meshctl_page = doc_commands.PAGES
    found = [*doc_commands.runnable(meshctl_page), *doc_commands.runnable(readme)]
    return sorted(found, key=lambda example: " delete " in example[1])


def check_doc_examples(state: Path, base: int, password: str) -> None:
    """Each example, as printed, in one shell per line, in a scratch HOME, at the
    demo's ports (the docs show the default ones): every one exits 0."""
    mgmt = f"http://127.0.0.1:{base + PORT_OFFSETS['mgmt']}"
    with httpx.Client(base_url=mgmt, auth=("admin", password), timeout=30) as api:
        org, clusters = SCRATCH
        made = api.post("/v2/organizations", json={"name": org, "organization": {}})
        assert made.status_code == 200, made.text
        for name in clusters:
            made = api.post(f"/v2/organizations/{org}/clusters", json={"name": name, "cluster": {}})
            assert made.status_code == 200, made.text
    defaults = Ports()
    moved = {
        str(getattr(defaults, name)): str(base + offset) for name, offset in PORT_OFFSETS.items()
    }
    home = state.parent / "home"
    home.mkdir()
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "EDITOR": "true",  # edit: an unchanged file cancels
    }
    env.pop("VISUAL", None)
    examples = doc_examples()
    assert len(examples) >= 15, examples
    matched = [p for p, _ in EXPECTED if any(re.fullmatch(p, line) for _, line in examples)]
    assert len(matched) == len(EXPECTED), matched  # each check still meets its example

    def run(lane: list[tuple[str, str]]) -> list[str]:
        """The lane's examples in order; what failed."""
        failed = []
        for where, line in lane:
            command = re.sub(r"(?<=127\.0\.0\.1:)(\d+)\b", lambda m: moved.get(m[1], m[1]), line)
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=state.parent,
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
                check=False,
            )
            if done.returncode != 0:
                failed.append(f"{where}: {command}\n  exit {done.returncode}: {done.stderr[-800:]}")
            for pattern, shown in EXPECTED:
                if re.fullmatch(pattern, line) and shown not in done.stdout:
                    failed.append(
                        f"{where}: {command}\n  printed no {shown!r}: {done.stdout[-800:]}"
                    )
        return failed

    login, deletes = examples[0], [e for e in examples if " delete " in e[1]]
    assert " login " in login[1], login
    # A code block is a sequence (an export, then its apply): its lines run in
    # order; the blocks run side by side (a wait on a rotation's phases, the
    # ``until`` of one block, is no time lost for the others).
    lanes: dict[str, list[tuple[str, str]]] = {}
    for example in examples[1:]:
        if example not in deletes:
            lanes.setdefault(block_of(example[0]), []).append(example)
    failed = run([login])
    with ThreadPoolExecutor(len(lanes)) as pool:
        failed += [f for lane in pool.map(run, lanes.values()) for f in lane]
    failed += run(deletes)
    assert not failed, "\n".join(failed)


def block_of(where: str) -> str:
    """``page:line`` of the opening fence of the code block ``where`` (``page:line``) is in."""
    page, number = where.rsplit(":", 1)
    lines = (doc_commands.ROOT / page).read_text().splitlines()[: int(number)]
    fence = max(i for i, text in enumerate(lines, 1) if text.lstrip().startswith("```"))
    return f"{page}:{fence}"


def check_second_run(first: Orchestrator, port_base: int) -> None:
    """Run again on the stopped tour's state: the tour's live change (the
    limit raised over REST, a user's edit of a seeded policy) stays, nothing
    is created again, the seed line says what it left alone, and the admin
    password and the agent's key are the first run's."""
    assert f"seeded: {SEEDED} created, 0 left as they are" in first.output, first.output
    state = first.state
    first_password = (state / "admin-password").read_text()
    first_key = (state / "agent-credentials.json").read_text()
    policy = f"{CLUSTER_PATH}/backendtrafficpolicies/default.web-limit"
    orch = Orchestrator(state, port_base=port_base)
    try:
        assert orch.ready.wait(240), orch.output
        assert any(line.startswith("ready:") for line in orch.lines), orch.output
        mgmt = _banner_value(orch.output, r"REST (http://\S+)/v2")
        password = _banner_value(orch.output, r"password (\S+)\)")
        with httpx.Client(base_url=mgmt, auth=("admin", password), timeout=30) as api:
            stored = api.get(policy).json()
        orch.proc.send_signal(signal.SIGINT)
        assert orch.proc.wait(timeout=60) == 0, orch.output
    finally:
        orch.kill_everything()
    assert stored["spec"]["rateLimit"]["global"]["rules"][0]["limit"]["requests"] == RAISED
    assert (
        f"seeded: 0 created, {SEEDED} left as they are (1 differing from the demo's, kept)"
        in orch.output
    ), orch.output
    assert f"  kept as it is: {policy}" in orch.output, orch.output
    assert (state / "admin-password").read_text() == first_password
    assert (state / "agent-credentials.json").read_text() == first_key


@pytest.mark.parametrize("busy", ["--mgmt-port", "--gateway-admin-port"])
def test_a_busy_port_stops_it_before_anything_starts(tmp_path: Path, busy: str) -> None:
    """A port held by another program: exit 1 naming the port, its role and its
    flag, with no child started and the state dir untouched."""
    state = tmp_path / ".run"
    ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        ports[busy] = holder.getsockname()[1]
        argv = [sys.executable, "-m", "demo", "--state-dir", str(state)]
        for flag, port in ports.items():
            argv += [flag, str(port)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done
    role = PORT_ROLES[busy.removeprefix("--").removesuffix("-port").replace("-", "_")]
    assert (
        f"port {ports[busy]} ({role}) on 127.0.0.1 is in use: pass {busy} N,"
        " or stop what listens there" in done.stderr
    ), done.stderr
    assert "(or move every port together: --port-base N)" in done.stderr, done.stderr
    assert "pid" not in done.stdout, done.stdout
    assert not state.exists()


def test_a_port_given_twice_is_refused(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "demo", "--state-dir", str(tmp_path / ".run")]
    argv += ["--mgmt-port", str(port), "--upstream-port", str(port)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done
    assert f"port {port} is given for both mgmt-api REST and demo upstream" in done.stderr
    assert not (tmp_path / ".run").exists()
