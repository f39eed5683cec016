"""Fields and operations that grant access need SET_POLICY (issue 22 item 1).

The rows are the kinds' declared :class:`~mgmt_api.kinds.base.AccessGrant`
list, read from the registry: each row runs with a writer, an editor and an
admin (bound on the organization, or on the RBAC node for roles), and the
outcome each must get is derived from the row's permission and the built-in
roles. A row declared without a request here fails
``test_every_declared_grant_has_a_request``, and one missing from the table
in docs/api.md fails ``test_the_docs_table_lists_every_grant``. The two
reproductions of the issue run with Basic users, as reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from mgmt_api.domain import cluster_accounts, rbac
from mgmt_api.kinds import KINDS
from mgmt_api.kinds.base import AccessGrant
from mgmt_api.kinds.user import OIDC_BINDING_LABEL
from tests.mgmt_api.harness import MgmtServer, err, ok, unique
from tests.mgmt_api.rbac_helpers import bound_account, grant

GRANTS: list[AccessGrant] = [g for k in KINDS.values() for g in k.behaviour.grants]
ROLES = ("rbac/writer", "rbac/editor", "rbac/admin")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"


@dataclass(frozen=True)
class Place:
    """One organization per server with an object of each kind a row changes."""

    org: str
    role: str  # a custom role, for the Role rows

    @property
    def o(self) -> str:
        return f"organizations/{self.org}"


@dataclass(frozen=True)
class Attempt:
    """A request, what must not change when it is refused, and the permission the
    request needs anyway (WRITE for an update, CREATE for a create)."""

    method: str
    path: str
    body: Any
    state: Callable[[], Any]
    generic: str = rbac.WRITE


Request = Callable[[httpx.Client, Place, str], Attempt]  # (admin, place, caller FQN)


def _put(path_of: Callable[[Place], str], change: Callable[[dict[str, Any], str], None]) -> Request:
    def make(admin: httpx.Client, p: Place, caller: str) -> Attempt:
        path = "/v2/" + path_of(p)
        body = ok(admin.get(path))
        change(body, caller)
        return Attempt("PUT", path, body, lambda: ok(admin.get(path))["etag"])

    return make


def _join(body: dict[str, Any], caller: str) -> None:
    body["members"] = [*body.get("members", []), caller]


def _set(field: str, value: Callable[[], Any]) -> Callable[[dict[str, Any], str], None]:
    return lambda body, _: body.update({field: value()})


def _bind_label(body: dict[str, Any], _: str) -> None:
    labels = body.get("labels") or {}
    body["labels"] = {**labels, OIDC_BINDING_LABEL: labels.get(OIDC_BINDING_LABEL, "") + "x"}


def _widen_rules(body: dict[str, Any], _: str) -> None:
    body["rules"] = [*body["rules"], {"permissions": [rbac.WRITE]}]


def _keys_of(admin: httpx.Client, sa_path: str) -> Callable[[], Any]:
    return lambda: sorted(k["id"] for k in ok(admin.get(sa_path))["keys"])


def _new_key(admin: httpx.Client, p: Place, _: str) -> Attempt:
    sa = f"/v2/{p.o}/serviceaccounts/sa"
    return Attempt("POST", f"{sa}/keys", None, _keys_of(admin, sa), rbac.READ)


def _revoke_key(admin: httpx.Client, p: Place, _: str) -> Attempt:
    sa = f"/v2/{p.o}/serviceaccounts/sa"
    key = ok(admin.post(f"{sa}/keys"))["id"]
    return Attempt("DELETE", f"{sa}/keys/{key}", None, _keys_of(admin, sa), rbac.READ)


def _create_cluster(admin: httpx.Client, p: Place, _: str) -> Attempt:
    body = {"name": unique("c"), "cluster": {}}
    clusters = f"/v2/{p.o}/clusters"

    def names() -> Any:
        return sorted(
            c["fqn"] for c in ok(admin.get(clusters, params={"pageSize": 1000}))["clusters"]
        )

    return Attempt("POST", clusters, body, names, rbac.CREATE)


def _install_template(account: str) -> Request:
    """The template mints a key of each of the cluster's accounts: ``account``'s must not
    change when the request is refused."""

    def make(admin: httpx.Client, p: Place, _: str) -> Attempt:
        path = f"/v2/{p.o}/clusters/c?includeInstallTemplate=true"
        sa = f"/v2/{p.o}/clusters/c/serviceaccounts/{account}"
        return Attempt("GET", path, None, _keys_of(admin, sa), rbac.READ)

    return make


def _add_issuer(body: dict[str, Any], _: str) -> None:
    """A workload token issuer (public EC key) the caller would have proven workloads with."""
    jwk = {"kty": "EC", "crv": "P-256", "kid": unique("k")}
    jwk |= {
        "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
        "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0",
    }
    issuers = (body.get("workloadIdentity") or {}).get("issuers") or []
    issuer = {"issuer": f"https://{unique('iss')}.example", "jwks": {"keys": [jwk]}}
    body["workloadIdentity"] = {"issuers": [*issuers, issuer]}


def _exists(admin: httpx.Client, path: str) -> Callable[[], Any]:
    return lambda: admin.get(path).status_code


def _create_named(collection: str, body_field: str, name_it: Callable[..., None]) -> Request:
    """Create an object under a name a binding or team already holds (as after a delete)."""

    def make(admin: httpx.Client, p: Place, _: str) -> Attempt:
        name = unique("named")
        fqn = f"{p.o}/{collection}/{name}"
        name_it(admin, p, fqn)
        body = {"name": name, body_field: {}}
        path = f"/v2/{p.o}/{collection}"
        return Attempt("POST", path, body, _exists(admin, f"/v2/{fqn}"), rbac.CREATE)

    return make


def _bound_on_org(subject: str) -> Callable[..., None]:
    return lambda admin, p, fqn: grant(admin, p.o, rbac.ADMIN_ROLE, {subject: fqn})


def _listed_by_team(admin: httpx.Client, p: Place, fqn: str) -> None:
    team = ok(admin.get(f"/v2/{p.o}/teams/tm"))
    ok(admin.put(f"/v2/{p.o}/teams/tm", json={**team, "members": [*team.get("members", []), fqn]}))


def _user(p: Place) -> str:
    return f"{p.o}/users/bob"


# One request per declared row, keyed as the registry names it: (kind, name).
REQUESTS: dict[tuple[str, str], Request] = {
    ("Team", "create while a policy names it"): _create_named(
        "teams", "team", _bound_on_org("team")
    ),
    ("User", "create while a policy or team names it"): _create_named(
        "users", "user", _listed_by_team
    ),
    ("ServiceAccount", "create while a policy or team names it"): _create_named(
        "serviceaccounts", "serviceAccount", _bound_on_org("serviceAccount")
    ),
    ("Team", "members"): _put(lambda p: f"{p.o}/teams/tm", _join),
    ("User", "password"): _put(_user, _set("password", lambda: unique("password"))),
    ("User", "email"): _put(_user, _set("email", lambda: f"{unique('m')}@example.test")),
    ("User", f"labels.{OIDC_BINDING_LABEL}"): _put(_user, _bind_label),
    ("User", "loginName"): _put(_user, _set("loginName", lambda: unique("login"))),
    ("Role", "rules"): _put(lambda p: p.role, _widen_rules),
    ("ServiceAccount", "new key (POST .../keys; creating the account mints its first)"): _new_key,
    ("ServiceAccount", "revoke a key (DELETE .../keys/{keyId})"): _revoke_key,
    ("Cluster", "workloadIdentity.issuers"): _put(lambda p: f"{p.o}/clusters/c", _add_issuer),
    **{
        ("Cluster", f"create (creates the {a.name} account, mints its key)"): _create_cluster
        for a in cluster_accounts.ACCOUNTS
    },
    **{
        ("Cluster", f"GET ?includeInstallTemplate=true (mints a key of the {a.name} account)"): (
            _install_template(a.name)
        )
        for a in cluster_accounts.ACCOUNTS
    },
}


def _grant_node(g: AccessGrant, p: Place) -> str:
    """Where the row's roles are bound: the RBAC node for roles, else the organization."""
    return "rbac" if g.kind == "Role" else p.o


