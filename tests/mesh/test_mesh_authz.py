"""Authorization at the sidecars (issue 24, items 4-6), through real sidecar Envoys over ADS.

One stack for the module: five workloads, each behind its sidecar, in four
namespaces, and the security objects that select them:

- workspace ``w`` selects ns1, ns2 and ns3; its group ``g1`` selects ns1 and
  ns2 and holds setting ``s`` (the mode under test: callee ``a`` in ns1);
- workspace ``w2`` selects ns4; its group ``g2`` (the workspace's namespaces)
  has the real extauthz service's JWT policy and a setting calling it
  (``http.external``), later local JWT rules instead: callee ``e``;
- no setting selects ns3 (callee ``d``): not checked.

Calls go caller app -> its sidecar's outbound listener -> the callee's
sidecar's inbound listener -> the callee app.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc
from google.rpc import status_pb2
from jwt.algorithms import RSAAlgorithm

from extauthz.cli import mint_demo_token
from meshplane.sidecar_contract import SIDECAR_KIND
from mgmt_api.compiler.mesh_authz import DENIED_HEADER
from tests.meshctl.conftest import Meshctl
from tests.mgmt_api.harness import ADMIN_PASSWORD
from tests.support.gateway import BASE, CLUSTER, CLUSTER_PATH, ORG
from tests.support.mesh import MeshStack, Workload
from tests.support.processes import wait_until

#: Five Envoys, mgmt-api and the services start in the first test's setup:
#: ~50 s on an idle 2-core machine, more under load.
pytestmark = pytest.mark.timeout(300)

SECRET = "mesh-authz-test-hmac-secret-0123456789"
ISSUER = "https://idp.test"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeshStack]:
    stack = MeshStack(Path(tmp_path_factory.mktemp("meshauthz")))
    try:
        names = (("a", "ns1"), ("b", "ns1"), ("c", "ns2"), ("d", "ns3"), ("e", "ns4"))
        stack.workloads_started(*((name, ns, f"sa-{name}") for name, ns in names))
        w = stack.workspace("w", "ns1", "ns2", "ns3")
        stack.setting(stack.group(w, "g1", "ns1", "ns2"), {"mode": "UNSET"})
        g2 = stack.group(stack.workspace("w2", "ns4"), "g2")
        policy = {
            "jwt": {"algorithms": ["HS256"], "keys": [{"hmacSecret": {"value": SECRET}}]},
            "pathClaim": {"name": "path", "match": "PREFIX"},
        }
        stack.put(f"{g2}/extauthzpolicies", "jwt", "extAuthzPolicy", policy)
        external = {"uri": stack.service_uri("extauthz"), "policy": "jwt"}
        stack.setting(g2, {"mode": "UNSET", "http": {"external": external}})
        stack.converged()  # extauthz has the policy too
        stack.sidecars_converged()
        yield stack
    finally:
        stack.close()


def workloads(mesh: MeshStack) -> dict[str, Workload]:
    return {w.name: w for w in mesh.workloads}


def test_ext_authz_at_a_sidecar(mesh: MeshStack) -> None:
    """Good token 200, bad token 403 (the real extauthz decides); ns3 is not checked."""
    w = workloads(mesh)
    g2 = f"{BASE}/tenants/t/workspaces/w2/securitygroups/g2"
    external = {"uri": mesh.service_uri("extauthz"), "policy": "jwt"}
    mesh.setting(g2, {"mode": "UNSET", "http": {"external": external}})
    mesh.sidecars_converged()
    good = mint_demo_token(SECRET, "/", 600)
    assert w["a"].call(w["e"], "/x", good).status_code == 200
    assert w["a"].call(w["e"], "/x", "not-a-token").status_code == 403
    assert w["a"].call(w["e"], "/x").status_code == 403
    assert w["a"].call(w["d"], "/x").status_code == 200  # no setting selects ns3


def _jwks() -> str:
    public = json.loads(RSAAlgorithm.to_jwk(KEY.public_key()))
    return json.dumps({"keys": [{**public, "kid": "k1", "alg": "RS256", "use": "sig"}]})


def _token(**claims: Any) -> str:
    now = int(time.time())
    payload = {"iss": ISSUER, "nbf": now, "exp": now + 600, **claims}
    return jwt.encode(payload, KEY, algorithm="RS256", headers={"kid": "k1"})


def test_local_jwt_rules_at_a_sidecar(mesh: MeshStack) -> None:
    """The sidecar decides alone: one allowed, one refused, and no token is 401."""
    w = workloads(mesh)
    g2 = f"{BASE}/tenants/t/workspaces/w2/securitygroups/g2"
    rules = [{"from": [{"jwt": {"iss": ISSUER, "sub": "alice"}}], "to": [{"paths": ["/api/*"]}]}]
    local = {"rules": rules, "keys": {"jwks": {"value": _jwks()}}}
    before = mesh.sidecars_converged()["desiredVersions"][SIDECAR_KIND]
    mesh.setting(g2, {"mode": "UNSET", "http": {"local": local}})
    assert mesh.sidecars_converged()["desiredVersions"][SIDECAR_KIND] != before
    alice = _token(sub="alice")
    # Caller b has no connection open to e: turning ext_authz off and local
    # rules on changes the listener, and a connection opened before keeps the
    # old filters until Envoy drains it (docs/mesh.md).
    b, e = w["b"], w["e"]
    assert b.call(e, "/api/items", alice).status_code == 200
    assert b.call(e, "/admin", alice).status_code == 403
    assert b.call(e, "/api/items", _token(sub="bob")).status_code == 403
    response = b.call(e, "/api/items")
    assert response.status_code == 401
    assert "www-authenticate" in response.headers
    assert response.headers[DENIED_HEADER].startswith("jwt ")  # the rules refused, not the mode
    dump = e.admin("GET", "/config_dump?resource=dynamic_listeners").text
    assert "envoy.filters.http.ext_authz" not in dump


G1 = f"{BASE}/tenants/t/workspaces/w/securitygroups/g1"


def test_a_mode_change_over_rest_applies_with_no_restart(mesh: MeshStack) -> None:
    """NAMESPACE refuses a caller of another namespace with the reason header;
    DISABLED then admits it on the same connections, once every sidecar ACKed."""
    w = workloads(mesh)
    a, c = w["a"], w["c"]
    pids = {x.name: x.envoy_pid() for x in mesh.workloads}
    before = mesh.sidecars_converged()["desiredVersions"][SIDECAR_KIND]
    mesh.setting(G1, {"mode": "NAMESPACE"})
    status = mesh.sidecars_converged()
    assert status["desiredVersions"][SIDECAR_KIND] != before
    refused = c.call(a)
    assert refused.status_code == 403
    assert refused.headers[DENIED_HEADER] == "mode NAMESPACE"
    # The setting's own status counts the sidecars among what it reaches.
    setting = mesh.admin.get(f"{G1}/settings/s/status").json()
    assert SIDECAR_KIND in setting["reaches"], setting
    (here,) = setting["clusters"]
    sidecars = [i for i in here["instances"] if i["kind"] == SIDECAR_KIND]
    assert len(sidecars) == len(mesh.workloads), here
    assert all(i["upToDate"] and i["lastResult"] == "ACK" for i in sidecars), here
    mesh.setting(G1, {"mode": "DISABLED"})
    mesh.sidecars_converged()
    assert c.call(a).status_code == 200
    assert DENIED_HEADER not in c.call(a).headers
    assert pids == {x.name: x.envoy_pid() for x in mesh.workloads}


def test_the_workloads_view_shows_identities_certificates_state_and_callers(
    mesh: MeshStack, tmp_path: Path
) -> None:
    """``GET .../workloads`` and ``meshctl get workloads``: every sidecar with its
    SPIFFE id, certificate expiry, ACK state and who may call it (mode CUSTOM)."""
    mesh.setting(G1, {"mode": "CUSTOM", "serviceAccounts": ["./sa-b", "ns3/*"]})
    mesh.sidecars_converged()
    view = mesh.admin.get(f"{CLUSTER_PATH}/workloads").json()
    td = view["trustDomain"]
    assert {n["name"]: n["sidecars"] for n in view["namespaces"]} == {
        "ns1": 2, "ns2": 1, "ns3": 1, "ns4": 1,
    }  # fmt: skip
    by_service = {w["service"]: w for w in view["workloads"]}
    assert set(by_service) == {x.name for x in mesh.workloads}
    for x in mesh.workloads:
        row = by_service[x.name]
        assert row["spiffeId"] == x.spiffe_id() == f"spiffe://{td}/ns/{x.namespace}/sa/sa-{x.name}"
        assert row["certificate"]["notAfter"] > row["certificate"]["issueTime"]
        assert not row["certificate"]["expired"]
        assert row["config"]["lastResult"] == "ACK" and row["config"]["upToDate"], row
    assert by_service["a"]["authorization"] == {
        "setting": "organizations/gw/tenants/t/workspaces/w/securitygroups/g1/settings/s",
        "mode": "CUSTOM",
        "principals": [f"spiffe://{td}/ns/ns1/sa/sa-b", f"spiffe://{td}/ns/ns3/sa/*"],
    }
    # e's namespace is g2's, whose setting checks no identity; nothing selects d's.
    assert by_service["e"]["authorization"]["principals"] is None
    assert by_service["d"]["authorization"] == {"setting": None, "mode": None, "principals": None}

    ctl = Meshctl(tmp_path / "home", mesh.admin.base_url.__str__().rstrip("/"))
    ctl.ok(
        "login", "--server", ctl.server, "--username", "admin", "--password-stdin",
        input=ADMIN_PASSWORD + "\n",
    )  # fmt: skip
    table = ctl.ok("get", "workloads", "--org", ORG, "--cluster", CLUSTER)
    assert table.startswith(f"Trust domain: {td}\n")
    (line,) = [row for row in table.splitlines() if "/ns/ns1/sa/sa-a" in row]
    assert "CUSTOM" in line and "ACK" in line and f"spiffe://{td}/ns/ns1/sa/sa-b" in line
    assert json.loads(ctl.ok("get", "workloads", "--cluster", f"{ORG}/{CLUSTER}", "-o", "json"))[
        "workloads"
    ]


#: Callee ``a`` (ns1; group g1: ns1, ns2; workspace w: ns1, ns2, ns3) called by
#: b (ns1), c (ns2), d (ns3, in w but not g1) and e (ns4, another workspace).
MODE_TABLE: list[tuple[dict[str, Any], dict[str, int]]] = [
    ({"mode": "NAMESPACE"}, {"b": 200, "c": 403, "d": 403, "e": 403}),
    ({"mode": "GROUP"}, {"b": 200, "c": 200, "d": 403, "e": 403}),
    ({"mode": "WORKSPACE"}, {"b": 200, "c": 200, "d": 200, "e": 403}),
    ({"mode": "CLUSTER"}, {"b": 200, "c": 200, "d": 200, "e": 200}),
    (
        {"mode": "CUSTOM", "serviceAccounts": ["./sa-b", "ns3/*"]},
        {"b": 200, "c": 403, "d": 200, "e": 403},
    ),
    ({"mode": "DISABLED"}, {"b": 200, "c": 200, "d": 200, "e": 200}),
    ({"mode": "UNSET"}, {"b": 200, "c": 200, "d": 200, "e": 200}),
    ({"mode": "RULES"}, {"b": 403, "c": 403, "d": 403, "e": 403}),
]


@pytest.mark.parametrize(
    ("authorization", "expected"), MODE_TABLE, ids=[m["mode"] for m, _ in MODE_TABLE]
)
def test_each_mode_through_the_sidecars_over_mtls(
    mesh: MeshStack, authorization: dict[str, Any], expected: dict[str, int]
) -> None:
    w = workloads(mesh)
    mesh.setting(G1, authorization)
    mesh.sidecars_converged()
    got = {name: w[name].call(w["a"]) for name in expected}
    assert {name: r.status_code for name, r in got.items()} == expected
    for name, response in got.items():
        if response.status_code == 403:
            assert response.headers[DENIED_HEADER] == f"mode {authorization['mode']}", name
        else:
            assert response.json()["app"] == "a", name


def test_a_group_gaining_a_namespace_admits_it_with_no_restart(mesh: MeshStack) -> None:
    """Membership is an input of the sidecars' compile: a new version, ACKed by all."""
    w = workloads(mesh)
    mesh.setting(G1, {"mode": "GROUP"})
    mesh.sidecars_converged()
    assert w["d"].call(w["a"]).status_code == 403
    w_path = f"{BASE}/tenants/t/workspaces/w"
    try:
        mesh.group(w_path, "g1", "ns1", "ns2", "ns3")
        mesh.sidecars_converged()
        assert w["d"].call(w["a"]).status_code == 200
    finally:
        mesh.group(w_path, "g1", "ns1", "ns2")
        mesh.sidecars_converged()


