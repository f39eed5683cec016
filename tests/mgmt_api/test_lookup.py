"""Service lookup: selector patterns over agent reports, filtered by READ."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from mgmt_api.domain.listing import encode_token
from mgmt_api.domain.lookup import matches
from tests.mgmt_api.agents import agent, create_cluster, namespace, report
from tests.mgmt_api.harness import MgmtServer, err, ok, unique
from tests.mgmt_api.rbac_helpers import grant

LOOKUP = "/v2/lookup/services"


@pytest.mark.parametrize(
    ("pattern", "cluster", "ns", "hit"),
    [
        ("east/shop", "east", "shop", True),
        ("east/shop", "west", "shop", False),
        ("east/shop", "east", "shop-v2", False),
        ("*/shop", "west", "shop", True),
        ("east/*", "east", "anything", True),
        ("east/shop*", "east", "shop-v2", True),
        ("east/shop*", "east", "shop", True),
        ("east/shop*", "east", "sho", False),
        ("*/*", "any", "thing", True),
    ],
)
def test_pattern_semantics(pattern: str, cluster: str, ns: str, hit: bool) -> None:
    assert matches(pattern, cluster, ns) is hit


@pytest.fixture
def reported(server: MgmtServer, admin: httpx.Client, org: str) -> str:
    """east: shop{cart,web}, shop-v2{cart}, payments{pay}; west: shop{cart}."""
    east = create_cluster(admin, org, "east")
    west = create_cluster(admin, org, "west")
    with agent(server, east) as a:
        ok(
            report(
                a,
                east,
                namespace("shop", "cart", "web"),
                namespace("shop-v2", "cart"),
                namespace("payments", "pay"),
            )
        )
    with agent(server, west) as a:
        ok(report(a, west, namespace("shop", "cart")))
    return org


def _hits(client: httpx.Client, parent: str, *names: str) -> list[str]:
    body = ok(client.post(LOOKUP, json={"parent": parent, "selector": {"names": list(names)}}))
    return sorted(
        f"{s['fqn'].split('/')[3]}/{s['namespace']}/{s['shortName']}" for s in body["services"]
    )


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["east/shop"], ["east/shop/cart", "east/shop/web"]),
        (["*/shop"], ["east/shop/cart", "east/shop/web", "west/shop/cart"]),
        (["east/shop*"], ["east/shop-v2/cart", "east/shop/cart", "east/shop/web"]),
        (["west/*"], ["west/shop/cart"]),
        (["east/payments", "west/*"], ["east/payments/pay", "west/shop/cart"]),
        (
            ["*/*"],
            [
                "east/payments/pay",
                "east/shop-v2/cart",
                "east/shop/cart",
                "east/shop/web",
                "west/shop/cart",
            ],
        ),
        (["north/*", "*/nothing"], []),
    ],
)
def test_selector_hits(
    admin: httpx.Client, reported: str, names: list[str], expected: list[str]
) -> None:
    assert _hits(admin, f"organizations/{reported}", *names) == expected


def test_registered_service_shape(admin: httpx.Client, reported: str) -> None:
    body = ok(
        admin.post(
            LOOKUP,
            json={"parent": f"organizations/{reported}", "selector": {"names": ["west/shop"]}},
        )
    )
    assert body["services"] == [
        {
            "fqn": f"organizations/{reported}/clusters/west/namespaces/shop/services/cart",
            "cluster": f"organizations/{reported}/clusters/west",
            "namespace": "shop",
            "shortName": "cart",
            "hostnames": ["cart.shop.svc.cluster.local"],
            "ports": [{"number": 8080, "name": "http"}],
            "serviceType": "INTERNAL",
            "externalAddresses": [],
            "state": "OBSERVED",
            "spiffeIds": [],
        }
    ]


@pytest.mark.parametrize(
    ("names", "field"),
    [
        (["shop"], "selector.names[0]"),
        (["east/shop", "east/sh*op"], "selector.names[1]"),
        (["*shop/x"], "selector.names[0]"),
        (["east/shop/x"], "selector.names[0]"),
        (["east/"], "selector.names[0]"),
        (["east/**"], "selector.names[0]"),
        ([], "selector.names"),
    ],
)
def test_invalid_patterns_are_refused(
    admin: httpx.Client, org: str, names: list[str], field: str
) -> None:
    got = err(
        admin.post(LOOKUP, json={"parent": f"organizations/{org}", "selector": {"names": names}}),
        400,
    )
    assert got["details"][1]["fieldViolations"][0]["field"] == field, got


def test_bad_parents(admin: httpx.Client, org: str) -> None:
    sel = {"names": ["*/*"]}
    err(admin.post(LOOKUP, json={"parent": "users/admin", "selector": sel}), 400)
    err(admin.post(LOOKUP, json={"parent": "not an fqn", "selector": sel}), 400)
    err(
        admin.post(LOOKUP, json={"parent": f"organizations/{org}/tenants/none", "selector": sel}),
        404,
    )
    err(admin.post(LOOKUP, json={"selector": sel}), 400)


def test_results_are_filtered_by_read(
    server: MgmtServer, admin: httpx.Client, reported: str, make_user: Callable[..., httpx.Client]
) -> None:
    org = reported
    body = {"parent": f"organizations/{org}", "selector": {"names": ["*/shop"]}}
    with server.client() as anonymous:
        err(anonymous.post(LOOKUP, json=body), 401, "UNAUTHENTICATED")
    name = unique("u")
    user_fqn = f"organizations/{org}/users/{name}"
    with make_user(org, name) as user:
        err(user.post(LOOKUP, json=body), 403, "PERMISSION_DENIED")  # no READ on the parent
        ok(admin.post(f"/v2/organizations/{org}/tenants", json={"name": "t", "tenant": {}}))
        grant(admin, f"organizations/{org}/tenants/t", "rbac/reader", {"user": user_fqn})
        # READ on the parent, none on the clusters: nothing is shown
        assert _hits(user, f"organizations/{org}/tenants/t", "*/shop") == []
        grant(admin, f"organizations/{org}/clusters/west", "rbac/reader", {"user": user_fqn})
        assert _hits(user, f"organizations/{org}/tenants/t", "*/shop") == ["west/shop/cart"]
        grant(admin, f"organizations/{org}", "rbac/reader", {"user": user_fqn})
        assert _hits(user, f"organizations/{org}", "*/shop") == [
            "east/shop/cart",
            "east/shop/web",
            "west/shop/cart",
        ]


def _page(client: httpx.Client, org: str, token: str, size: int, *names: str) -> dict[str, Any]:
    body = {
        "parent": f"organizations/{org}",
        "selector": {"names": list(names)},
        "pageSize": size,
        "pageToken": token,
    }
    page: dict[str, Any] = ok(client.post(LOOKUP, json=body))
    return page


def test_results_are_paged_in_a_stable_order(
    server: MgmtServer, admin: httpx.Client, reported: str
) -> None:
    org = reported
    # "east-2" sorts after "east" as a cluster, but its service FQNs sort before
    # east's as strings: paging must follow the cluster order all the same.
    east2 = create_cluster(admin, org, "east-2")
    with agent(server, east2) as a:
        ok(report(a, east2, namespace("shop", "b", "a")))
    everything = _page(admin, org, "", 1000, "*/*")
    assert everything["nextPageToken"] == ""
    order = [
        (s["cluster"].rsplit("/", 1)[1], s["namespace"], s["shortName"])
        for s in everything["services"]
    ]
    assert order == [
        ("east", "payments", "pay"),
        ("east", "shop", "cart"),
        ("east", "shop", "web"),
        ("east", "shop-v2", "cart"),
        ("east-2", "shop", "a"),
        ("east-2", "shop", "b"),
        ("west", "shop", "cart"),
    ]
    for size in (1, 2, 3, 7):
        seen: list[dict[str, Any]] = []
        token = ""
        while True:
            page = _page(admin, org, token, size, "*/*")
            assert 1 <= len(page["services"]) <= size
            seen += page["services"]
            token = page["nextPageToken"]
            if not token:
                break
        assert seen == everything["services"], size
    # a selector that names clusters pages over those alone
    named = _page(admin, org, "", 1, "west/*", "east-2/shop")
    assert [s["shortName"] for s in named["services"]] == ["a"]
    rest = _page(admin, org, named["nextPageToken"], 5, "west/*", "east-2/shop")
    assert [s["shortName"] for s in rest["services"]] == ["b", "cart"]
    assert rest["nextPageToken"] == ""


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"pageSize": 0}, "pageSize"),
        ({"pageSize": 1001}, "pageSize"),
        ({"pageToken": "%%%"}, "pageToken"),
        (
            # a well-formed token of another organization
            {"pageToken": encode_token("organizations/other/clusters/e/namespaces/n/services/s")},
            "pageToken",
        ),
    ],
)
def test_bad_paging_is_refused(
    admin: httpx.Client, org: str, extra: dict[str, Any], field: str
) -> None:
    body = {"parent": f"organizations/{org}", "selector": {"names": ["*/*"]}, **extra}
    got = err(admin.post(LOOKUP, json=body), 400, "INVALID_ARGUMENT")
    assert field in got["message"], got
