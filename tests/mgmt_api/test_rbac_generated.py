"""Every generated endpoint x {no credentials, wrong role, right role}.

The routes of each kind are generated from ``mgmt_api.kinds``; this table is
generated from the same registry, so a new kind is covered the moment it is
added: for every path at which a kind lives it checks list, create, get,
update, delete, policy get/put and permissions.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from mgmt_api import fqn as fqnmod
from mgmt_api.auth.tokens import sign_service_account
from mgmt_api.kinds import KINDS, item_templates, parent_templates
from tests.mgmt_api.harness import MgmtServer, err, ok, unique
from tests.mgmt_api.rbac_helpers import grant
from tests.mgmt_api.test_rbac import POLICY_SPECS, World, build_world

CREATE_SPEC: dict[str, dict[str, Any]] = {
    "Workspace": {"namespaceSelector": {"names": ["*/*"]}},
    "Role": {"rules": [{"permissions": ["READ"]}]},
    "BackendTrafficPolicy": POLICY_SPECS["BackendTrafficPolicy"],
    "ExtAuthzPolicy": POLICY_SPECS["ExtAuthzPolicy"],
    "HTTPRoute": POLICY_SPECS["HTTPRoute"],
    "Backend": POLICY_SPECS["Backend"],
    "ClusterOnboardingConfig": {
        "namespaces": [{"name": "ns", "desiredState": "DESIRED_ONBOARDED"}]
    },
}
# At most one object of these kinds per parent: create and delete rows make
# room first, and put the world's object back afterwards.
SINGLETONS = {"ClusterOnboardingConfig"}


def _new_name(kind: str) -> str:
    """A fresh object name; namespaced kinds are named ``{namespace}.{name}``."""
    namespaced = KINDS[kind].collection in fqnmod.NAMESPACED
    return f"default.{unique('n')}" if namespaced else unique("n")


@dataclass(frozen=True)
class Row:
    id: str
    op: str  # list | create | get | put | delete | get-policy | put-policy | permissions
    kind: str
    parent_tpl: str
    item_tpl: str


def _rows() -> Iterator[Row]:
    for kdef in KINDS.values():
        for ptpl, itpl in zip(parent_templates(kdef.kind), item_templates(kdef.kind), strict=True):
            for op in (
                "list",
                "create",
                "get",
                "put",
                "delete",
                "get-policy",
                "put-policy",
                "permissions",
            ):
                yield Row(f"{op}:{itpl}", op, kdef.kind, ptpl, itpl)


ROWS = list(_rows())


def _fill(tpl: str, w: World, role: str) -> str:
    values = {
        "organization": w.org,
        "tenant": "t",
        "workspace": "w",
        "securitygroup": "g",
        "cluster": "c",
        "team": "tm",
        "role": role.split("/", 1)[1],
        "backendtrafficpolicy": "default.p",
        "httproute": "default.p",
        "backend": "default.p",
        "setting": "s",
        "extauthzpolicy": "p",
        "profile": "pr",
        "onboarding": "ob",
    }
    if tpl.endswith("{serviceaccount}"):
        values["serviceaccount"] = "agent" if "/clusters/" in tpl else "sa"
    if tpl.endswith("{user}"):
        values["user"] = "bob" if tpl.startswith("organizations/") else "admin"
    return re.sub(r"{(\w+)}", lambda m: values[m.group(1)], tpl)


def _signed_in(server: MgmtServer, account: tuple[Any, str]) -> httpx.Client:
    """A client with a fresh token of the service account (private JWK, FQN)."""
    token = sign_service_account(account[0], account[1], time.time(), 600)
    return server.client(headers={"Authorization": f"Bearer {token}"})


@pytest.fixture(scope="module")
def worlds() -> dict[str, tuple[World, str]]:
    return {}


#: A service account's private JWK and FQN, by (server, its one grant or None).
Principals = dict[tuple[str, tuple[str, str] | None], tuple[Any, str]]


@pytest.fixture(scope="module")
def principals() -> Principals:
    """Service accounts made for the rows: one holding a given single grant (or
    none) is the same principal for every row that asks for it, so each is made
    once per server (three requests) rather than once per row."""
    return {}


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_generated_endpoint_permissions(
    server: MgmtServer,
    admin: httpx.Client,
    worlds: dict[str, tuple[World, str]],
    principals: Principals,
    row: Row,
) -> None:
    if server.url not in worlds:
        w = build_world(admin)
        for level in ("", "/tenants/t", "/tenants/t/workspaces/w"):  # a Profile "pr" per level
            ok(admin.post(f"/v2/{w.o}{level}/profiles", json={"name": "pr", "profile": {}}))
        onboarding = CREATE_SPEC["ClusterOnboardingConfig"]
        ok(
            admin.post(
                f"/v2/{w.o}/clusters/c/onboarding", json={"name": "ob", "config": onboarding}
            )
        )
        role = f"rbac/{unique('role')}"
        ok(
            admin.post(
                "/v2/rbac", json={"name": role[5:], "role": {"rules": [{"permissions": ["READ"]}]}}
            )
        )
        worlds[server.url] = (w, role)
    w, role = worlds[server.url]
    kdef = KINDS[row.kind]
    parent = _fill(row.parent_tpl, w, role)
    item = _fill(row.item_tpl, w, role)
    collection = "/v2/" + (
        f"{parent}/{kdef.collection}" if parent not in ("", "rbac") else kdef.collection
    )
    in_org = item.startswith("organizations/")
    elsewhere = w.other if in_org else w.o  # a grant that must not help

    def principal(grant_: tuple[str, str] | None) -> httpx.Client:
        key = (server.url, grant_)
        if key not in principals:
            created = ok(
                admin.post(
                    f"/v2/{w.o}/serviceaccounts",
                    json={"name": unique("p"), "serviceAccount": {}},
                    params={"keyEncoding": "JWK"},
                )
            )
            if grant_ is not None:
                grant(admin, grant_[1], grant_[0], {"serviceAccount": created["fqn"]})
            account = (json.loads(created["keys"][0]["privateKey"]), created["fqn"])
            if row.kind in SINGLETONS:  # deleted and made again: a grant on it goes with it
                return _signed_in(server, account)
            principals[key] = account
        return _signed_in(server, principals[key])

    def make_room() -> None:
        if row.kind in SINGLETONS:
            for obj in ok(admin.get(collection))[kdef.list_field]:
                ok(admin.delete(f"/v2/{obj['fqn']}"))

    def disposable() -> str:
        make_room()
        name = _new_name(row.kind)
        ok(
            admin.post(
                collection, json={"name": name, kdef.body_field: CREATE_SPEC.get(row.kind, {})}
            )
        )
        return f"{collection}/{name}"

    request: Callable[[], tuple[str, str, Any]]
    right: tuple[str, str]
    wrong: tuple[str, str] | None
    if row.op == "list":
        request = lambda: ("GET", f"{collection}?pageSize=1000", None)  # noqa: E731
        right, wrong = ("rbac/reader", parent), None
    elif row.op == "create":

        def body() -> dict[str, Any]:
            make_room()
            return {"name": _new_name(row.kind), kdef.body_field: CREATE_SPEC.get(row.kind, {})}

        request = lambda: ("POST", collection, body())  # noqa: E731
        right = ("rbac/admin" if row.kind == "Cluster" else "rbac/creator", parent)
        wrong = ("rbac/reader", parent)
    elif row.op == "get":
        request, right, wrong = (
            (lambda: ("GET", f"/v2/{item}", None)),
            ("rbac/reader", item),
            ("rbac/reader", elsewhere),
        )
    elif row.op == "put":
        request = lambda: ("PUT", f"/v2/{item}", ok(admin.get(f"/v2/{item}")))  # noqa: E731
        right, wrong = ("rbac/writer", item), ("rbac/reader", item)
    elif row.op == "delete":
        request = lambda: ("DELETE", disposable(), None)  # noqa: E731
        right, wrong = ("rbac/admin", parent), ("rbac/editor", parent)
    elif row.op == "get-policy":
        request = lambda: ("GET", f"/v2/{item}/policy", None)  # noqa: E731
        right, wrong = ("rbac/reader", item), ("rbac/reader", elsewhere)
    elif row.op == "put-policy":
        request = lambda: ("PUT", f"/v2/{item}/policy", ok(admin.get(f"/v2/{item}/policy")))  # noqa: E731
        right, wrong = ("rbac/admin", item), ("rbac/editor", item)
    else:  # permissions: any authenticated principal may ask about itself
        request, right, wrong = (
            (lambda: ("GET", f"/v2/{item}/permissions", None)),
            ("rbac/reader", item),
            None,
        )

    def attempt(client: httpx.Client) -> httpx.Response:
        method, path, body_ = request()
        return client.request(method, path, json=body_)

    with server.client() as anonymous:
        err(attempt(anonymous), 401, "UNAUTHENTICATED")
    if row.op == "list":
        with principal(None) as nobody:  # lists are filtered, not refused
            listed = ok(attempt(nobody))[kdef.list_field]
            assert listed == [], listed
    elif row.op == "permissions":
        with principal(None) as nobody:
            assert ok(attempt(nobody))["rules"] == []
    elif wrong is not None:
        with principal(wrong) as c:
            body_ = err(attempt(c), 403, "PERMISSION_DENIED")
            assert body_["details"][0]["metadata"]["permission"] in body_["message"]
    with principal(right) as c:
        result = ok(attempt(c))
        if row.op == "list":
            assert any(o["fqn"] == item for o in result[kdef.list_field])
    if row.kind in SINGLETONS and row.op in ("create", "delete"):
        make_room()
        name = item.rsplit("/", 1)[1]
        spec = CREATE_SPEC.get(row.kind, {})
        ok(admin.post(collection, json={"name": name, kdef.body_field: spec}))