#: A sidecar Envoy without jwt_authn, as a build lacking a feature would be.
WITHOUT_JWT_AUTHN = ("--disable-extensions", "envoy.filters.http/envoy.filters.http.jwt_authn")


def test_a_nacking_sidecar_shows_its_error_and_keeps_its_last_good_configuration(
    mesh: MeshStack,
) -> None:
    """Local JWT rules reach a sidecar that cannot load jwt_authn: it NACKs
    with Envoy's error in the status and keeps enforcing its mode."""
    w = workloads(mesh)
    g2 = f"{BASE}/tenants/t/workspaces/w2/securitygroups/g2"
    mesh.setting(g2, {"mode": "NAMESPACE"})
    f = mesh.workload("f", "ns4", "sa-f", extra_args=WITHOUT_JWT_AUTHN)
    try:
        mesh.sidecars_converged()
        local = {
            "rules": [{"from": [{"jwt": {"iss": ISSUER}}]}],
            "keys": {"jwks": {"value": _jwks()}},
        }
        mesh.setting(g2, {"mode": "NAMESPACE", "http": {"local": local}})

        def nacked() -> dict[str, Any] | None:
            status = mesh.status()
            (row,) = [i for i in status["instances"] if i["instance"] == "ns4-f"]
            desired = status["desiredVersions"][SIDECAR_KIND]
            return row if row["lastResult"] == "NACK" and row["nackedVersion"] == desired else None

        row = wait_until(nacked, 60, "sidecar f to NACK")
        assert "jwt_authn" in row["lastError"]
        assert row["appliedVersion"] != row["nackedVersion"]
        # The last good configuration: the mode, and no token check.
        refused = w["a"].call(f)
        assert (refused.status_code, refused.headers[DENIED_HEADER]) == (403, "mode NAMESPACE")
        assert w["e"].call(f).status_code == 200
    finally:
        f.stop()
        mesh.workloads.remove(f)


