"""HTTPRoute and Backend over REST, and the gateway bootstrap in the install template.

The two kinds are the routes a cluster's gateways serve (issue 17): plain
namespaced kinds (``{namespace}.{name}``) whose ``spec`` is the compiler's
strict model, so a bad manifest is a 400 naming the field as written, and
what is stored is the model's normalised dump. The install template carries
a bootstrap Envoy accepts as it is, whose token opens the ADS stream and
nothing on REST.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import httpx
import jwt
import pytest

from meshplane import gateway_contract
from meshplane.config_error import ConfigError
from mgmt_api.auth import keys as keymod
from mgmt_api.auth.tokens import sign_service_account
from mgmt_api.kinds import cluster as cluster_kind
from mgmt_api.kinds.base import KindSettings
from mgmt_api.store import repo
from tests.mgmt_api.harness import MgmtServer, err, ok
from tests.mgmt_api.test_policy_resources import field_of
from tests.support.envoy import validate

ROUTE: dict[str, Any] = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "HTTPRoute",
    "spec": {
        "parentRefs": [{"name": "gateway"}],
        "hostnames": ["shop.example.com"],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/api"}}],
                "backendRefs": [
                    {"name": "api", "port": 8080, "weight": 3},
                    {"group": "gateway.envoyproxy.io", "kind": "Backend", "name": "legacy"},
                ],
            }
        ],
    },
}
BACKEND: dict[str, Any] = {
    "spec": {"endpoints": [{"ip": {"address": "2001:DB8::0001", "port": 8080}}]},
}


@pytest.fixture
def cluster(admin: httpx.Client, org: str) -> str:
    ok(admin.post(f"/v2/organizations/{org}/clusters", json={"name": "c1", "cluster": {}}))
    return f"/v2/organizations/{org}/clusters/c1"


def edited(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``doc`` with ``value`` at ``path`` (``spec.rules[0].x``)."""
    out = copy.deepcopy(doc)
    *parents, last = path.replace("]", "").replace("[", ".").split(".")
    cursor: Any = out
    for part in parents:
        cursor = cursor[int(part)] if part.isdigit() else cursor[part]
    if last.isdigit():
        cursor[int(last)] = value
    else:
        cursor[last] = value
    return out


@pytest.mark.parametrize(
    ("collection", "body_field", "list_field", "doc", "change"),
    [
        ("httproutes", "httpRoute", "httpRoutes", ROUTE, ("spec.hostnames", ["a.example.com"])),
        (
            "backends",
            "backend",
            "backends",
            BACKEND,
            ("spec.endpoints", [{"fqdn": {"hostname": "legacy.example.com", "port": 80}}]),
        ),
    ],
)
def test_crud_list_labels_and_audit(
    admin: httpx.Client,
    org: str,
    cluster: str,
    collection: str,
    body_field: str,
    list_field: str,
    doc: dict[str, Any],
    change: tuple[str, Any],
) -> None:
    base = f"{cluster}/{collection}"
    created = ok(admin.post(base, json={"name": "shop.web", body_field: doc}))
    item = f"{base}/shop.web"
    assert created["fqn"] == item.removeprefix("/v2/")
    assert created["metadata"] == {"namespace": "shop", "name": "web"}
    err(admin.post(base, json={"name": "shop.web", body_field: doc}), 409)
    got = ok(admin.get(item))
    assert got == created
    updated = ok(admin.put(item, json={**edited(doc, *change), "etag": got["etag"]}))
    assert updated["spec"] == edited(doc, *change)["spec"]
    err(admin.put(item, json={**doc, "etag": got["etag"]}), 409)  # stale etag
    ok(
        admin.post(
            base, json={"name": "other.web", body_field: {**doc, "labels": {"team": "shop"}}}
        )
    )
    page = ok(admin.get(base, params={"pageSize": 1}))
    assert [o["fqn"] for o in page[list_field]] == [f"{base}/other.web".removeprefix("/v2/")]
    rest = ok(admin.get(base, params={"pageToken": page["nextPageToken"]}))
    assert [o["fqn"] for o in rest[list_field]] == [created["fqn"]]
    labelled = ok(admin.get(base, params={"labelSelector": "team=shop"}))[list_field]
    assert [o["metadata"]["namespace"] for o in labelled] == ["other"]
    ok(admin.delete(item))
    err(admin.get(item), 404)
    ops = [
        log["operation"]
        for log in ok(admin.get(f"/v2/organizations/{org}/auditlogs"))["auditLogs"]
        if log["fqn"] == created["fqn"]
    ]
    assert ops == ["DELETE", "UPDATE", "CREATE"]