@pytest.fixture(scope="module")
def places() -> dict[str, Place]:
    return {}


@pytest.fixture
def place(server: MgmtServer, admin: httpx.Client, places: dict[str, Place]) -> Place:
    if server.url not in places:
        p = Place(unique("org"), f"rbac/{unique('role')}")
        ok(admin.post("/v2/organizations", json={"name": p.org, "organization": {}}))
        ok(admin.post(f"/v2/{p.o}/teams", json={"name": "tm", "team": {}}))
        ok(admin.post(f"/v2/{p.o}/users", json={"name": "bob", "user": {"loginName": "bob"}}))
        ok(admin.post(f"/v2/{p.o}/serviceaccounts", json={"name": "sa", "serviceAccount": {}}))
        ok(admin.post(f"/v2/{p.o}/clusters", json={"name": "c", "cluster": {}}))
        role = {"rules": [{"permissions": [rbac.READ]}]}
        ok(admin.post("/v2/rbac", json={"name": p.role.removeprefix("rbac/"), "role": role}))
        places[server.url] = p
    return places[server.url]


@pytest.fixture
def principal(
    server: MgmtServer, admin: httpx.Client, place: Place
) -> Callable[[str, str], tuple[str, httpx.Client]]:
    """A service account bound ``role`` on ``node``: (its FQN, a client signed in as it).

    Service-account JWTs keep the table fast (no Argon2 per row); the
    reproductions below use Basic users.
    """

    def make(role: str, node: str) -> tuple[str, httpx.Client]:
        return bound_account(server, admin, place.org, role, node)

    return make


