"""deploy/compose: Docker cannot run here, so the stack is checked piece by piece.

- envoy.yaml (the gateway's minimal bootstrap: node, admin, ADS) passes
  ``envoy --mode validate`` and is exactly what
  :func:`meshplane.gateway_contract.bootstrap` renders for the compose
  addresses, with the token placeholder the seed replaces;
- the compose seed step, run against a real mgmt-api, writes the demo
  (Backend, HTTPRoutes, the limit) and the gateway's bootstrap: mode 0600, a
  token signed with the cluster's key for the xDS audience, still valid for
  Envoy;
- docker-compose.yaml's commands parse with the services' own CLI parsers,
  and every address one container calls is a compose service listening on
  that port.
"""

from __future__ import annotations

import importlib.util
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import httpx
import jwt
import pytest
import typer.main
import yaml

from demo.seed import credential_files
from extauthz.cli import _parser as extauthz_parser
from meshplane import control_plane, gateway_contract
from mgmt_api.cli import app as mgmt_api_app
from ratelimit.cli import _parser as ratelimit_parser
from tests.mgmt_api.harness import ADMIN_PASSWORD, MgmtServer, ok
from tests.support.envoy import get_envoyconfig, validate
from tests.support.envoy_protos import parse_bootstrap

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


def envoy_bootstrap() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(ENVOY_YAML.read_text())
    return doc


def envoy_clusters() -> dict[str, tuple[str, int]]:
    out = {}
    for cluster in parse_bootstrap(ENVOY_YAML).static_resources.clusters:
        socket = cluster.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address
        out[cluster.name] = (socket.socket_address.address, socket.socket_address.port_value)
    return out


def upstream_port() -> int:
    argv = command("upstream")
    assert argv[:3] == ["python", "-m", "demo.upstream"]
    return port_of(argv[argv.index("--listen") + 1])


def test_envoy_yaml_passes_envoy_validate() -> None:
    checked = validate(ENVOY_YAML)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_envoy_yaml_is_the_contract_bootstrap_with_the_token_placeholder() -> None:
    """The file is what meshctl gateway bootstrap renders for the compose addresses."""
    plan = seed_script.plan_for(seed_args())
    ratelimit = f"grpc://ratelimit:{port_of(services_args()['ratelimit'].listen)}"
    node = gateway_contract.GatewayNode(
        plan.organization, plan.cluster, "compose-gateway", "0.0.0.0", 10000, "gateway", ratelimit
    )
    expected = gateway_contract.bootstrap(
        node,
        ads=f"grpc://mgmt-api:{port_of(mgmt_api_params()['grpc_listen'])}",
        token=seed_script.TOKEN_PLACEHOLDER,
        admin=("0.0.0.0", 9901),
    )
    assert envoy_bootstrap() == yaml.safe_load(gateway_contract.bootstrap_text(expected))
    assert ENVOY_YAML.read_text().count(f"Bearer {seed_script.TOKEN_PLACEHOLDER}") == 1


