"""A cluster with real parts: mgmt-api, Envoys from the wheel, and meshplane-agent.

Shared by the agent's end-to-end tests (started once per test package, see
``conftest.py``): one ``mgmt-api serve`` subprocess, an organization with
clusters ``a`` and ``b``, three Envoys as the proxies of cluster ``a``
(``shop/web`` instances ``web-1`` and ``web-2``, ``shop/api`` instance
``api-1``), each with its admin listener on loopback and its log in a file,
and a ``meshplane-agent`` process for cluster ``a`` with static discovery.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from mgmt_api.compiler.local_jwt import compile_local_jwt
from tests.mgmt_api.harness import MgmtServer, ok
from tests.support.certs import CertificateAuthority, Issued
from tests.support.envoy import EnvoyProcess, minimal_bootstrap
from tests.support.net import free_port
from tests.support.otlp_receiver import OtlpGrpcReceiver
from tests.support.processes import Service, wait_until

ORG = "diag"
PROXY_TIMEOUT_SECONDS = 5
PROXIES = (("shop", "web", "web-1"), ("shop", "web", "web-2"), ("shop", "api", "api-1"))


# Secrets planted in every Envoy's config, by where they are; none may leave the agent.
SECRETS = {
    "db_password": "hunter2-node-password",
    "auth_token": "tok-node-auth-token",
    "aws_secret_access_key": "aws-node-secret-access-key",
    "stripe_api_key": "sk-node-stripe-api-key",
    "awsSecretAccessKey": "aws-node-camel-secret",
    "X-Api-Key": "xak-node-api-key",
    "route_authorization": "route-added-bearer-token",
    "lua_api_key": "lua-inline-key-value",
    "generic_secret": "oauth-generic-secret-value",
    "config_yaml_password": "yaml-inline-password",
    # the HMAC key (JWK ``k``) of a SecuritySetting's local JWT keys, compiled as a gateway gets it
    "jwk_k": "bG9jYWwtand0LWhtYWMta2V5LXNlY3JldC0wMTIzNDU2Nzg5",
}
# Ordinary values that sit next to them, with names close to secret ones; all stay visible.
VISIBLE = {
    "max_tokens": 4321,
    "tokens_per_fill": 17,
    "keyspace": "ks-visible",
    "primary_key_hash": "pkh-visible",
    "token_endpoint": "https://auth.example/token-visible",
    "plain": "visible-value",
}
_TYPES = "type.googleapis.com/envoy.extensions"


def _local_jwt_filter() -> dict[str, Any]:
    """The jwt_authn filter mgmt-api compiles for a SecuritySetting whose local keys are
    an HMAC JWKS (``authorization.http.local``), as gateways and sidecars get it over ADS:
    its ``localJwks.inlineString`` is the JWKS text, ``k`` and all."""
    jwks = {"keys": [{"kty": "oct", "alg": "HS256", "kid": "h", "k": SECRETS["jwk_k"]}]}
    local = {
        "rules": [{"from": [{"jwt": {"iss": "https://idp.test"}}]}],
        "keys": {"jwks": {"value": json.dumps(jwks)}},
    }
    jwt_authn: dict[str, Any] = compile_local_jwt("local", local).http_filters[0]
    return jwt_authn


def _listener(tls: Issued) -> dict[str, Any]:
    """A TLS listener whose filters use Envoy's token-, secret- and key-named fields."""
    hcm = {
        "@type": f"{_TYPES}.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "ingress",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "backend"}}],
                    "request_headers_to_add": [
                        {
                            "header": {
                                "key": "authorization",
                                "value": f"Bearer {SECRETS['route_authorization']}",
                            }
                        },
                        {"header": {"key": "x-request-source", "value": "visible-header"}},
                    ],
                }
            ]
        },
        "http_filters": [
            {
                "name": "ratelimit",
                "typed_config": {
                    "@type": f"{_TYPES}.filters.http.local_ratelimit.v3.LocalRateLimit",
                    "stat_prefix": "local",
                    "token_bucket": {
                        "max_tokens": VISIBLE["max_tokens"],
                        "tokens_per_fill": VISIBLE["tokens_per_fill"],
                        "fill_interval": "1s",
                    },
                },
            },
            {
                "name": "oauth2",
                "typed_config": {
                    "@type": f"{_TYPES}.filters.http.oauth2.v3.OAuth2",
                    "config": {
                        "token_endpoint": {
                            "cluster": "backend",
                            "uri": VISIBLE["token_endpoint"],
                            "timeout": "3s",
                        },
                        "authorization_endpoint": "https://auth.example/authorize",
                        "redirect_uri": "https://app.example/callback",
                        "redirect_path_matcher": {"path": {"exact": "/callback"}},
                        "signout_path": {"path": {"exact": "/signout"}},
                        "credentials": {
                            "client_id": "visible-client",
                            "token_secret": {"name": "oauth-token"},
                            "hmac_secret": {"name": "oauth-hmac"},
                        },
                    },
                },
            },
            {
                "name": "lua",
                "typed_config": {
                    "@type": f"{_TYPES}.filters.http.lua.v3.Lua",
                    "default_source_code": {
                        "inline_string": f"local api_key = '{SECRETS['lua_api_key']}'\n"
                        "function envoy_on_request(h) end\n"
                    },
                },
            },
            _local_jwt_filter(),
            {
                "name": "router",
                "typed_config": {"@type": f"{_TYPES}.filters.http.router.v3.Router"},
            },
        ],
    }
    return {
        "name": "ingress",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
        "filter_chains": [
            {
                "filters": [{"name": "hcm", "typed_config": hcm}],
                "transport_socket": {
                    "name": "tls",
                    "typed_config": {
                        "@type": f"{_TYPES}.transport_sockets.tls.v3.DownstreamTlsContext",
                        "common_tls_context": {
                            "tls_certificate_sds_secret_configs": [{"name": "server-cert"}]
                        },
                    },
                },
            }
        ],
    }


