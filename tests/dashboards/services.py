"""Run the real services as subprocesses, drive a little traffic, scrape /metrics.

The dashboards are only useful if they query names the services actually
expose, so the test does not trust the ``metrics.py`` files (or a registry
imported in-process): it starts each service through its console script,
exactly as an operator would, and reads what the supervisor's ``/metrics``
serves. Label-only families appear in a multi-process exposition only after
their first observation, so the traffic is chosen to touch every family a
dashboard uses: allowed and denied checks, a remote JWKS fetch, rate-limit
rules with shadow mode, and a second rate-limit instance whose Redis is
unreachable (store errors). Every process is started in its own session and
the whole group is stopped afterwards, whatever happens.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.auth.v3 import attribute_context_pb2, external_auth_pb2, external_auth_pb2_grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from tests.support.net import free_port, wait_for_port

BIN = Path(sys.executable).parent
ADMIN_PASSWORD = "dashboards-test-admin-password"
HS_SECRET = "dashboards-test-hmac-secret-0123456789"  # a test-only key


# --- exposition -------------------------------------------------------------------

_TYPE = re.compile(r"^# TYPE (\S+) (\S+)")
_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(\{.*\})?\s")
_LABEL = re.compile(r'([A-Za-z_]\w*)="((?:[^"\\]|\\.)*)"')
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
_SUMMARY_SUFFIXES = ("_sum", "_count")


@dataclass
class Exposition:
    """What one service's /metrics exposes: family types, and per series its labels' values."""

    types: dict[str, str] = field(default_factory=dict)
    labels: dict[str, dict[str, set[str]]] = field(default_factory=dict)

    def add(self, text: str) -> None:
        for line in text.splitlines():
            if m := _TYPE.match(line):
                self.types[m.group(1)] = m.group(2)
            elif line and not line.startswith("#") and (m := _SAMPLE.match(line)):
                labels = self.labels.setdefault(m.group(1), {})
                for label, value in _LABEL.findall(m.group(2) or ""):
                    labels.setdefault(label, set()).add(value)

    def family_of(self, series: str) -> str | None:
        """The ``# TYPE`` family that exposes ``series``, if any.

        prometheus_client's text format names a counter's family ``x_total``
        (the sample name) and a histogram's family ``x`` with samples
        ``x_bucket``, ``x_sum`` and ``x_count``; a summary has ``_sum``/``_count``.
        """
        if series in self.types:
            return series
        for suffix in _HISTOGRAM_SUFFIXES:
            base = series.removesuffix(suffix)
            if base == series:
                continue
            kind = self.types.get(base)
            if kind == "histogram" or (kind == "summary" and suffix in _SUMMARY_SUFFIXES):
                return base
        return None

    def label_names(self, series: str) -> set[str]:
        return set(self.labels.get(series, {}))

    def label_values(self, series: str, label: str) -> set[str]:
        return self.labels.get(series, {}).get(label, set())


# Sample name and its label set -> value.
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_samples(text: str) -> Samples:
    """Every sample of an exposition, keyed by name and label set."""
    found: Samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and (m := _SAMPLE.match(line)):
            labels = frozenset(_LABEL.findall(m.group(2) or ""))
            found[(m.group(1), labels)] = float(line.rsplit(" ", 1)[1])
    return found


# --- processes --------------------------------------------------------------------


class Processes:
    """Subprocesses in their own sessions; ``stop_all`` ends each group it started."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child keeps its own copy
        try:
            self.procs[name] = subprocess.Popen(
                argv,
                env={**os.environ, "MESHPLANE_LOG_LEVEL": "WARNING", **(env or {})},
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        finally:
            log.close()

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def wait_ports(self, name: str, *ports: int, timeout: float = 30.0) -> None:
        """Wait for every port, failing fast (with the log) if the process died."""
        proc = self.procs[name]
        deadline = time.monotonic() + timeout
        for port in ports:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")
                try:
                    wait_for_port(port, timeout=0.5)
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"{name}: nothing on port {port}:\n{self.log(name)}"
                        ) from None

    def stop_all(self) -> None:
        """SIGTERM each supervisor (it drains its workers), then SIGKILL what is left.

        Each process leads its own group, and Linux does not reuse a pid while
        it is still some group's id, so the final ``killpg`` can only reach
        workers of ours that outlived their supervisor.
        """
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            # Workers may outlive a supervisor killed mid-drain: end the group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.poll() is None:
                proc.wait(5)


