"""``GET /v2/dashboards`` and ``GET /v2/dashboards/{name}`` on a real mgmt-api.

The dashboards are the package's own files (their content and metrics are
pinned by tests/dashboards); these tests pin what the REST layer adds:
authentication, the listing shape, byte-for-byte bodies and 404.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx

from mgmt_api.dashboards import get_dashboard, list_dashboards
from tests.mgmt_api.harness import MgmtServer, err, ok


def test_the_listing_names_every_shipped_dashboard(admin: httpx.Client) -> None:
    listed = ok(admin.get("/v2/dashboards"))["dashboards"]
    assert listed == list_dashboards()
    assert {d["name"] for d in listed} >= {"extauthz", "ratelimit", "mgmt-api"}
    assert all(d["description"] for d in listed)


def test_a_dashboard_is_served_as_shipped(admin: httpx.Client) -> None:
    for entry in ok(admin.get("/v2/dashboards"))["dashboards"]:
        response = admin.get(f"/v2/dashboards/{entry['name']}")
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        assert response.content == get_dashboard(entry["name"])
        assert json.loads(response.content)["description"] == entry["description"]


def test_an_unknown_dashboard_is_not_found(admin: httpx.Client) -> None:
    err(admin.get("/v2/dashboards/nope"), 404, "NOT_FOUND")
    err(admin.get("/v2/dashboards/..%2Fapprovals"), 404)


def test_dashboards_need_credentials_and_nothing_more(
    server: MgmtServer, org: str, make_user: Callable[..., httpx.Client]
) -> None:
    with server.client() as anonymous:
        err(anonymous.get("/v2/dashboards"), 401, "UNAUTHENTICATED")
        err(anonymous.get("/v2/dashboards/extauthz"), 401, "UNAUTHENTICATED")
    with make_user(org) as user_without_roles:
        ok(user_without_roles.get("/v2/dashboards"))
        ok(user_without_roles.get("/v2/dashboards/extauthz"))
