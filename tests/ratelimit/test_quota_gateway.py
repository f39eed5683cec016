"""The reference's quota example through a real Envoy gateway reading our dynamic metadata.

envoyproxy/ratelimit's ``examples/envoy/proxy.yaml`` sends the descriptors
``service=service_1`` and ``service=service_2`` (both in quota mode in its
``examples/ratelimit/config/example.yaml``, 1/min and 2/min) and reads the
name of the service that still has quota as
``%DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:service_with_quota:name)%``.
Here the gateway puts that name in a response header, so the test sees what
a route or a load balancer would: service_1, then service_2, then a 429
(``integration-test/scripts/quota.sh``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ratelimit.servers import Server, wait_ready
from tests.support.envoy import EnvoyProcess
from tests.support.net import free_port
from tests.support.redis_server import RedisServer

_TYPE = "type.googleapis.com/"

CONFIG = """\
domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {service_with_quota: {name: service_1}}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata: {service_with_quota: {name: service_2}}
"""

NAME = "%DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:service_with_quota:name)%"


def _listener(name: str, port: int, routes: list[dict[str, Any]], filters: list[Any]) -> Any:
    manager = {
        "@type": _TYPE
        + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": name,
        "route_config": {"virtual_hosts": [{"name": name, "domains": ["*"], "routes": routes}]},
        "http_filters": [
            *filters,
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": _TYPE + "envoy.extensions.filters.http.router.v3.Router"},
            },
        ],
    }
    return {
        "name": name,
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


def _cluster(name: str, port: int, http2: bool = False) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "5s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {
                                    "socket_address": {"address": "127.0.0.1", "port_value": port}
                                }
                            }
                        }
                    ]
                }
            ],
        },
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _TYPE + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return cluster


def bootstrap(gateway_port: int, app_port: int, ratelimit_port: int) -> dict[str, Any]:
    ratelimit_filter = {
        "name": "envoy.filters.http.ratelimit",
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": "rl",
            # Generous: a loaded test machine must not turn an answer into a timeout
            # (which Envoy's default failure_mode_deny: false lets through).
            "timeout": "10s",
            "rate_limit_service": {
                "grpc_service": {"envoy_grpc": {"cluster_name": "ratelimit"}},
                "transport_api_version": "V3",
            },
        },
    }
    quota_route = {
        "match": {"prefix": "/quota"},
        "route": {
            "cluster": "app",
            "rate_limits": [
                {"actions": [{"generic_key": {"descriptor_key": "service", "descriptor_value": v}}]}
                for v in ("service_1", "service_2")
            ],
        },
        "response_headers_to_add": [{"header": {"key": "x-service-with-quota", "value": NAME}}],
    }
    app_route = {"match": {"prefix": "/"}, "direct_response": {"status": 200}}
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [
                _listener("gateway", gateway_port, [quota_route], [ratelimit_filter]),
                _listener("app", app_port, [app_route], []),
            ],
            "clusters": [
                _cluster("app", app_port),
                _cluster("ratelimit", ratelimit_port, http2=True),
            ],
        },
    }


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, redis_module: RedisServer) -> Iterator[str]:
    root = tmp_path_factory.mktemp("quota-gateway")
    (root / "rl.yaml").write_text(CONFIG)
    settings = root / "settings.yaml"
    settings.write_text("responseDynamicMetadata: true\n")
    server = Server("envoy", root / "rl.yaml", redis_module.url, settings)
    envoy: EnvoyProcess | None = None
    try:
        server.wait_listening()
        wait_ready(server)
        port = free_port()
        envoy = EnvoyProcess(
            bootstrap(port, free_port(), server.port), directory=Path(root)
        ).start()
        yield f"http://127.0.0.1:{port}"
    finally:
        if envoy is not None:
            envoy.stop()
        server.close()


def test_the_gateway_reads_which_service_still_has_quota(gateway: str) -> None:
    answers = [httpx.get(gateway + "/quota", timeout=30) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert [a.headers.get("x-service-with-quota") for a in answers[:2]] == [
        "service_1",
        "service_2",
    ]