class _RecordingAuthz(external_auth_pb2_grpc.AuthorizationServicer):  # type: ignore[misc]  # envoy's generated module is untyped (Any)
    """A fake ext_authz server: allows every Check and records the caller's principal."""

    def __init__(self) -> None:
        self.principals: list[str] = []

    def Check(
        self, request: external_auth_pb2.CheckRequest, context: grpc.ServicerContext
    ) -> external_auth_pb2.CheckResponse:
        del context
        self.principals.append(request.attributes.source.principal)
        return external_auth_pb2.CheckResponse(
            status=status_pb2.Status(code=0), ok_response=external_auth_pb2.OkHttpResponse()
        )


def test_ext_authz_at_a_sidecar_gets_the_callers_spiffe_id_as_source_principal_fake_server(
    mesh: MeshStack,
) -> None:
    """Envoy fills ``source.principal`` from the caller's mesh certificate (a
    fake Check server records it; the real extauthz has no policy reading it)."""
    w = workloads(mesh)
    fake = _RecordingAuthz()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    external_auth_pb2_grpc.add_AuthorizationServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        g2 = f"{BASE}/tenants/t/workspaces/w2/securitygroups/g2"
        external = {"uri": f"grpc://127.0.0.1:{port}"}
        mesh.setting(g2, {"mode": "UNSET", "http": {"external": external}})
        mesh.sidecars_converged()
        # c has no connection open to e (the listener changed: see the local-rules test).
        assert w["c"].call(w["e"], "/who").status_code == 200
        assert fake.principals == [w["c"].spiffe_id()]
    finally:
        server.stop(grace=None)