def bootstrap(instance: str, workload: str, tls: Issued) -> dict[str, Any]:
    """An Envoy whose config holds secrets where Envoy does not redact them (node and
    cluster metadata, a header a route adds, inline Lua) and where it does (private
    keys, generic secrets), next to real fields with token- and key-like names."""
    config = minimal_bootstrap("127.0.0.1")
    config["node"] = {
        "id": instance,
        "cluster": workload,
        "metadata": {
            **{
                name: SECRETS[name]
                for name in (
                    "db_password",
                    "auth_token",
                    "aws_secret_access_key",
                    "stripe_api_key",
                    "awsSecretAccessKey",
                    "X-Api-Key",
                )
            },
            **{name: VISIBLE[name] for name in ("keyspace", "primary_key_hash", "plain")},
            "tls": {
                "private_key": "-----BEGIN PRIVATE KEY-----\nMIIEnode\n-----END PRIVATE KEY-----"
            },
        },
    }
    static = config["static_resources"]
    cluster = static["clusters"][0]
    cluster["metadata"] = {
        "filter_metadata": {
            "acme": {
                "password": "hunter2-cluster-password",
                "note": "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----",
                "apiKey": "ak-123456",
                "plain": "visible-value",
            }
        }
    }
    static["secrets"] = [
        {
            "name": "server-cert",
            "tls_certificate": {
                "certificate_chain": {"inline_string": tls.cert.read_text()},
                "private_key": {"inline_string": tls.key.read_text()},
            },
        },
        {
            "name": "oauth-token",
            "generic_secret": {"secret": {"inline_string": SECRETS["generic_secret"]}},
        },
        {
            "name": "oauth-hmac",
            "generic_secret": {"secret": {"inline_string": SECRETS["generic_secret"]}},
        },
    ]
    static["listeners"] = [_listener(tls)]
    return config


def config_yaml() -> str:
    """``--config-yaml`` (merged into the bootstrap; ``/server_info`` shows it as text)."""
    return json.dumps(
        {
            "layered_runtime": {
                "layers": [
                    {
                        "name": "static",
                        "static_layer": {"db": {"password": SECRETS["config_yaml_password"]}},
                    }
                ]
            }
        }
    )


class Agent:
    """A ``meshplane-agent`` subprocess (``python -m agent``)."""

    def __init__(
        self,
        tmp: Path,
        mgmt: MgmtServer,
        cluster: str,
        credentials: Path,
        proxies: Path | None,
        *extra: str,
        control_plane: str | None = None,
    ) -> None:
        self.port = free_port()
        self.log = tmp / f"agent-{cluster}-{self.port}.log"
        args = [
            "agent",
            "--control-plane",
            control_plane or f"grpc://127.0.0.1:{mgmt.grpc_port}",
            "--cluster",
            f"{ORG}/{cluster}",
            "--credentials",
            str(credentials),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--max-backoff",
            "1",
            *(["--static-proxies", str(proxies)] if proxies else []),
            *extra,
        ]
        self.service = Service(args, self.port, self.log)

    def start(self) -> Agent:
        self.service.start()
        return self

    def stop(self) -> Any:
        return self.service.stop()

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text

    def metric(self, sample: str) -> float:
        """The value of one sample, e.g. ``name{label="v"}`` (0 when absent)."""
        for line in self.metrics().splitlines():
            name, _, value = line.rpartition(" ")
            if name == sample:
                return float(value)
        return 0.0

    def ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False