# --- a JWKS endpoint --------------------------------------------------------------


@contextlib.contextmanager
def jwks_server(document: bytes) -> Iterator[str]:
    """Serve ``document`` at ``http://127.0.0.1:PORT/jwks.json`` from a thread."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(document)))
            self.end_headers()
            self.wfile.write(document)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    finally:
        server.shutdown()
        server.server_close()


# --- the services -----------------------------------------------------------------


def _path_token(
    key: object, algorithm: str, path: str, *, ttl: int = 600, kid: str | None = None
) -> str:
    now = int(time.time())
    claims = {"path": base64.b64encode(path.encode()).decode(), "nbf": now - 5, "exp": now + ttl}
    headers = {"kid": kid} if kid else None
    return jwt.encode(claims, key, algorithm=algorithm, headers=headers)  # type: ignore[arg-type]


def _check_request(
    path: str, authorization: str | None, policy: str | None
) -> external_auth_pb2.CheckRequest:
    headers = {":method": "GET", ":path": path, ":authority": "app"}
    if authorization is not None:
        headers["authorization"] = authorization
    http_req = attribute_context_pb2.AttributeContext.HttpRequest(
        method="GET", path=path, host="app", scheme="http", protocol="HTTP/1.1", headers=headers
    )
    attributes = attribute_context_pb2.AttributeContext(
        request=attribute_context_pb2.AttributeContext.Request(http=http_req)
    )
    if policy is not None:
        attributes.context_extensions["meshplane.policy"] = policy
    return external_auth_pb2.CheckRequest(attributes=attributes)


def start_extauthz(procs: Processes, work: Path, jwks_uri: str) -> dict[str, int]:
    # "remote-down" names a JWKS on a closed port: its initial fetch fails,
    # which is what the dashboard's "JWKS refresh failures" panels show.
    policy = work / "extauthz.yaml"
    policy.write_text(
        f"""\
defaultPolicy: hs
policies:
  - name: hs
    jwt:
      algorithms: [HS256]
      keys:
        - hmacSecret: {{value: {HS_SECRET}}}
    pathClaim: {{name: path, match: PREFIX}}
  - name: remote
    jwt:
      algorithms: [RS256]
      keys:
        - jwks: {{uri: "{jwks_uri}", timeoutSeconds: 2}}
    pathClaim: {{name: path, match: PREFIX}}
  - name: remote-down
    jwt:
      algorithms: [RS256]
      keys:
        - jwks: {{uri: "http://127.0.0.1:{free_port()}/jwks.json", timeoutSeconds: 1}}
    pathClaim: {{name: path, match: PREFIX}}
