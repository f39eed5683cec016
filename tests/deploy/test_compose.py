"""deploy/compose: Docker cannot run here, so the stack is checked piece by piece.

- envoy.yaml parses into Envoy's Bootstrap proto (typed configs included);
- its filters, the "web" route's per-filter settings and its gRPC clusters
  equal what mgmt-api renders (``GET .../envoyconfig``) for the cluster that
  the compose seed step writes through REST (a real mgmt-api and the real
  seed script);
- docker-compose.yaml's commands parse with the services' own CLI parsers,
  and every address one container calls is a compose service listening on
  that port.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer.main
import yaml
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf import json_format

from extauthz.cli import _parser as extauthz_parser
from meshplane import control_plane
from mgmt_api.cli import app as mgmt_api_app
from ratelimit.cli import _parser as ratelimit_parser
from tests.mgmt_api.harness import ADMIN_PASSWORD, MgmtServer
from tests.support.envoy import get_envoyconfig
from tests.support.envoy_protos import listener_hcm, parse, parse_bootstrap

COMPOSE_DIR = Path(__file__).resolve().parents[2] / "deploy" / "compose"
ENVOY_YAML = COMPOSE_DIR / "envoy.yaml"


def _load_seed_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compose_seed", COMPOSE_DIR / "seed.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


seed_script = _load_seed_module()


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((COMPOSE_DIR / "docker-compose.yaml").read_text())
    return doc


def command(service: str) -> list[str]:
    return [str(part) for part in compose()["services"][service]["command"]]


def mgmt_api_params() -> dict[str, Any]:
    """``mgmt-api serve ...`` parsed by the real typer/click command."""
    argv = command("mgmt-api")
    assert argv[:2] == ["mgmt-api", "serve"]
    group = typer.main.get_command(mgmt_api_app)
    serve = group.get_command(group.make_context("mgmt-api", ["serve"]), "serve")  # type: ignore[attr-defined]
    assert serve is not None
    params: dict[str, Any] = serve.make_context("serve", argv[2:]).params
    return params


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def services_args() -> dict[str, Any]:
    rl, ea = command("ratelimit"), command("extauthz")
    assert rl[0] == "ratelimit" and ea[0] == "extauthz"
    return {
        "ratelimit": ratelimit_parser().parse_args(rl[1:]),
        "extauthz": extauthz_parser().parse_args(ea[1:]),
    }


def seed_args() -> Any:
    argv = command("seed")
    assert argv[:2] == ["python", "/seed/seed.py"]
    return seed_script.parser().parse_args(argv[2:])


def envoy_clusters() -> dict[str, tuple[str, int]]:
    out = {}
    for cluster in parse_bootstrap(ENVOY_YAML).static_resources.clusters:
        socket = cluster.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address
        out[cluster.name] = (socket.socket_address.address, socket.socket_address.port_value)
    return out


def test_envoy_yaml_parses_with_ext_authz_before_ratelimit_before_router() -> None:
    hcm = listener_hcm(parse_bootstrap(ENVOY_YAML))
    assert [f.name for f in hcm.http_filters] == [
        "envoy.filters.http.ext_authz",
        "envoy.filters.http.ratelimit",
        "envoy.filters.http.router",
    ]
    routes = {r.name: r for r in hcm.route_config.virtual_hosts[0].routes}
    assert set(routes) == {"public", "web"}
    assert set(routes["public"].typed_per_filter_config) == {"envoy.filters.http.ext_authz"}


def test_every_address_is_a_compose_service_listening_on_that_port() -> None:
    services = compose()["services"]
    args = services_args()
    mgmt = mgmt_api_params()
    listening = {
        "ratelimit": port_of(args["ratelimit"].listen),
        "extauthz": port_of(args["extauthz"].listen),
        "upstream": int(re.fullmatch(r"-listen=:(\d+)", command("upstream")[0]).group(1)),  # type: ignore[union-attr]
        "mgmt-api": port_of(mgmt["listen"]),
        "redis": 6379,
    }
    for name, (host, port) in envoy_clusters().items():
        assert host in services, name
        assert listening[host] == port, name
    grpc = port_of(mgmt["grpc_listen"])
    seed = seed_args()
    plan = seed_script.plan_for(seed)
    for service, parsed in args.items():
        assert parsed.command == "serve" and parsed.config is None, service
        target = control_plane.parse_target(parsed.control_plane)
        assert target.address == f"mgmt-api:{grpc}", service
        assert not target.bare, service  # an explicit scheme, not the deprecated HOST:PORT
        assert parsed.cluster == f"{plan.organization}/{plan.cluster}", service
        assert parsed.credentials == seed.credentials, service
        assert parsed.workers == 1, service
    url = urlsplit(seed.url)
    assert (url.hostname, url.port) == ("mgmt-api", listening["mgmt-api"])
    extauthz = urlsplit(seed.extauthz_uri)
    assert (extauthz.hostname, extauthz.port) == ("extauthz", listening["extauthz"])
    for redis_url in (seed.redis_url, args["ratelimit"].redis_url):
        assert urlsplit(redis_url).hostname == "redis"
        assert urlsplit(redis_url).port == listening["redis"]


def test_volumes_and_images() -> None:
    services = compose()["services"]
    envoy = services["envoy"]
    assert re.fullmatch(r"envoyproxy/envoy:v1\.3\d.*", envoy["image"])
    assert "./envoy.yaml:/etc/envoy/envoy.yaml:ro" in envoy["volumes"]
    assert (
        f"127.0.0.1:10000:{parse_bootstrap(ENVOY_YAML).static_resources.listeners[0].address.socket_address.port_value}"
        in envoy["ports"]
    )
    assert "./seed.py:/seed/seed.py:ro" in services["seed"]["volumes"]
    credentials_dir = str(Path(seed_args().credentials).parent)
    for name in ("seed", "ratelimit", "extauthz"):
        assert any(
            v.split(":")[:2] == ["credentials", credentials_dir] for v in services[name]["volumes"]
        ), name
    database = mgmt_api_params()["database"]
    assert database.startswith("sqlite") and any(
        v.startswith("mgmt-data:") and database.endswith(v.split(":")[1] + "/mgmt-api.db")
        for v in services["mgmt-api"]["volumes"]
    )


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Seed a real mgmt-api with the compose seed script; its envoyconfig."""
    server = MgmtServer().start()
    try:
        credentials = tmp_path_factory.mktemp("compose") / "demo.json"
        seed = seed_args()
        argv = [
            sys.executable,
            str(COMPOSE_DIR / "seed.py"),
            "--url",
            server.url,
            "--credentials",
            str(credentials),
            "--extauthz-uri",
            seed.extauthz_uri,
            "--redis-url",
            seed.redis_url,
        ]
        env = {**os.environ, "MESHPLANE_ADMIN_PASSWORD": ADMIN_PASSWORD}
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        assert credentials.exists()
        plan = seed_script.plan_for(seed)
        ratelimit = f"grpc://ratelimit:{port_of(services_args()['ratelimit'].listen)}"
        with server.admin() as admin:
            yield get_envoyconfig(admin, plan.cluster_path, {"rateLimitService": ratelimit})
    finally:
        server.close()


