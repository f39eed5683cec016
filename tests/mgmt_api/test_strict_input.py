"""Bad input gets a 400 that names the field, and changes nothing.

JSON types are strict (a wrong type is never coerced), strings carry no
control characters, and a body that is not JSON, not UTF-8, too deep or too
large is refused with the one error body every failure uses.
"""

from __future__ import annotations

import httpx
import pytest

from tests.mgmt_api.harness import MgmtServer, err, ok, unique
from tests.mgmt_api.openapi_ops import operations


def _field(body: dict[str, object]) -> str:
    details = body["details"]
    assert isinstance(details, list)
    violations = [d for d in details if d.get("@type", "").endswith("BadRequest")]
    assert violations, body
    return str(violations[0]["fieldViolations"][0]["field"])


@pytest.mark.parametrize("value", ["yes", "on", "1", 1, "true", None])
def test_cleanup_apply_must_be_a_json_boolean_and_nothing_is_deleted(
    admin: httpx.Client, org: str, value: object
) -> None:
    """``{"apply": "yes"}`` once applied the cleanup; now it is refused, and the
    unused profile it would have deleted is still there."""
    ok(admin.post(f"/v2/organizations/{org}/profiles", json={"name": "unused", "profile": {}}))
    body = err(admin.post(f"/v2/organizations/{org}/cleanupresources", json={"apply": value}), 400)
    assert _field(body) == "apply"
    assert "boolean" in body["message"]
    ok(admin.get(f"/v2/organizations/{org}/profiles/unused"))


@pytest.mark.parametrize(
    ("path_of", "body_of", "field"),
    [
        (
            lambda o: "/v2/organizations",
            lambda o: {
                "name": unique("o"),
                "organization": {"deletionProtectionEnabled": "yes"},
            },
            "organization.deletionProtectionEnabled",
        ),
        (
            lambda o: f"/v2/organizations/{o}/clusters",
            lambda o: {"name": "c", "cluster": {"tier1Cluster": "true"}},
            "cluster.tier1Cluster",
        ),
        (
            lambda o: f"/v2/organizations/{o}/clusters",
            lambda o: {"name": "c", "cluster": {"displayName": 7}},
            "cluster.displayName",
        ),
        (
            lambda o: f"/v2/organizations/{o}/clusters",
            lambda o: {
                "name": "c",
                "cluster": {"labels": {"team": 1}},
            },
            "cluster.labels.team",
        ),
        (
            lambda o: f"/v2/organizations/{o}/clusters",
            lambda o: {"name": "c", "cluster": {"extAuthz": {"failureModeAllow": "true"}}},
            "cluster.extAuthz.failureModeAllow",
        ),
        (
            lambda o: f"/v2/organizations/{o}/clusters",
            lambda o: {"name": "c", "cluster": {"circuitBreakers": {"maxRequests": "100"}}},
            "cluster.circuitBreakers.maxRequests",
        ),
    ],
)
def test_wrong_json_types_are_refused_naming_the_field(
    admin: httpx.Client, org: str, path_of: object, body_of: object, field: str
) -> None:
    assert callable(path_of) and callable(body_of)
    body = err(admin.post(path_of(org), json=body_of(org)), 400, "INVALID_ARGUMENT")
    assert _field(body) == field
    assert err(admin.get(f"/v2/organizations/{org}/clusters/c"), 404)


def test_a_traffic_policy_number_given_as_a_string_is_refused(
    admin: httpx.Client, org: str
) -> None:
    ok(admin.post(f"/v2/organizations/{org}/clusters", json={"name": "c", "cluster": {}}))
    rules = [{"limit": {"requests": "3", "unit": "Minute"}}]
    policy = {
        "spec": {
            "targetRef": {"name": "web"},
            "rateLimit": {"type": "Global", "global": {"rules": rules}},
        }
    }
    body = err(
        admin.post(
            f"/v2/organizations/{org}/clusters/c/backendtrafficpolicies",
            json={"name": "default.web", "backendTrafficPolicy": policy},
        ),
        400,
    )
    assert "requests" in _field(body)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("nul\x00inside", "organization.description"),
        ("escape\x1b[2J", "organization.description"),
        ("bell\x07", "organization.displayName"),
    ],
)
def test_control_characters_are_refused_naming_the_field(
    admin: httpx.Client, text: str, where: str
) -> None:
    key = where.rsplit(".", 1)[1]
    name = unique("o")
    body = err(
        admin.post("/v2/organizations", json={"name": name, "organization": {key: text}}), 400
    )
    assert _field(body) == where
    assert "control character" in body["message"]
    err(admin.get(f"/v2/organizations/{name}"), 404)