def test_every_address_is_a_compose_service_listening_on_that_port() -> None:
    args = services_args()
    mgmt = mgmt_api_params()
    grpc = port_of(mgmt["grpc_listen"])
    listening = {
        "ratelimit": port_of(args["ratelimit"].listen),
        "extauthz": port_of(args["extauthz"].listen),
        "upstream": upstream_port(),
        "mgmt-api": port_of(mgmt["listen"]),
        "redis": 6379,
    }
    # The gateway's one static cluster is mgmt-api's gRPC port (ADS).
    assert envoy_clusters() == {gateway_contract.XDS_CLUSTER: ("mgmt-api", grpc)}
    metadata = envoy_bootstrap()["node"]["metadata"]
    ratelimit = urlsplit(metadata[gateway_contract.RATELIMIT_SERVICE_KEY])
    assert (ratelimit.hostname, ratelimit.port) == ("ratelimit", listening["ratelimit"])
    seed = seed_args()
    plan = seed_script.plan_for(seed)
    for service, parsed in args.items():
        assert parsed.command == "serve" and parsed.config is None, service
        target = control_plane.parse_target(parsed.control_plane)
        assert target.address == f"mgmt-api:{grpc}", service
        assert not target.bare, service  # an explicit scheme, not the deprecated HOST:PORT
        assert parsed.cluster == f"{plan.organization}/{plan.cluster}", service
        # each service its own key, as the seed writes it
        assert parsed.credentials == str(credential_files(Path(seed.credentials_dir))[service])
        assert parsed.workers == 1, service
    url = urlsplit(seed.url)
    assert (url.hostname, url.port) == ("mgmt-api", listening["mgmt-api"])
    extauthz = urlsplit(seed.extauthz_uri)
    assert (extauthz.hostname, extauthz.port) == ("extauthz", listening["extauthz"])
    assert seed.upstream == f"upstream:{listening['upstream']}"
    for redis_url in (seed.redis_url, args["ratelimit"].redis_url):
        assert urlsplit(redis_url).hostname == "redis"
        assert urlsplit(redis_url).port == listening["redis"]


def test_volumes_and_images() -> None:
    services = compose()["services"]
    envoy = services["envoy"]
    assert re.fullmatch(
        r"envoyproxy/envoy:v1\.\d+\.\d+", envoy["image"]
    )  # test_envoy_version: which
    seed = seed_args()
    # The seed fills the template mounted from here and writes it where Envoy reads it.
    assert f"./envoy.yaml:{seed.gateway_template}:ro" in services["seed"]["volumes"]
    bootstrap_dir = str(Path(seed.gateway_bootstrap).parent)
    assert any(v.split(":")[:2] == ["gateway", bootstrap_dir] for v in services["seed"]["volumes"])
    assert f"gateway:{bootstrap_dir}:ro" in envoy["volumes"]
    assert envoy["command"][envoy["command"].index("-c") + 1] == seed.gateway_bootstrap
    assert envoy["user"] == "10001:10001"  # the bootstrap is 0600, owned by the seed's uid
    assert envoy["depends_on"]["seed"] == {"condition": "service_completed_successfully"}
    listener = envoy_bootstrap()["node"]["metadata"][gateway_contract.LISTENER_KEY]
    assert f"127.0.0.1:10000:{listener['port']}" in envoy["ports"]
    admin = envoy_bootstrap()["admin"]["address"]["socket_address"]["port_value"]
    assert f"127.0.0.1:9901:{admin}" in envoy["ports"]
    assert "./seed.py:/seed/seed.py:ro" in services["seed"]["volumes"]
    # The demo package is not in the image (not product): both mount it beside their cwd/script.
    demo_dir = COMPOSE_DIR / "../../demo"
    assert (demo_dir / "seed.py").is_file() and (demo_dir / "upstream.py").is_file()
    assert "../../demo:/seed/demo:ro" in services["seed"]["volumes"]
    assert "../../demo:/seed/demo:ro" in services["upstream"]["volumes"]
    assert services["upstream"]["working_dir"] == "/seed"
    dockerfile = (COMPOSE_DIR.parent / "Dockerfile").read_text()
    assert "COPY demo" not in dockerfile
    assert "/gateway" in services["volumes"]["command"]
    credentials_dir = seed_args().credentials_dir
    for name in ("seed", "ratelimit", "extauthz"):
        assert any(
            v.split(":")[:2] == ["credentials", credentials_dir] for v in services[name]["volumes"]
        ), name
    database = mgmt_api_params()["database"]
    assert database.startswith("sqlite") and any(
        v.startswith("mgmt-data:") and database.endswith(v.split(":")[1] + "/mgmt-api.db")
        for v in services["mgmt-api"]["volumes"]
    )