def _cases() -> Iterator[Any]:
    for g in GRANTS:
        for role in ROLES:
            yield pytest.param(g, role, id=f"{g.kind}:{g.name}:{role}")


def test_every_declared_grant_has_a_request() -> None:
    assert {(g.kind, g.name) for g in GRANTS} == set(REQUESTS)


@pytest.mark.parametrize(("g", "role"), list(_cases()))
def test_access_granting_change_needs_its_permission(
    admin: httpx.Client,
    place: Place,
    principal: Callable[[str, str], tuple[str, httpx.Client]],
    g: AccessGrant,
    role: str,
) -> None:
    caller, client = principal(role, _grant_node(g, place))
    attempt = REQUESTS[g.kind, g.name](admin, place, caller)
    held = {p for rule in rbac.BUILTIN_ROLES[role] for p in rule.permissions}
    missing = next((p for p in (attempt.generic, g.permission) if p not in held), None)
    before = attempt.state()
    with client:
        response = client.request(attempt.method, attempt.path, json=attempt.body)
    if missing is None:
        ok(response)
        assert attempt.state() != before, "an allowed change must take effect"
    else:
        body = err(response, 403, "PERMISSION_DENIED")
        assert body["details"][0]["metadata"]["permission"] == missing
        assert attempt.state() == before, "a refused change must change nothing"


def test_the_docs_table_lists_every_grant() -> None:
    text = DOCS.read_text()
    for g in GRANTS:
        row = f"| {g.kind} | `{g.name}` | {g.permission} | {g.on} | {g.why} |"
        assert row in text, f"docs/api.md lacks the row:\n{row}"


# ---- the reproductions, as reported (Basic users) -------------------------------------