class Fleet:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.envoys: dict[str, EnvoyProcess] = {}
        self.agents: list[Agent] = []
        self.mgmt = MgmtServer(data_dir=str(tmp / "mgmt"))
        try:
            self._start()
        except BaseException:
            self.close()  # nothing started may outlive a failed start
            raise

    def _start(self) -> None:
        tmp = self.tmp
        (tmp / "mgmt").mkdir()
        # A proxy that does not answer is given up on after this long (504 tests).
        # mgmt-api traces only requests whose caller sampled them (test_traces.py),
        # exporting to the fleet's OTLP receiver. The server's own environment,
        # so a restarted mgmt-api (test_tunnel_security.py) keeps them.
        self.otlp = OtlpGrpcReceiver()
        self.mgmt.env.update(
            {
                "MESHPLANE_PROXYTOOLS_TIMEOUT": f"{PROXY_TIMEOUT_SECONDS}s",
                "OTEL_EXPORTER_OTLP_ENDPOINT": self.otlp.endpoint,
                "OTEL_TRACES_SAMPLER": "parentbased_always_off",
                "OTEL_BSP_SCHEDULE_DELAY": "200",
            }
        )
        self.mgmt.start()
        self.admin = self.mgmt.admin()
        ok(self.admin.post("/v2/organizations", json={"name": ORG, "organization": {}}))
        self.secrets: dict[str, dict[str, Any]] = {}
        for name in ("a", "b"):
            self.create_cluster(name)
        self.tls = CertificateAuthority(tmp).issue("envoy")
        for _ns, workload, instance in PROXIES:
            envoy = EnvoyProcess(
                bootstrap(instance, workload, self.tls),
                directory=tmp / instance,
                extra_args=("--config-yaml", config_yaml()),
            )
            self.envoys[instance] = envoy.start()
        self.proxies_file = tmp / "proxies.yaml"
        self.write_proxies()
        self.agent = self.start_agent("a")

    def create_cluster(self, name: str) -> dict[str, Any]:
        """A cluster and its agent key (``credentials(name)``); returns the key secret."""
        created = ok(
            self.admin.post(f"/v2/organizations/{ORG}/clusters", json={"name": name, "cluster": {}})
        )
        secret: dict[str, Any] = created["installTemplate"]["helm"]["secrets"][
            "clusterServiceAccount"
        ]
        self.secrets[name] = secret
        self.credentials(name).write_text(json.dumps(secret))
        return secret

    def write_proxies(self, entries: list[dict[str, str]] | None = None) -> None:
        entries = entries if entries is not None else self.entries()
        self.proxies_file.write_text(json.dumps({"proxies": entries}))

    def entries(self) -> list[dict[str, str]]:
        return [
            {
                "namespace": ns,
                "workload": wl,
                "instance": inst,
                "adminAddress": self.envoys[inst].admin_address,
                "logFile": str(self.envoys[inst].log_path),
            }
            for ns, wl, inst in PROXIES
        ]

    def credentials(self, cluster: str) -> Path:
        return self.tmp / f"credentials-{cluster}.json"

    def start_agent(self, cluster: str, *extra: str, credentials: Path | None = None) -> Agent:
        agent = Agent(
            self.tmp,
            self.mgmt,
            cluster,
            credentials or self.credentials(cluster),
            self.proxies_file,
            *extra,
        ).start()
        self.agents.append(agent)
        wait_until(agent.ready, timeout=60, what=f"the agent of {cluster} to connect")
        return agent

    def path(self, endpoint: str, cluster: str = "a") -> str:
        return f"/v2/organizations/{ORG}/clusters/{cluster}/proxytools/{endpoint}"

    def close(self) -> None:
        for agent in self.agents:
            agent.stop()
        for envoy in self.envoys.values():
            envoy.stop()
        if hasattr(self, "admin"):
            self.admin.close()
        self.mgmt.close()
        if hasattr(self, "otlp"):
            self.otlp.close()


def wait_ok(
    client: httpx.Client, method: str, path: str, body: dict[str, Any], timeout: float = 30
) -> Any:
    """The first 200 answer (the agent may be reconnecting)."""
    last: list[httpx.Response] = []

    def attempt() -> Any:
        response = client.request(method, path, json=body)
        last[:] = [response]
        return response.json() if response.status_code == 200 else None

    try:
        return wait_until(attempt, timeout=timeout, what=f"{method} {path} to succeed")
    except AssertionError:
        raise AssertionError(
            f"{method} {path}: {last[0].status_code} {last[0].text[:500]}"
        ) from None


def now() -> float:
    return time.time()