def test_the_stored_form_is_the_models_normalised_dump(admin: httpx.Client, cluster: str) -> None:
    """apiVersion, kind and metadata filled in, the address normalised, no defaults added."""
    route = ok(
        admin.post(
            f"{cluster}/httproutes",
            json={"name": "shop.web", "httpRoute": {"spec": ROUTE["spec"]}},
        )
    )
    stored = {k: route[k] for k in ("apiVersion", "kind", "metadata", "spec")}
    assert stored == {**ROUTE, "metadata": {"namespace": "shop", "name": "web"}}
    backend = ok(
        admin.post(f"{cluster}/backends", json={"name": "shop.legacy", "backend": BACKEND})
    )
    assert {k: backend[k] for k in ("apiVersion", "kind", "metadata", "spec")} == {
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "Backend",
        "metadata": {"namespace": "shop", "name": "legacy"},
        "spec": {"endpoints": [{"ip": {"address": "2001:db8::1", "port": 8080}}]},
    }
    assert ok(admin.get(f"{cluster}/backends/shop.legacy"))["spec"] == backend["spec"]


RULE = "httpRoute.spec.rules[0]"
REF = f"{RULE}.backendRefs[0]"
ENDPOINT = "backend.spec.endpoints[0]"


@pytest.mark.parametrize(
    ("collection", "body", "field"),
    [
        ("httproutes", edited(ROUTE, "spec.rules[0].backendRefs[0].port", "80"), f"{REF}.port"),
        ("httproutes", edited(ROUTE, "spec.rules[0].backendRefs[0].port", 0), f"{REF}.port"),
        ("httproutes", edited(ROUTE, "spec.rules[0].backendRefs[0].weight", -1), f"{REF}.weight"),
        ("httproutes", edited(ROUTE, "spec.rules[0].filters", []), f"{RULE}.filters"),
        (
            "httproutes",
            edited(ROUTE, "spec.sessionPersistence", {}),
            "httpRoute.spec.sessionPersistence",
        ),
        ("httproutes", edited(ROUTE, "spec.rules[0].backendRefs[0]", {"name": "api"}), REF),
        (
            "httproutes",
            edited(ROUTE, "spec.rules[0].backendRefs[0]", {"kind": "Backend", "name": "legacy"}),
            REF,
        ),
        (
            "httproutes",
            edited(
                ROUTE,
                "spec.rules[0].backendRefs[0]",
                {"group": "example.com", "kind": "Backend", "name": "legacy"},
            ),
            f"{REF}.group",
        ),
        ("httproutes", edited(ROUTE, "spec.rules[0].backendRefs[0].name", "a.b"), f"{REF}.name"),
        (
            "httproutes",
            edited(ROUTE, "spec.rules[0].backendRefs[0].namespace", "Shop"),
            f"{REF}.namespace",
        ),
        ("httproutes", edited(ROUTE, "spec.rules[0].backendRefs", []), f"{RULE}.backendRefs"),
        (
            "httproutes",
            edited(ROUTE, "spec.rules[0].matches[0].path.value", "api"),
            f"{RULE}.matches[0].path.value",
        ),
        (
            "httproutes",
            edited(ROUTE, "spec.rules[0].matches[0].path.value", "/a?b"),
            f"{RULE}.matches[0].path.value",
        ),
        (
            "httproutes",
            edited(ROUTE, "spec.rules[0].matches[0].path.type", "RegularExpression"),
            f"{RULE}.matches[0].path.type",
        ),
        ("httproutes", edited(ROUTE, "spec.hostnames", ["a..b"]), "httpRoute.spec.hostnames"),
        ("httproutes", edited(ROUTE, "spec.rules", []), "httpRoute.spec.rules"),
        ("httproutes", edited(ROUTE, "apiVersion", "v1"), "httpRoute.apiVersion"),
        ("httproutes", edited(ROUTE, "metadata", {"namespace": "other"}), "httpRoute.metadata"),
        ("httproutes", edited(ROUTE, "metadata", {"name": "api"}), "httpRoute.metadata"),
        (
            "backends",
            edited(BACKEND, "spec.endpoints[0].fqdn", {"hostname": "a.example.com", "port": 80}),
            ENDPOINT,
        ),
        ("backends", edited(BACKEND, "spec.endpoints[0]", {}), ENDPOINT),
        ("backends", edited(BACKEND, "spec.endpoints[0].ip.port", "8080"), f"{ENDPOINT}.ip.port"),
        (
            "backends",
            edited(BACKEND, "spec.endpoints[0].ip.address", "10.0.0.300"),
            f"{ENDPOINT}.ip.address",
        ),
        (
            "backends",
            edited(
                BACKEND,
                "spec.endpoints",
                [
                    {"ip": {"address": "10.0.0.1", "port": 80}},
                    {"fqdn": {"hostname": "a.example.com", "port": 80}},
                ],
            ),
            "backend.spec",
        ),
        ("backends", edited(BACKEND, "spec.endpoints", []), "backend.spec.endpoints"),
        ("backends", edited(BACKEND, "metadata", {"name": "other"}), "backend.metadata"),
        ("backends", edited(BACKEND, "kind", "Service"), "backend.kind"),
    ],
    ids=lambda v: v if isinstance(v, str) and "." in v else None,
)
def test_bad_manifests_are_refused_naming_the_field(
    admin: httpx.Client, cluster: str, collection: str, body: dict[str, Any], field: str
) -> None:
    body_field = field.split(".", 1)[0]
    answer = err(
        admin.post(f"{cluster}/{collection}", json={"name": "shop.web", body_field: body}), 400
    )
    assert field_of(answer) == field, answer
    err(admin.get(f"{cluster}/{collection}/shop.web"), 404)