def _basic_user(admin: httpx.Client, server: MgmtServer, org: str, name: str) -> httpx.Client:
    password = "user-password-1"
    user = {"loginName": name, "password": password}
    ok(admin.post(f"/v2/organizations/{org}/users", json={"name": name, "user": user}))
    return server.client(auth=(f"{org}/{name}", password))


def test_writer_cannot_join_a_team_the_root_policy_binds_admin(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    other = unique("org")
    ok(admin.post("/v2/organizations", json={"name": other, "organization": {}}))
    team = f"organizations/{org}/teams/platform"
    ok(admin.post(f"/v2/organizations/{org}/teams", json={"name": "platform", "team": {}}))
    grant(admin, "", rbac.ADMIN_ROLE, {"team": team})
    me = f"organizations/{org}/users/wr"
    with _basic_user(admin, server, org, "wr") as wr:
        grant(admin, f"organizations/{org}", "rbac/writer", {"user": me})
        before = ok(wr.get(f"/v2/{team}"))
        joined = {"etag": before["etag"], "members": [me]}
        err(wr.put(f"/v2/{team}", json=joined), 403, "PERMISSION_DENIED")
        assert ok(admin.get(f"/v2/{team}")) == before
        err(wr.get(f"/v2/organizations/{other}"), 403)
        err(wr.get("/v2/admin/root/policy"), 403)


def test_editor_cannot_join_an_org_admin_team_nor_reset_a_password(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    base = f"/v2/organizations/{org}"
    team = f"organizations/{org}/teams/admins"
    ok(admin.post(f"{base}/teams", json={"name": "admins", "team": {}}))
    grant(admin, f"organizations/{org}", rbac.ADMIN_ROLE, {"team": team})
    me = f"organizations/{org}/users/ed"
    with (
        _basic_user(admin, server, org, "victim") as victim,
        _basic_user(admin, server, org, "ed") as ed,
    ):
        grant(admin, f"organizations/{org}", "rbac/editor", {"user": me})
        before = ok(ed.get(f"/v2/{team}"))
        err(
            ed.put(f"/v2/{team}", json={"etag": before["etag"], "members": [me]}),
            403,
            "PERMISSION_DENIED",
        )
        assert ok(admin.get(f"/v2/{team}")) == before
        user = ok(ed.get(f"{base}/users/victim"))
        reset = {**user, "password": "taken-over-1"}
        err(ed.put(f"{base}/users/victim", json=reset), 403, "PERMISSION_DENIED")
        ok(victim.post("/v2/auth/token"))  # the old password still works
    with server.client(auth=(f"{org}/victim", "taken-over-1")) as attacker:
        err(attacker.post("/v2/auth/token"), 401)


def test_recreating_a_clusters_agent_account_needs_the_organizations_set_policy(
    admin: httpx.Client,
    place: Place,
    principal: Callable[[str, str], tuple[str, httpx.Client]],
) -> None:
    """A cluster's policy binds its agent: whoever recreates the account holds the
    agent's grants, so its key is minted as the install template's is."""
    cluster = f"{place.o}/clusters/{unique('c')}"
    ok(
        admin.post(
            f"/v2/{place.o}/clusters", json={"name": cluster.rsplit("/", 1)[1], "cluster": {}}
        )
    )
    ok(admin.delete(f"/v2/{cluster}/serviceaccounts/agent"))
    create = {"name": "agent", "serviceAccount": {}}
    _, cluster_admin = principal(rbac.ADMIN_ROLE, cluster)
    with cluster_admin:
        err(cluster_admin.post(f"/v2/{cluster}/serviceaccounts", json=create), 403)
    err(admin.get(f"/v2/{cluster}/serviceaccounts/agent"), 404)
    _, org_admin = principal(rbac.ADMIN_ROLE, place.o)
    with org_admin:
        ok(org_admin.post(f"/v2/{cluster}/serviceaccounts", json=create))
