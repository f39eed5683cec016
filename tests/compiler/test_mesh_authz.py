"""Pure table tests of the sidecar authorization compiler (``mgmt_api.compiler.mesh_authz``).

Each mode is compiled for a callee and the resulting RBAC filter, parsed into
Envoy's own protos, is evaluated against callers' SPIFFE ids with Envoy's
exact/prefix semantics for ``authenticated.principal_name``; the through-Envoy
tables are in ``tests/mesh/test_mesh_authz.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2
from envoy.extensions.access_loggers.stream.v3 import stream_pb2  # noqa: F401 (decision lines)
from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2 as jwt_pb2  # noqa: F401
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2  # noqa: F401 (mTLS on inbound)

from meshplane.sidecar_contract import SidecarNode
from mgmt_api.compiler import envoy_config, mesh_authz, sidecar_xds
from tests.support.envoy_protos import parse, parse_typed, unpack

TD = "c1.org.mesh.local"
JWKS = '{"keys": []}'
LOCAL = {"rules": [{"from": [{"jwt": {"iss": "https://idp"}}]}], "keys": {"jwks": {"value": JWKS}}}


def setting(mode: str, **kw: object) -> mesh_authz.MeshSetting:
    """The setting of group ``g`` (namespaces ns1, ns2 and ``team-*``) of a
    workspace selecting ns1, ns2 and ns3."""
    base: dict[str, object] = {
        "setting": "s/g",
        "mode": mode,
        "namespaces": ("ns1", "ns2", "team-*"),
        "workspace_namespaces": ("ns1", "ns2", "ns3"),
    }
    return mesh_authz.MeshSetting(**{**base, **kw})  # type: ignore[arg-type]


def _matches(matcher: object, principal: str) -> bool:
    m = matcher.authenticated.principal_name  # type: ignore[attr-defined]
    kind = m.WhichOneof("match_pattern")
    return bool(
        (kind == "exact" and principal == m.exact)
        or (kind == "prefix" and principal.startswith(m.prefix))
    )


def admits(rbac: rbac_pb2.RBAC | None, principal: str) -> bool:
    """Envoy's verdict on a caller with URI SAN ``principal`` (the mode's one
    DENY policy: ``any``, or ``not_id`` of an ``or_ids`` of principal names)."""
    if rbac is None:
        return True
    assert rbac.rules.action == rbac_pb2.RBAC().rules.DENY
    for policy in rbac.rules.policies.values():
        for p in policy.principals:
            if p.any:
                return False
            if not any(_matches(i, principal) for i in p.not_id.or_ids.ids):
                return False
    return True


def compiled(s: mesh_authz.MeshSetting, namespace: str = "ns1") -> rbac_pb2.RBAC | None:
    out = mesh_authz.mode_route_config(s, TD, namespace)
    if out is None:
        return None
    rbac = parse_typed(out, rbac_pb2.RBACPerRoute()).rbac
    assert list(rbac.rules.policies) == [f"mode-{s.mode}"]  # named in the 403's details
    assert rbac.rules_stat_prefix == mesh_authz.MODE_STAT_PREFIX
    return rbac


def sa(namespace: str, account: str, domain: str = TD) -> str:
    return f"spiffe://{domain}/ns/{namespace}/sa/{account}"


CALLERS = {
    "same ns": sa("ns1", "b"),
    "group ns": sa("ns2", "c"),
    "group prefix ns": sa("team-x", "d"),
    "workspace ns": sa("ns3", "e"),
    "ns1 look-alike": sa("ns10", "f"),
    "other ns": sa("ns4", "g"),
    "other trust domain": sa("ns1", "b", "other.mesh.local"),
}
ALL = set(CALLERS)
NOT_FOREIGN = ALL - {"other trust domain"}


@pytest.mark.parametrize(
    ("s", "admitted"),
    [
        (setting("NAMESPACE"), {"same ns"}),
        (setting("GROUP"), {"same ns", "group ns", "group prefix ns"}),
        (setting("GROUP", namespaces=("*",)), NOT_FOREIGN),
        (setting("WORKSPACE"), {"same ns", "group ns", "workspace ns"}),
        (setting("CLUSTER"), NOT_FOREIGN),
        (
            setting("CUSTOM", service_accounts=("./b", "ns3/*", "ns4/nobody")),
            {"same ns", "workspace ns"},
        ),
        (setting("CUSTOM", service_accounts=("./*",)), {"same ns"}),
        (setting("DISABLED"), ALL),
        (setting("UNSET"), ALL),
        (setting("RULES"), set()),  # not modelled: refused, never opened
    ],
    ids=lambda v: v.mode if isinstance(v, mesh_authz.MeshSetting) else "",
)
def test_what_each_mode_admits(s: mesh_authz.MeshSetting, admitted: set[str]) -> None:
    rbac = compiled(s)
    got = {name for name, principal in CALLERS.items() if admits(rbac, principal)}
    assert got == admitted


def test_custom_dot_is_the_callee_namespace() -> None:
    s = setting("CUSTOM", service_accounts=("./*",))
    assert admits(compiled(s, "ns2"), sa("ns2", "x"))
    assert not admits(compiled(s, "ns2"), sa("ns1", "x"))


@pytest.mark.parametrize(
    ("patterns", "namespace", "selected"),
    [
        (("ns1",), "ns1", True),
        (("ns1",), "ns10", False),
        (("*",), "anything", True),
        (("team-*",), "team-a", True),
        (("team-*",), "team", False),
        ((), "ns1", False),
    ],
)
def test_namespace_selection(patterns: tuple[str, ...], namespace: str, selected: bool) -> None:
    assert envoy_config.namespace_selected(patterns, namespace) is selected


def test_the_first_setting_by_name_that_selects_the_namespace_applies() -> None:
    b = setting("CLUSTER", setting="s/b", namespaces=("ns1",))
    a = setting("NAMESPACE", setting="s/a", namespaces=("ns*",))
    assert mesh_authz.setting_for([b, a], "ns1") == a
    assert mesh_authz.setting_for([b, a], "other") is None


KNOBS = envoy_config.GatewaySettings(ext_authz_timeout="0.050s")


def _route(s: mesh_authz.MeshSetting, **kw: object) -> envoy_config.ExtAuthzRoute:
    fields: dict[str, object] = {
        "setting": s.setting,
        "group": "g",
        "namespaces": s.namespaces,
        "uri": "grpc://authz:9191",
        "policy": "w.g.jwt",
    }
    return envoy_config.ExtAuthzRoute(**{**fields, **kw})  # type: ignore[arg-type]


def node(namespace: str = "ns1") -> SidecarNode:
    return SidecarNode("org", "c1", "i1", namespace, "sa", "svc", 8080, "127.0.0.1", 15006, 15001)


Inbound = tuple[list[str], hcm_pb2.HttpConnectionManager, route_components_pb2.Route]


def inbound(inp: sidecar_xds.SidecarInput, namespace: str = "ns1") -> Inbound:
    """The inbound listener's filter names and HCM and its route, parsed whole
    (every typed config resolved), and its clusters checked."""
    resources = sidecar_xds.compile_sidecar(inp, node(namespace))
    for cluster in resources.clusters:
        parse(cluster, cluster_pb2.Cluster())
    doc = next(x for x in resources.listeners if x["name"] == sidecar_xds.INBOUND_LISTENER)
    listener = parse(doc, listener_pb2.Listener())
    hcm = unpack(listener.filter_chains[0].filters[0].typed_config, hcm_pb2.HttpConnectionManager())
    assert hcm.rds.route_config_name == sidecar_xds.INBOUND_ROUTES
    (routes,) = [
        parse(r, route_pb2.RouteConfiguration())
        for r in resources.route_configurations
        if r["name"] == sidecar_xds.INBOUND_ROUTES
    ]
    return [f.name for f in hcm.http_filters], hcm, routes.virtual_hosts[0].routes[0]


ROUTER = "envoy.filters.http.router"


def test_mode_then_ext_authz_on_the_inbound_listener_with_the_reason_header() -> None:
    s = setting("NAMESPACE")
    s = dataclasses.replace(s, ext_authz=_route(s))
    inp = sidecar_xds.SidecarInput("c1", trust_domain=TD, settings=(s,), knobs=KNOBS)
    names, hcm, route = inbound(inp)
    assert names == [mesh_authz.MODE_FILTER, envoy_config.EXT_AUTHZ_FILTER, ROUTER]
    mapper = hcm.local_reply_config.mappers[0]
    header = mapper.headers_to_add[0].header
    assert header.key == mesh_authz.DENIED_HEADER
    assert header.value == "mode %METADATA(ROUTE:meshplane:mode)%"
    assert route.metadata.filter_metadata["meshplane"]["mode"] == "NAMESPACE"
    cel = unpack(mapper.filter.extension_filter.typed_config, cel_pb2.ExpressionFilter())
    assert "rbac_access_denied_matched_policy[mode-" in cel.expression
    assert set(route.typed_per_filter_config) == {
        mesh_authz.MODE_FILTER,
        envoy_config.EXT_AUTHZ_FILTER,
    }
    assert hcm.normalize_path.value and hcm.merge_slashes
    clusters = sidecar_xds.compile_sidecar(inp, node()).clusters
    (authz,) = [c for c in clusters if c["name"] == "extauthz"]
    endpoint = authz["loadAssignment"]["endpoints"][0]["lbEndpoints"][0]["endpoint"]
    assert endpoint["address"]["socketAddress"] == {"address": "authz", "portValue": 9191}


def test_a_mode_change_is_a_route_change_not_a_listener_change() -> None:
    """So it applies to open connections (RDS), not only to new ones."""
    one = sidecar_xds.SidecarInput("c1", trust_domain=TD, settings=(setting("NAMESPACE"),))
    other = dataclasses.replace(one, settings=(setting("CUSTOM", service_accounts=("ns2/x",)),))
    a = sidecar_xds.compile_sidecar(one, node())
    b = sidecar_xds.compile_sidecar(other, node())
    assert a.listeners == b.listeners
    assert a.route_configurations != b.route_configurations


def test_local_rules_at_the_sidecar_use_the_gateway_compiler() -> None:
    s = setting("UNSET")
    s = dataclasses.replace(s, ext_authz=_route(s, uri="", policy=None, local=LOCAL))
    inp = sidecar_xds.SidecarInput("c1", trust_domain=TD, settings=(s,))
    names, _, route = inbound(inp)
    jwt_authn, rbac = "envoy.filters.http.jwt_authn", "envoy.filters.http.rbac"
    assert names == [mesh_authz.MODE_FILTER, jwt_authn, rbac, ROUTER]
    assert set(route.typed_per_filter_config) == {jwt_authn, rbac}


def test_an_unselected_namespace_is_not_checked() -> None:
    s = setting("NAMESPACE")
    s = dataclasses.replace(s, ext_authz=_route(s))
    inp = sidecar_xds.SidecarInput("c1", trust_domain=TD, settings=(s,))
    names, _, route = inbound(inp, "elsewhere")
    assert names == [mesh_authz.MODE_FILTER, ROUTER]  # the mode filter has no rules
    assert not route.typed_per_filter_config


def test_disabled_turns_ext_authz_off_too() -> None:
    s = setting("DISABLED")
    s = dataclasses.replace(s, ext_authz=_route(s, disabled=True))
    inp = sidecar_xds.SidecarInput("c1", trust_domain=TD, settings=(s,))
    names, _, route = inbound(inp)
    assert names == [mesh_authz.MODE_FILTER, ROUTER]
    assert not route.typed_per_filter_config


def test_membership_and_mode_are_in_the_sidecar_version() -> None:
    """A group or workspace gaining a namespace must reach the sidecars (new version)."""
    base = sidecar_xds.SidecarInput("c1", trust_domain=TD, settings=(setting("GROUP"),))
    changes = [
        dataclasses.replace(base, settings=(setting("GROUP", namespaces=("ns1",)),)),
        dataclasses.replace(base, settings=(setting("GROUP", workspace_namespaces=("ns1",)),)),
        dataclasses.replace(base, settings=(setting("WORKSPACE"),)),
        dataclasses.replace(base, settings=(setting("CUSTOM", service_accounts=("ns1/a",)),)),
        dataclasses.replace(base, trust_domain="other"),
        dataclasses.replace(base, knobs=KNOBS),
    ]
    versions = {base.version(), *(c.version() for c in changes)}
    assert len(versions) == 1 + len(changes)
    assert base.version() == dataclasses.replace(base).version()