"""
    )
    ports = {"grpc": free_port(), "http": free_port(), "metrics": free_port()}
    procs.start(
        "extauthz",
        [str(BIN / "extauthz"), "serve", "--config", str(policy),
         "--listen", f"127.0.0.1:{ports['grpc']}",
         "--http-listen", f"127.0.0.1:{ports['http']}",
         "--metrics-listen", f"127.0.0.1:{ports['metrics']}",
         "--grace-seconds", "1"],
    )  # fmt: skip
    return ports


def drive_extauthz(ports: dict[str, int], rsa_key: rsa.RSAPrivateKey) -> None:
    good = _path_token(HS_SECRET, "HS256", "/api")
    expired = _path_token(HS_SECRET, "HS256", "/api", ttl=-60)
    remote_good = _path_token(rsa_key, "RS256", "/api", kid="k1")
    calls = [
        ("/api/items", f"Bearer {good}", None),  # allow
        ("/other", f"Bearer {good}", None),  # deny: path_not_allowed
        ("/api/items", f"Bearer {expired}", None),  # deny: expired
        ("/api/items", None, None),  # deny: missing_authorization
        ("/api/items", f"Bearer {remote_good}", "remote"),  # allow with the fetched JWKS
    ]
    with grpc.insecure_channel(f"127.0.0.1:{ports['grpc']}") as channel:
        stub = external_auth_pb2_grpc.AuthorizationStub(channel)
        for path, auth, policy in calls:
            stub.Check(_check_request(path, auth, policy), timeout=10, wait_for_ready=True)
    # One check through Envoy's http_service mode too.
    httpx.get(
        f"http://127.0.0.1:{ports['http']}/check/-/api/items",
        headers={"authorization": f"Bearer {good}"},
        timeout=10,
    )


RATELIMIT_RULES = """\
domain: dash
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: client
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
"""


def start_ratelimit(procs: Processes, work: Path, name: str, *extra: str) -> dict[str, int]:
    rules = work / f"{name}.yaml"
    rules.write_text(RATELIMIT_RULES)
    ports = {"grpc": free_port(), "metrics": free_port()}
    env = {k: "" for k in ("REDIS_URL", "REDIS_URL_FILE")}
    procs.start(
        name,
        [str(BIN / "ratelimit"), "serve", "--config", str(rules),
         "--listen", f"127.0.0.1:{ports['grpc']}",
         "--metrics-listen", f"127.0.0.1:{ports['metrics']}",
         "--grace-seconds", "1", *extra],
        env=env,
    )  # fmt: skip
    return ports


def _rl_request(domain: str, key: str, value: str) -> rls_pb2.RateLimitRequest:
    descriptor = ratelimit_pb2.RateLimitDescriptor()
    descriptor.entries.add(key=key, value=value)
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=[descriptor], hits_addend=1)


def drive_ratelimit(port: int, *, calls: int) -> None:
    """``calls`` decisions per rule plus an unknown domain; errors are expected
    (and ignored) on the instance whose store is down."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        requests = [_rl_request("dash", "user", "alice") for _ in range(calls)]
        requests += [_rl_request("dash", "client", "10.0.0.1") for _ in range(calls)]
        requests.append(_rl_request("no-such-domain", "user", "alice"))
        for req in requests:
            with contextlib.suppress(grpc.RpcError):
                stub.ShouldRateLimit(req, timeout=10, wait_for_ready=True)


def start_mgmt_api(procs: Processes, work: Path) -> dict[str, int]:
    # The PolicyDistribution gRPC port defaults to a fixed 127.0.0.1:8444,
    # which another mgmt-api on the machine may hold: give it a free one.
    ports = {"http": free_port(), "grpc": free_port()}
    procs.start(
        "mgmt-api",
        [str(BIN / "mgmt-api"), "serve",
         "--listen", f"127.0.0.1:{ports['http']}",
         "--grpc-listen", f"127.0.0.1:{ports['grpc']}",
         "--database", f"sqlite+pysqlite:///{work / 'mgmt-api.db'}"],
        env={"MESHPLANE_ADMIN_PASSWORD": ADMIN_PASSWORD, "MESHPLANE_DATA_DIR": str(work)},
    )  # fmt: skip
    return ports


def drive_mgmt_api(port: int) -> None:
    auth = ("admin", ADMIN_PASSWORD)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        deadline = time.monotonic() + 30
        while client.get("/readyz").status_code != 200:
            if time.monotonic() > deadline:
                raise TimeoutError("mgmt-api never became ready")
            time.sleep(0.1)
        client.get("/v2/organizations", auth=auth)  # 200
        client.get("/v2/organizations/no-such-org", auth=auth)  # 404
        client.get("/v2/organizations")  # 401
        client.get("/v2/no/such/route", auth=auth)  # <unmatched>


def break_config(path: Path, metrics_url: str, config: str) -> None:
    """Write an invalid config and wait for the rejected reload to be counted.

    The service keeps its last good config (so the traffic above is not
    affected); this only makes ``meshplane_config_reloads_total{result="error"}``
    exist, which the "config reload errors" panels select.
    """
    path.write_text("this: is: not [valid yaml\n")
    deadline = time.monotonic() + 10
    while True:
        seen = Exposition()
        seen.add(scrape(metrics_url))
        if "error" in seen.label_values("meshplane_config_reloads_total", "result"):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{config}: the bad config was never counted as a reload error")
        time.sleep(0.2)