def test_the_object_name_is_namespace_dot_name(admin: httpx.Client, cluster: str) -> None:
    for name in ("web", "shop.web.x", "Shop.web"):
        answer = err(
            admin.post(f"{cluster}/httproutes", json={"name": name, "httpRoute": ROUTE}), 400
        )
        assert field_of(answer) == "name", answer
    err(admin.get(f"{cluster}/httproutes/web"), 400)  # the path is checked the same way


def test_an_update_is_checked_as_a_create_is(admin: httpx.Client, cluster: str) -> None:
    item = f"{cluster}/httproutes/shop.web"
    etag = ok(admin.post(f"{cluster}/httproutes", json={"name": "shop.web", "httpRoute": ROUTE}))[
        "etag"
    ]
    bad = edited(ROUTE, "spec.rules[0].backendRefs[0].port", "80")
    answer = err(admin.put(item, json={**bad, "etag": etag}), 400)
    assert field_of(answer) == "spec.rules[0].backendRefs[0].port", answer  # a PUT body
    assert ok(admin.get(item))["etag"] == etag


# ---- the install template's gateway ------------------------------------------------------


def bootstrap_token(bootstrap: dict[str, Any]) -> str:
    (service,) = bootstrap["dynamic_resources"]["ads_config"]["grpc_services"]
    (header,) = service["initial_metadata"]
    assert header["key"] == "authorization"
    return str(header["value"]).removeprefix("Bearer ")


