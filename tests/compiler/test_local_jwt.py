"""Pure table tests of the local JWT compiler, each output parsed into Envoy's protos."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2 as jwt_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2  # noqa: F401 (registers the Any type)

from mgmt_api.compiler.local_jwt import JWT_AUTHN_FILTER, RBAC_FILTER, compile_local_jwt
from tests.support.envoy_protos import parse, parse_typed

JWKS = '{"keys": []}'
RULE = {"from": [{"jwt": {"iss": "https://idp", "sub": "alice", "other": {"team": "ops"}}}]}


def _local(**overrides: Any) -> dict[str, Any]:
    return {"rules": [RULE], "keys": {"jwks": {"value": JWKS}}, **overrides}


def _checked(local: dict[str, Any]) -> tuple[jwt_pb2.JwtAuthentication, rbac_pb2.RBACPerRoute]:
    """Compile ``local`` and parse every piece, so a misspelt field fails here."""
    out = compile_local_jwt("s1", local)
    assert [f["name"] for f in out.http_filters] == [JWT_AUTHN_FILTER, RBAC_FILTER]
    jwt = parse_typed(out.http_filters[0]["typedConfig"], jwt_pb2.JwtAuthentication())
    global_rbac = parse_typed(out.http_filters[1]["typedConfig"], rbac_pb2.RBAC())
    assert not global_rbac.HasField("rules"), "the listener-wide RBAC must not enforce"
    assert not jwt.rules, "only routes that select the requirement verify tokens"
    per_jwt = parse_typed(out.per_route[JWT_AUTHN_FILTER], jwt_pb2.PerRouteConfig())
    assert per_jwt.requirement_name == "s1"
    for cluster in out.clusters:
        parse(cluster, cluster_pb2.Cluster())
    return jwt, parse_typed(out.per_route[RBAC_FILTER], rbac_pb2.RBACPerRoute())


def test_claims_become_and_of_metadata_matchers_on_the_verified_payload() -> None:
    jwt, per_rbac = _checked(_local())
    provider = jwt.providers["s1"]
    assert provider.payload_in_metadata == "jwt_payload" and not provider.forward
    assert provider.local_jwks.inline_string == JWKS
    policy = per_rbac.rbac.rules.policies["rule-0"]
    ids = policy.principals[0].and_ids.ids
    got = {(m.metadata.path[1].key, m.metadata.value.string_match.exact) for m in ids}
    assert got == {("iss", "https://idp"), ("sub", "alice"), ("team", "ops")}
    assert all(m.metadata.filter == JWT_AUTHN_FILTER for m in ids)
    assert policy.permissions[0].any  # no ``to``: any path and method
    assert per_rbac.rbac.rules.action == 0  # ALLOW


def _pattern(matcher: Any) -> tuple[str, str]:
    kind = matcher.WhichOneof("match_pattern")
    return kind, getattr(matcher, kind)


@pytest.mark.parametrize(
    ("target", "paths", "methods"),
    [
        ({"paths": ["/admin"]}, [("exact", "/admin")], []),
        ({"paths": ["/api/*"]}, [("prefix", "/api/")], []),
        ({"methods": ["GET", "HEAD"]}, [], ["GET", "HEAD"]),
        (
            {"paths": ["/a", "/b/*"], "methods": ["POST"]},
            [("exact", "/a"), ("prefix", "/b/")],
            ["POST"],
        ),
    ],
)
def test_to_becomes_paths_and_methods(
    target: dict[str, Any], paths: list[tuple[str, str]], methods: list[str]
) -> None:
    _, per_rbac = _checked(_local(rules=[{**RULE, "to": [target]}]))
    rules = per_rbac.rbac.rules.policies["rule-0"].permissions[0].and_rules.rules
    matchers = [r for group in rules for r in group.or_rules.rules]
    got_paths = [_pattern(r.url_path.path) for r in matchers if r.HasField("url_path")]
    got_methods = [r.header.string_match.exact for r in matchers if r.HasField("header")]
    assert got_paths == paths and got_methods == methods


@pytest.mark.parametrize(
    ("keys", "skew", "remote", "tls"),
    [
        ({"pem": "-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----"}, 0, None, False),
        ({"jwks": {"uri": "https://idp.example:8443/jwks"}}, 30, ("idp.example", 8443), True),
        ({"jwks": {"uri": "http://127.0.0.1/jwks"}}, 5, ("127.0.0.1", 80), False),
    ],
)
def test_key_sources_and_clock_skew(
    keys: dict[str, Any], skew: int, remote: tuple[str, int] | None, tls: bool
) -> None:
    out = compile_local_jwt("s1", _local(keys=keys, clockSkew=skew))
    jwt, _ = _checked(_local(keys=keys, clockSkew=skew))
    provider = jwt.providers["s1"]
    assert provider.clock_skew_seconds == max(1, skew)  # 0 would mean Envoy's 60 s
    if remote is None:
        assert provider.local_jwks.inline_string == keys["pem"] and not out.clusters
        return
    assert provider.remote_jwks.http_uri.cluster == out.clusters[0]["name"]
    cluster = parse(out.clusters[0], cluster_pb2.Cluster())
    address = cluster.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (address.address, address.port_value) == remote
    assert cluster.HasField("transport_socket") == tls