def test_tabs_and_newlines_are_fine_in_free_text(admin: httpx.Client) -> None:
    name = unique("o")
    text = "line one\n\tline two\r\n"
    ok(admin.post("/v2/organizations", json={"name": name, "organization": {"description": text}}))
    assert ok(admin.get(f"/v2/organizations/{name}"))["description"] == text


def test_a_body_without_the_json_content_type_is_told_so(admin: httpx.Client) -> None:
    for headers in (
        {"content-type": "application/x-www-form-urlencoded"},
        {"content-type": "text/plain"},
    ):
        body = err(admin.post("/v2/organizations", content=b'{"name": "x"}', headers=headers), 400)
        assert "Content-Type: application/json" in body["message"], body
        assert headers["content-type"] in body["message"]


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b'{"name": "\xff\xfe"}', "not valid UTF-8"),
        (b"[" * 5000 + b"]" * 5000, "nested deeper"),
        (b'{"a": ' * 70 + b"1" + b"}" * 70, "nested deeper"),
        (b'{"name": "a", "name": "b"}', "duplicate key"),
        (b'{"name": NaN}', "NaN"),
        (b'{"name": ', "malformed JSON"),
    ],
)
def test_unreadable_json_is_explained(admin: httpx.Client, raw: bytes, says: str) -> None:
    body = err(
        admin.post("/v2/organizations", content=raw, headers={"content-type": "application/json"}),
        400,
        "INVALID_ARGUMENT",
    )
    assert says in body["message"], body
    assert "error parsing the body" not in body["message"]


@pytest.mark.parametrize("chunked", [False, True])
def test_an_oversized_body_gets_the_same_error_body(server: MgmtServer, chunked: bool) -> None:
    big = b'{"name": "' + b"x" * (1024 * 1024 + 10) + b'"}'
    with server.admin() as client:
        content = iter([big[:1000], big[1000:]]) if chunked else big
        response = client.post(
            "/v2/organizations", content=content, headers={"content-type": "application/json"}
        )
    body = err(response, 400, "INVALID_ARGUMENT")
    assert "larger than" in body["message"]


@pytest.mark.parametrize("value", ["yes", "1", "on", "True", "TRUE", ""])
def test_force_must_be_true_or_false_and_a_protected_org_stays(
    admin: httpx.Client, org: str, value: str
) -> None:
    """``DELETE /v2/organizations/x?force=yes`` once deleted a protected organization."""
    path = f"/v2/organizations/{org}"
    ok(admin.put(path, json={**ok(admin.get(path)), "deletionProtectionEnabled": True}))
    body = err(admin.delete(path, params={"force": value}), 400, "INVALID_ARGUMENT")
    assert _field(body) == "force"
    assert body["message"].startswith("force: must be true or false")
    ok(admin.get(path))
    err(admin.delete(path, params={"force": "false"}), 400, "FAILED_PRECONDITION")
    ok(admin.delete(path, params={"force": "true"}))


def test_every_boolean_query_flag_takes_only_true_or_false(admin: httpx.Client) -> None:
    """Each boolean query parameter of the OpenAPI refuses ``yes`` naming itself
    (before the route looks for the object, so nothing need exist)."""
    seen: set[str] = set()
    for op in operations(admin):
        for param in op.parameters("query"):
            if param["schema"].get("type") != "boolean":
                continue
            name = param["name"]
            seen.add(name)
            response = admin.request(op.method, op.path(), params={name: "yes"})
            assert response.status_code == 400, (str(op), response.text)
            assert _field(response.json()) == name, str(op)
    assert {"force", "fetchWorkloads", "includeInstallTemplate"} <= seen
