"""Special endpoints x {no credentials, wrong role, right role}, table-driven.

Each row names the request, the grant that must be enough (right role) and a
grant that must not be (wrong role). The plain CRUD/policy/permissions
endpoints of every kind are covered by test_rbac_generated; the rows here are
the endpoints with their own rules (cluster create needs SET_POLICY on the
organization, install templates, passwords, keys, global policies, audit;
test_access_grants covers each access-granting field with three roles)
and grants inherited from an ancestor. Rows run against both stores.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from mgmt_api.auth.tokens import sign_service_account
from tests.mgmt_api.harness import MgmtServer, err, ok, unique
from tests.mgmt_api.rbac_helpers import grant


@dataclass
class World:
    org: str
    other_org: str

    @property
    def o(self) -> str:
        return f"organizations/{self.org}"

    @property
    def other(self) -> str:
        return f"organizations/{self.other_org}"


# Minimal valid bodies of the policy kinds (issue 5), shared with the generated table.
POLICY_SPECS: dict[str, dict[str, Any]] = {
    "BackendTrafficPolicy": {
        "spec": {
            "targetRef": {"name": "web"},
            "rateLimit": {"global": {"rules": [{"limit": {"requests": 1, "unit": "Hour"}}]}},
        }
    },
    "ExtAuthzPolicy": {
        "jwt": {
            "algorithms": ["HS256"],
            "keys": [{"hmacSecret": {"value": "rbac-test-secret-of-32-bytes-or-more"}}],
        }
    },
    "HTTPRoute": {"spec": {"rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}},
    "Backend": {"spec": {"endpoints": [{"ip": {"address": "10.0.0.1", "port": 8080}}]}},
}


def build_world(admin: httpx.Client) -> World:
    w = World(unique("org"), unique("org"))
    for name in (w.org, w.other_org):
        ok(admin.post("/v2/organizations", json={"name": name, "organization": {}}))
        base = f"/v2/organizations/{name}"
        ok(admin.post(f"{base}/tenants", json={"name": "t", "tenant": {}}))
        ok(
            admin.post(
                f"{base}/tenants/t/workspaces",
                json={"name": "w", "workspace": {"namespaceSelector": {"names": ["c/ns"]}}},
            )
        )
        ok(
            admin.post(
                f"{base}/tenants/t/workspaces/w/securitygroups",
                json={"name": "g", "securityGroup": {}},
            )
        )
        ok(admin.post(f"{base}/clusters", json={"name": "c", "cluster": {}}))
        group = f"{base}/tenants/t/workspaces/w/securitygroups/g"
        ok(
            admin.post(
                f"{base}/clusters/c/backendtrafficpolicies",
                json={
                    "name": "default.p",
                    "backendTrafficPolicy": POLICY_SPECS["BackendTrafficPolicy"],
                },
            )
        )
        for collection, body_field, kind in (
            ("httproutes", "httpRoute", "HTTPRoute"),
            ("backends", "backend", "Backend"),
        ):
            ok(
                admin.post(
                    f"{base}/clusters/c/{collection}",
                    json={"name": "default.p", body_field: POLICY_SPECS[kind]},
                )
            )
        ok(admin.post(f"{group}/settings", json={"name": "s", "securitySetting": {}}))
        ok(
            admin.post(
                f"{group}/extauthzpolicies",
                json={"name": "p", "extAuthzPolicy": POLICY_SPECS["ExtAuthzPolicy"]},
            )
        )
        ok(admin.post(f"{base}/teams", json={"name": "tm", "team": {}}))
        ok(admin.post(f"{base}/serviceaccounts", json={"name": "sa", "serviceAccount": {}}))
        ok(admin.post(f"{base}/users", json={"name": "bob", "user": {}}))
    return w


Setup = Callable[[httpx.Client, World], tuple[str, str, Any]]  # -> (method, path, json)


def etag_body(path: str, **changes: Any) -> Callable[[httpx.Client, World], tuple[str, str, Any]]:
    def setup(admin: httpx.Client, w: World) -> tuple[str, str, Any]:
        p = path.format(o=w.o)
        return "PUT", "/v2/" + p, {**ok(admin.get("/v2/" + p)), **changes}

    return setup


def req(method: str, path: str, body: Any = None) -> Setup:
    def setup(admin: httpx.Client, w: World) -> tuple[str, str, Any]:
        b = body() if callable(body) else body
        return method, "/v2/" + path.format(o=w.o), b

    return setup


def disposable(kind_path: str, body_key: str, extra: dict[str, Any] | None = None) -> Setup:
    """DELETE of a freshly created child so each attempt has a target."""

    def setup(admin: httpx.Client, w: World) -> tuple[str, str, Any]:
        name = unique("d")
        ok(admin.post("/v2/" + kind_path.format(o=w.o), json={"name": name, body_key: extra or {}}))
        return "DELETE", f"/v2/{kind_path.format(o=w.o)}/{name}", None

    return setup


def policy_put(fqn_tpl: str) -> Setup:
    def setup(admin: httpx.Client, w: World) -> tuple[str, str, Any]:
        fqn = fqn_tpl.format(o=w.o)
        path = {"": "/v2/admin/root/policy", "rbac": "/v2/admin/rbac/policy"}.get(
            fqn, f"/v2/{fqn}/policy"
        )
        return "PUT", path, ok(admin.get(path))

    return setup


def new_key() -> Setup:
    def setup(admin: httpx.Client, w: World) -> tuple[str, str, Any]:
        key = ok(admin.post(f"/v2/{w.o}/serviceaccounts/sa/keys"))
        return "DELETE", f"/v2/{w.o}/serviceaccounts/sa/keys/{key['id']}", None

    return setup


def new(prefix: str, key: str, spec: dict[str, Any] | None = None) -> Callable[[], dict[str, Any]]:
    return lambda: {"name": unique(prefix), key: spec or {}}


# (id, request, right grant (role, fqn template), wrong grant (role, fqn template) or None)
ROWS: list[tuple[str, Setup, tuple[str, str], tuple[str, str] | None]] = [
    (
        "delete-org",
        disposable("organizations", "organization"),
        ("rbac/admin", ""),
        ("rbac/admin", "{o}"),
    ),
    (
        "create-org",
        req("POST", "organizations", new("o", "organization")),
        ("rbac/creator", ""),
        ("rbac/admin", "{o}"),
    ),
    (
        "delete-tenant",
        disposable("{o}/tenants", "tenant"),
        ("rbac/admin", "{o}"),
        ("rbac/editor", "{o}"),
    ),
    (
        "get-workspace",
        req("GET", "{o}/tenants/t/workspaces/w"),
        ("rbac/reader", "{o}/tenants/t"),
        ("rbac/reader", "OTHER"),
    ),
    (
        "create-workspace",
        req(
            "POST",
            "{o}/tenants/t/workspaces",
            new("w", "workspace", {"namespaceSelector": {"names": ["*/*"]}}),
        ),
        ("rbac/creator", "{o}/tenants/t"),
        ("rbac/reader", "{o}/tenants/t"),
    ),
    (
        "put-group",
        etag_body("{o}/tenants/t/workspaces/w/securitygroups/g", configMode="BRIDGED"),
        ("rbac/writer", "{o}"),
        ("rbac/reader", "{o}"),
    ),
    (
        "create-cluster",
        req("POST", "{o}/clusters", new("c", "cluster")),
        ("rbac/admin", "{o}"),
        ("rbac/editor", "{o}"),
    ),
    (
        "install-template",
        req("GET", "{o}/clusters/c?includeInstallTemplate=true"),
        ("rbac/admin", "{o}"),
        ("rbac/admin", "{o}/clusters/c"),
    ),
    (
        "delete-cluster",
        disposable("{o}/clusters", "cluster"),
        ("rbac/admin", "{o}"),
        ("rbac/editor", "{o}"),
    ),
    (
        "cluster-config",
        req("POST", "{o}/clusters/c/config"),
        ("rbac/reader", "{o}/clusters/c"),
        ("rbac/reader", "OTHER"),
    ),
    (
        "set-password",
        etag_body("{o}/users/bob", password="new-password-1"),
        ("rbac/admin", "{o}/users/bob"),
        ("rbac/writer", "{o}/users/bob"),
    ),
    (
        "sa-new-key",
        req("POST", "{o}/serviceaccounts/sa/keys"),
        ("rbac/admin", "{o}/serviceaccounts/sa"),
        ("rbac/editor", "{o}/serviceaccounts/sa"),
    ),
    (
        "sa-jwks",
        req("GET", "{o}/serviceaccounts/sa/jwks"),
        ("rbac/reader", "{o}/serviceaccounts/sa"),
        ("rbac/reader", "OTHER"),
    ),
    ("audit-logs", req("GET", "{o}/auditlogs"), ("rbac/reader", "{o}"), ("rbac/reader", "OTHER")),
    ("get-root-policy", req("GET", "admin/root/policy"), ("rbac/admin", ""), ("rbac/admin", "{o}")),
    ("put-root-policy", policy_put(""), ("rbac/admin", ""), ("rbac/editor", "")),
    (
        "sa-delete-key",
        new_key(),
        ("rbac/admin", "{o}/serviceaccounts/sa"),
        ("rbac/writer", "{o}/serviceaccounts/sa"),
    ),
    (
        "agent-new-key",
        req("POST", "{o}/clusters/c/serviceaccounts/agent/keys"),
        ("rbac/admin", "{o}"),
        ("rbac/admin", "{o}/clusters/c"),
    ),
    ("put-rbac-policy", policy_put("rbac"), ("rbac/admin", "rbac"), ("rbac/admin", "{o}")),
    (
        "get-rbac-policy",
        req("GET", "admin/rbac/policy"),
        ("rbac/admin", "rbac"),
        ("rbac/admin", "{o}"),
    ),
    (
        "create-role",
        req("POST", "rbac", new("role", "role", {"rules": [{"permissions": ["READ"]}]})),
        ("rbac/creator", "rbac"),
        ("rbac/admin", "{o}"),
    ),
]


@pytest.fixture(scope="module")
def worlds() -> dict[str, World]:
    return {}


@pytest.mark.parametrize(("row_id", "setup", "right", "wrong"), ROWS, ids=[r[0] for r in ROWS])
def test_endpoint_permissions(
    server: MgmtServer,
    admin: httpx.Client,
    worlds: dict[str, World],
    row_id: str,
    setup: Setup,
    right: tuple[str, str],
    wrong: tuple[str, str] | None,
) -> None:
    key = server.url
    if key not in worlds:
        worlds[key] = build_world(admin)
    w = worlds[key]

    def user_with(grant_: tuple[str, str] | None) -> httpx.Client:
        # Service-account principals (JWT signed with their key) keep the
        # table fast: no Argon2 hashing per row. Basic users are covered by
        # the team/creator tests below and test_identity.
        name = unique("p")
        created = ok(
            admin.post(
                f"/v2/{w.o}/serviceaccounts",
                json={"name": name, "serviceAccount": {}},
                params={"keyEncoding": "JWK"},
            )
        )
        if grant_ is not None:
            role, fqn_tpl = grant_
            fqn = w.other if fqn_tpl == "OTHER" else fqn_tpl.format(o=w.o)
            grant(admin, fqn, role, {"serviceAccount": created["fqn"]})
        private = json.loads(created["keys"][0]["privateKey"])
        token = sign_service_account(private, created["fqn"], time.time(), 600)
        return server.client(headers={"Authorization": f"Bearer {token}"})

    def attempt(client: httpx.Client) -> httpx.Response:
        method, path, body = setup(admin, w)
        return client.request(method, path, json=body)

    with server.client() as anonymous:
        err(attempt(anonymous), 401, "UNAUTHENTICATED")
    with user_with(wrong) as c:
        body = err(attempt(c), 403, "PERMISSION_DENIED")
        assert body["message"].startswith("missing permission ")
        meta = body["details"][0]["metadata"]
        assert meta["permission"] in body["message"] and meta["fqn"] in body["message"]
    with user_with(right) as c:
        ok(attempt(c))


def test_team_members_get_team_grants(
    server: MgmtServer, admin: httpx.Client, org: str, make_user: Callable[..., httpx.Client]
) -> None:
    with make_user(org, "carol") as carol:
        err(carol.get(f"/v2/organizations/{org}"), 403)
        ok(
            admin.post(
                f"/v2/organizations/{org}/teams",
                json={"name": "ops", "team": {"members": [f"organizations/{org}/users/carol"]}},
            )
        )
        grant(
            admin, f"organizations/{org}", "rbac/reader", {"team": f"organizations/{org}/teams/ops"}
        )
        ok(carol.get(f"/v2/organizations/{org}"))
        perms = ok(carol.get(f"/v2/organizations/{org}/permissions"))
        assert perms["rules"] == [{"permissions": ["READ"]}]
        err(carol.post(f"/v2/organizations/{org}/tenants", json={"name": "t", "tenant": {}}), 403)


def test_creator_gets_admin_on_what_it_creates(
    admin: httpx.Client, org: str, make_user: Callable[..., httpx.Client]
) -> None:
    with make_user(org, "dave") as dave:
        grant(
            admin,
            f"organizations/{org}",
            "rbac/creator",
            {"user": f"organizations/{org}/users/dave"},
        )
        ok(dave.post(f"/v2/organizations/{org}/tenants", json={"name": "mine", "tenant": {}}))
        perms = ok(dave.get(f"/v2/organizations/{org}/tenants/mine/permissions"))
        assert perms["rules"][0]["permissions"] == [
            "READ",
            "WRITE",
            "CREATE",
            "DELETE",
            "SET_POLICY",
        ]
        ok(dave.delete(f"/v2/organizations/{org}/tenants/mine"))


def test_lists_are_filtered_by_read_permission(
    admin: httpx.Client, org: str, make_user: Callable[..., httpx.Client]
) -> None:
    for name in ("a", "b", "c"):
        ok(admin.post(f"/v2/organizations/{org}/clusters", json={"name": name, "cluster": {}}))
    with make_user(org, "erin") as erin:
        assert ok(erin.get(f"/v2/organizations/{org}/clusters"))["clusters"] == []
        grant(
            admin,
            f"organizations/{org}/clusters/b",
            "rbac/reader",
            {"user": f"organizations/{org}/users/erin"},
        )
        names = [c["fqn"] for c in ok(erin.get(f"/v2/organizations/{org}/clusters"))["clusters"]]
        assert names == [f"organizations/{org}/clusters/b"]


def test_custom_roles_limit_kinds(
    admin: httpx.Client, org: str, make_user: Callable[..., httpx.Client]
) -> None:
    role = unique("cr")
    ok(
        admin.post(
            "/v2/rbac",
            json={
                "name": role,
                "role": {
                    "rules": [
                        {
                            "types": [{"apiGroup": "api.meshplane.io/v2", "kinds": ["Cluster"]}],
                            "permissions": ["READ"],
                        }
                    ]
                },
            },
        )
    )
    ok(admin.post(f"/v2/organizations/{org}/clusters", json={"name": "c", "cluster": {}}))
    ok(admin.post(f"/v2/organizations/{org}/tenants", json={"name": "t", "tenant": {}}))
    with make_user(org, "fay") as fay:
        grant(
            admin,
            f"organizations/{org}",
            f"rbac/{role}",
            {"user": f"organizations/{org}/users/fay"},
        )
        ok(fay.get(f"/v2/organizations/{org}/clusters/c"))
        err(fay.get(f"/v2/organizations/{org}/tenants/t"), 403)
    err(admin.put("/v2/rbac/admin", json={"etag": "x", "rules": []}), 400, "FAILED_PRECONDITION")
    err(admin.delete("/v2/rbac/reader"), 400, "FAILED_PRECONDITION")
    body = err(
        admin.put(
            f"/v2/organizations/{org}/policy",
            json={
                "etag": ok(admin.get(f"/v2/organizations/{org}/policy"))["etag"],
                "allow": [{"role": "rbac/nope", "subjects": []}],
            },
        ),
        400,
    )
    assert body["message"].startswith("allow[0].role")
    ok(admin.delete(f"/v2/rbac/{role}"))


def test_root_policy_cannot_lose_its_last_admin(admin: httpx.Client) -> None:
    policy = ok(admin.get("/v2/admin/root/policy"))
    body = err(admin.put("/v2/admin/root/policy", json={"etag": policy["etag"], "allow": []}), 400)
    assert "rbac/admin" in body["message"]
    ok(admin.get("/v2/admin/root/policy"))