def _as_dict(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = json_format.MessageToDict(message)
    return out


def test_envoy_yaml_filters_equal_what_mgmt_api_renders(rendered: dict[str, Any]) -> None:
    hcm = listener_hcm(parse_bootstrap(ENVOY_YAML))
    in_yaml = {f.name: _as_dict(f) for f in hcm.http_filters}
    assert rendered["httpFilters"], rendered
    for piece in rendered["httpFilters"]:
        # Compared as protos: defaults (false, 0) are omitted on either side.
        assert in_yaml[piece["name"]] == _as_dict(parse(piece, hcm_pb2.HttpFilter()))


def test_web_route_carries_the_rendered_per_route_settings(rendered: dict[str, Any]) -> None:
    hcm = listener_hcm(parse_bootstrap(ENVOY_YAML))
    web = next(r for r in hcm.route_config.virtual_hosts[0].routes if r.name == "web")
    expected: dict[str, Any] = {}
    for entry in rendered["routes"]:
        # The demo's group selects every namespace; its traffic policy targets HTTPRoute web.
        if "workloads" in entry:
            assert entry["workloads"]["namespaces"] == ["*"]
        else:
            assert entry["targetRef"]["name"] == "web"
        expected.update(entry["typedPerFilterConfig"])
    assert set(expected) == {"envoy.filters.http.ext_authz", "envoy.filters.http.ratelimit"}
    route = {"match": {"prefix": "/"}, "typedPerFilterConfig": expected}
    want = _as_dict(parse(route, route_components_pb2.Route()))["typedPerFilterConfig"]
    assert _as_dict(web)["typedPerFilterConfig"] == want


def test_envoy_yaml_grpc_clusters_equal_what_mgmt_api_renders(rendered: dict[str, Any]) -> None:
    in_yaml = {c.name: _as_dict(c) for c in parse_bootstrap(ENVOY_YAML).static_resources.clusters}
    assert {c["name"] for c in rendered["clusters"]} == {"extauthz", "ratelimit"}
    for cluster in rendered["clusters"]:
        assert in_yaml[cluster["name"]] == _as_dict(parse(cluster, cluster_pb2.Cluster()))