def test_the_install_template_carries_a_gateway_bootstrap_envoy_accepts(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    created = ok(admin.post(f"/v2/organizations/{org}/clusters", json={"name": "c", "cluster": {}}))
    template = created["installTemplate"]
    assert set(template) == {"message", "helm", "gateway"}
    gateway = template["gateway"]
    assert gateway["ads"] == f"grpc://127.0.0.1:{server.grpc_port}"
    bootstrap = gateway["secrets"]["bootstrap"]
    assert bootstrap["node"]["cluster"] == f"{org}/c"
    result = validate(bootstrap)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    secret = template["helm"]["secrets"]["gatewayServiceAccount"]  # the gateway's own key
    assert secret["serviceAccountFqn"].endswith("/clusters/c/serviceaccounts/gateway")
    token = bootstrap_token(bootstrap)
    assert jwt.get_unverified_header(token)["kid"] == secret["keyId"]
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["aud"] == gateway_contract.XDS_AUDIENCE
    assert claims["sub"] == secret["serviceAccountFqn"]
    assert claims["exp"] - claims["iat"] == gateway_contract.GATEWAY_TOKEN_TTL_SECONDS
    assert gateway["tokenExpireTime"].startswith(time.strftime("%Y", time.gmtime(claims["exp"])))

    # A fresh template (a new key) carries a bootstrap with a token of that key.
    again = ok(
        admin.get(f"/v2/organizations/{org}/clusters/c", params={"includeInstallTemplate": "true"})
    )["installTemplate"]
    new_key = again["helm"]["secrets"]["gatewayServiceAccount"]["keyId"]
    new_token = bootstrap_token(again["gateway"]["secrets"]["bootstrap"])
    assert jwt.get_unverified_header(new_token)["kid"] == new_key != secret["keyId"]


def test_the_gateway_token_is_refused_on_rest(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    """Even where the cluster's tokenTtl would allow its lifetime: the audience decides."""
    base = f"/v2/organizations/{org}/clusters"
    created = ok(admin.post(base, json={"name": "c", "cluster": {}}))
    etag = created["etag"]
    ok(admin.put(f"{base}/c", json={"tokenTtl": "2600000s", "etag": etag}))
    template = created["installTemplate"]
    secret = template["helm"]["secrets"]["gatewayServiceAccount"]
    ttl = gateway_contract.GATEWAY_TOKEN_TTL_SECONDS
    rest_token = sign_service_account(
        json.loads(secret["jwk"]), secret["serviceAccountFqn"], time.time(), ttl
    )
    with server.client(headers={"Authorization": f"Bearer {rest_token}"}) as agent:
        # the same key and lifetime without the audience: authenticated (403, not 401:
        # the gateway's account holds no role)
        err(agent.get(f"{base}/c"), 403)
    gateway_token = bootstrap_token(template["gateway"]["secrets"]["bootstrap"])
    with server.client(headers={"Authorization": f"Bearer {gateway_token}"}) as gateway:
        answer = err(gateway.get(f"{base}/c"), 401, "UNAUTHENTICATED")
        assert "gateway" in answer["message"] or "stream" in answer["message"], answer


def test_the_ads_address_defaults_to_the_public_host_and_the_grpc_port() -> None:
    public = "https://mgmt.example.com:8443/"
    assert KindSettings(grpc_listen="0.0.0.0:8444").ads_url(public) == (
        "grpc://mgmt.example.com:8444"
    )
    assert KindSettings(grpc_listen="[::]:8444", grpc_tls=True).ads_url("http://[::1]:80/") == (
        "grpcs://[::1]:8444"
    )
    explicit = KindSettings(grpc_public_url="grpcs://xds.example.com:443", grpc_listen="x:1")
    assert explicit.ads_url(public) == "grpcs://xds.example.com:443"
    assert KindSettings(grpc_listen=None).ads_url(public) is None  # no gRPC port
    assert KindSettings(grpc_listen="127.0.0.1:0").ads_url(public) is None  # known once bound
    with pytest.raises(ConfigError, match="MESHPLANE_GRPC_PUBLIC_URL"):
        KindSettings(grpc_public_url="https://xds.example.com")


def test_a_grpcs_ads_address_renders_a_tls_bootstrap_envoy_accepts() -> None:
    """With TLS on the gRPC port the bootstrap checks mgmt-api's certificate (the
    system bundle unless told otherwise) and sends SNI; Envoy accepts it as it is."""
    fqn = "organizations/o/clusters/east"
    res = repo.new_resource(fqn, "Cluster", {}, revision=1, creator="users/admin")
    gateway = cluster_kind.gateway_template(
        "grpcs://mgmt.example.com:8444", res, f"{fqn}/serviceaccounts/gateway", keymod.generate()
    )
    bootstrap = gateway["secrets"]["bootstrap"]
    (xds,) = bootstrap["static_resources"]["clusters"]
    tls = xds["transport_socket"]["typed_config"]
    assert tls["sni"] == "mgmt.example.com"
    trusted = tls["common_tls_context"]["validation_context"]["trusted_ca"]["filename"]
    assert trusted == cluster_kind.GATEWAY_CA_FILE and trusted in gateway["message"]
    result = validate(bootstrap)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