def scrape_when(url: str, ready: Callable[[Exposition], bool], what: str) -> str:
    """Scrape ``url`` until ``ready`` holds (services may flush metrics periodically).

    ext_authz and ratelimit aggregate their hot-path metrics in each worker
    and flush them every ``FLUSH_INTERVAL_SECONDS``, so what was just sent
    may not be visible yet.
    """
    deadline = time.monotonic() + 10
    while True:
        text = scrape(url)
        seen = Exposition()
        seen.add(text)
        if ready(seen):
            return text
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}: {what} never appeared")
        time.sleep(0.2)


# What drive_extauthz's checks produce, once flushed.
EXTAUTHZ_REASONS = {"ok", "path_not_allowed", "expired", "missing_authorization"}


def _extauthz_flushed(seen: Exposition) -> bool:
    checks = "meshplane_extauthz_checks_total"
    reasons = seen.label_values(checks, "reason")
    modes = seen.label_values(checks, "mode")
    return reasons.issuperset(EXTAUTHZ_REASONS) and modes.issuperset({"grpc", "http"})


def _ratelimit_flushed(seen: Exposition) -> bool:
    # ratelimit also aggregates per-rule counters and flushes them periodically.
    rules = seen.label_values("meshplane_ratelimit_shadow_mode_total", "rule")
    results = seen.label_values("meshplane_ratelimit_decisions_total", "result")
    return rules.issuperset({"user", "client"}) and "over_limit" in results


def _store_errors_seen(seen: Exposition) -> bool:
    return bool(seen.label_values("meshplane_ratelimit_store_errors_total", "reason"))


def scrape(url: str, auth: tuple[str, str] | None = None) -> str:
    response = httpx.get(url, auth=auth, timeout=10)
    response.raise_for_status()
    return response.text


def jwks_document(key: rsa.RSAPrivateKey) -> bytes:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update({"kid": "k1", "alg": "RS256", "use": "sig"})
    return json.dumps({"keys": [jwk]}).encode()


def collect_expositions(work: Path) -> dict[str, Exposition]:
    """Start every service, drive traffic, and return each one's /metrics."""
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    procs = Processes(work)
    with jwks_server(jwks_document(rsa_key)) as jwks_uri:
        try:
            ext = start_extauthz(procs, work, jwks_uri)
            rl = start_ratelimit(procs, work, "ratelimit")
            # Same rules, but its Redis is a closed port: every decision is a
            # store error, answered by failureMode allow.
            rl_down = start_ratelimit(
                procs, work, "ratelimit-store-down",
                "--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--failure-mode", "allow",
            )  # fmt: skip
            mgmt = start_mgmt_api(procs, work)

            procs.wait_ports("extauthz", ext["grpc"], ext["http"], ext["metrics"])
            procs.wait_ports("ratelimit", rl["grpc"], rl["metrics"])
            procs.wait_ports("ratelimit-store-down", rl_down["grpc"], rl_down["metrics"])
            procs.wait_ports("mgmt-api", mgmt["http"], timeout=60)

            drive_extauthz(ext, rsa_key)
            drive_ratelimit(rl["grpc"], calls=8)
            drive_ratelimit(rl_down["grpc"], calls=2)
            drive_mgmt_api(mgmt["http"])
            break_config(
                work / "extauthz.yaml", f"http://127.0.0.1:{ext['metrics']}/metrics", "extauthz"
            )
            break_config(
                work / "ratelimit.yaml", f"http://127.0.0.1:{rl['metrics']}/metrics", "ratelimit"
            )

            result = {name: Exposition() for name in ("extauthz", "ratelimit", "mgmt-api")}
            result["extauthz"].add(
                scrape_when(
                    f"http://127.0.0.1:{ext['metrics']}/metrics",
                    _extauthz_flushed,
                    "the checks sent",
                )
            )
            result["ratelimit"].add(
                scrape_when(
                    f"http://127.0.0.1:{rl['metrics']}/metrics",
                    _ratelimit_flushed,
                    "the per-rule counters",
                )
            )
            result["ratelimit"].add(
                scrape_when(
                    f"http://127.0.0.1:{rl_down['metrics']}/metrics",
                    _store_errors_seen,
                    "store errors",
                )
            )
            result["mgmt-api"].add(
                scrape(f"http://127.0.0.1:{mgmt['http']}/metrics", ("admin", ADMIN_PASSWORD))
            )
            return result
        finally:
            procs.stop_all()