@dataclass
class Seeded:
    admin: httpx.Client
    plan: Any
    credentials: Path
    bootstrap: Path


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    """A real mgmt-api seeded by the compose seed script, with the gateway bootstrap."""
    server = MgmtServer().start()
    try:
        directory = tmp_path_factory.mktemp("compose")
        credentials, bootstrap = directory / "keys", directory / "envoy.yaml"
        seed = seed_args()
        argv = [
            sys.executable,
            str(COMPOSE_DIR / "seed.py"),
            "--url",
            server.url,
            "--credentials-dir",
            str(credentials),
            "--extauthz-uri",
            seed.extauthz_uri,
            "--redis-url",
            seed.redis_url,
            "--upstream",
            seed.upstream,
            "--gateway-template",
            str(ENVOY_YAML),
            "--gateway-bootstrap",
            str(bootstrap),
        ]
        env = {**os.environ, "MESHPLANE_ADMIN_PASSWORD": ADMIN_PASSWORD}
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        with server.admin() as admin:
            yield Seeded(admin, seed_script.plan_for(seed), credentials, bootstrap)
    finally:
        server.close()


def test_the_seed_writes_the_gateway_bootstrap_with_a_token(seeded: Seeded) -> None:
    assert stat.S_IMODE(seeded.bootstrap.stat().st_mode) == 0o600
    text = seeded.bootstrap.read_text()
    assert f"Bearer {seed_script.TOKEN_PLACEHOLDER}" not in text
    doc = yaml.safe_load(text)
    template = envoy_bootstrap()
    header = doc["dynamic_resources"]["ads_config"]["grpc_services"][0]["initial_metadata"][0]
    token = header["value"].removeprefix("Bearer ")
    gateway_key = credential_files(seeded.credentials)["gateway"]  # the gateway's own key
    key = jwt.PyJWK.from_dict(dict(control_plane.load_credentials(gateway_key).private_jwk))
    claims = jwt.decode(
        token,
        key.key.public_key(),
        algorithms=["ES256"],
        audience=gateway_contract.XDS_AUDIENCE,
    )
    assert claims["exp"] - claims["iat"] == gateway_contract.GATEWAY_TOKEN_TTL_SECONDS
    header["value"] = f"Bearer {seed_script.TOKEN_PLACEHOLDER}"
    assert doc == template  # nothing but the token differs
    checked = validate(seeded.bootstrap)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_seed_routes_the_gateway_to_the_upstream_service(seeded: Seeded) -> None:
    base = seeded.plan.cluster_path
    backend = ok(seeded.admin.get(f"{base}/backends/default.demo"))
    assert backend["spec"]["endpoints"] == [
        {"fqdn": {"hostname": "upstream", "port": upstream_port()}}
    ]
    for name in ("web", "slow"):
        route = ok(seeded.admin.get(f"{base}/httproutes/default.{name}"))
        refs = route["spec"]["rules"][0]["backendRefs"]
        assert [r["name"] for r in refs] == ["demo"], route


def test_what_the_gateway_gets_for_the_seeded_cluster_envoy_accepts(seeded: Seeded) -> None:
    """The seeded cluster's filters and circuit breakers, as ADS renders them, validate."""
    ratelimit = f"grpc://ratelimit:{port_of(services_args()['ratelimit'].listen)}"
    document = get_envoyconfig(
        seeded.admin, seeded.plan.cluster_path, {"rateLimitService": ratelimit}
    )
    # The seed's billing setting has local JWT rules (for its sidecar), so the
    # cluster's gateways carry jwt_authn and rbac too, switched off until a
    # route under local rules switches them on (docs/mesh.md); the seeded JWT
    # policy's path claim is checked inside Envoy (lua) before ext_authz, which
    # decides only what the local check refers (docs/gateway.md).
    assert [f["name"] for f in document["httpFilters"]] == [
        "envoy.filters.http.jwt_authn",
        "envoy.filters.http.rbac",
        "envoy.filters.http.lua",
        "envoy.filters.http.ext_authz",
        "envoy.filters.http.ratelimit",
    ]
    assert document["circuitBreakers"]["thresholds"][0]["maxConnections"] == 2
