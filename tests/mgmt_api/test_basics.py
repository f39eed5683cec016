"""Transport contract: public endpoints, auth required, the one error body."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx

from tests.mgmt_api.harness import MgmtServer, err, ok, unique
from tests.mgmt_api.openapi_ops import operations


def test_oidc_configuration_is_public(server: MgmtServer) -> None:
    with server.client() as c:
        assert ok(c.get("/v2/oidc/configuration")) == {"enabled": False}
        assert ok(c.get("/healthz"))["status"] == "ok"
        assert ok(c.get("/readyz"))["status"] == "ok"


def test_everything_else_needs_credentials(server: MgmtServer) -> None:
    with server.client() as c:
        body = err(c.get("/v2/organizations"), 401, "UNAUTHENTICATED")
        assert body["code"] == 16
        err(c.get("/metrics"), 401)
        err(c.get("/v2/admin/root/policy"), 401)
    with server.client(auth=("admin", "wrong-password")) as c:
        err(c.get("/v2/organizations"), 401, "UNAUTHENTICATED")
    with server.client(headers={"Authorization": "Bearer not.a.jwt"}) as c:
        err(c.get("/v2/organizations"), 401, "UNAUTHENTICATED")


def test_openapi_is_served_and_documents_errors(server: MgmtServer) -> None:
    with server.client() as c:
        err(c.get("/v2/openapi.json"), 401)
    with server.admin() as c:
        spec = ok(c.get("/v2/openapi.json"))
        assert c.get("/v2/docs").status_code == 200
    op = spec["paths"]["/v2/organizations/{organization}/clusters"]["post"]
    assert "422" not in op["responses"]
    assert op["responses"]["default"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "ErrorBody"
    )


def test_names_must_be_dns_labels(admin: httpx.Client) -> None:
    body = err(
        admin.post("/v2/organizations", json={"name": "Bad_Name", "organization": {}}),
        400,
        "INVALID_ARGUMENT",
    )
    assert body["message"].startswith("name:")
    body = err(admin.get("/v2/organizations/UPPER"), 400)
    assert "organization" in body["message"]


def test_malformed_bodies_are_400_never_500(admin: httpx.Client, server: MgmtServer) -> None:
    body = err(
        admin.post(
            "/v2/organizations", content=b"{not json", headers={"content-type": "application/json"}
        ),
        400,
    )
    assert "malformed JSON" in body["message"]
    body = err(
        admin.post("/v2/organizations", json={"name": unique(), "organization": {"bogus": 1}}), 400
    )
    assert body["message"] == "organization.bogus: unknown field"
    body = err(admin.post("/v2/organizations", json={"organization": {}}), 400)
    assert body["message"] == "name: is required"
    err(admin.post("/v2/organizations", json=[1, 2]), 400)
    big = b'{"name": "x", "organization": {"description": "' + b"a" * (2 * 1024 * 1024) + b'"}}'
    body = err(
        admin.post("/v2/organizations", content=big, headers={"content-type": "application/json"}),
        400,
    )
    assert "larger than" in body["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit must still hold
        for _ in range(40):
            yield b"a" * 65536

    err(
        admin.post(
            "/v2/organizations", content=chunks(), headers={"content-type": "application/json"}
        ),
        400,
    )
    body = err(admin.get("/v2/organizations", params={"pageSize": "lots"}), 400)
    assert body["message"].startswith("pageSize:")
    err(admin.get("/v2/nothing/here"), 404, "NOT_FOUND")


def test_json_is_camel_case_with_metadata(admin: httpx.Client) -> None:
    name = unique()
    created = ok(
        admin.post(
            "/v2/organizations",
            json={
                "name": name,
                "organization": {
                    "displayName": "D",
                    "systemNamespaces": ["kube-system"],
                    "deletionProtectionEnabled": False,
                },
            },
        )
    )
    assert created["fqn"] == f"organizations/{name}"
    for key in ("displayName", "etag", "createTime", "updateTime", "systemNamespaces"):
        assert key in created
    got = ok(admin.get(f"/v2/organizations/{name}"))
    assert got == created
    err(
        admin.post("/v2/organizations", json={"name": name, "organization": {}}),
        409,
        "ALREADY_EXISTS",
    )


def test_metrics_are_exposed_with_route_templates(admin: httpx.Client, org: str) -> None:
    admin.get(f"/v2/organizations/{org}")
    text = admin.get("/metrics").text
    assert 'route="/v2/organizations/{organization}"' in text
    assert f'organizations/{org}"' not in text


def test_session_tokens(server: MgmtServer) -> None:
    with server.admin() as c:
        token = ok(c.post("/v2/auth/token"))
    assert token["tokenType"] == "Bearer" and token["subject"] == "users/admin"
    with server.client(headers={"Authorization": f"Bearer {token['accessToken']}"}) as c:
        ok(c.get("/v2/organizations"))
        err(c.post("/v2/auth/token"), 401)  # only Basic credentials can be exchanged


def test_first_start_generates_and_prints_the_admin_password_once() -> None:
    srv = MgmtServer(admin_password=None).start()
    try:
        lines = [ln for ln in srv.log_path.read_text().splitlines() if "generated password" in ln]
        assert len(lines) == 1
        password = lines[0].rsplit(": ", 1)[1].strip()
        with srv.client(auth=("admin", password)) as c:
            ok(c.get("/v2/admin/root/policy"))
        srv.stop()
        srv.start()  # same store: no second password, the first still works
        lines = [ln for ln in srv.log_path.read_text().splitlines() if "generated password" in ln]
        assert len(lines) == 1
        with srv.client(auth=("admin", password)) as c:
            ok(c.get("/v2/organizations"))
        assert password not in "".join(
            ln for ln in srv.log_path.read_text().splitlines() if "generated password" not in ln
        )
    finally:
        srv.close()


def test_every_operation_authenticates_before_reading_anything(server: MgmtServer) -> None:
    """An anonymous caller gets 401 from every non-public operation, whatever its
    query and body: never the 400 that would describe the schema to it."""
    with server.admin() as admin:
        ops = list(operations(admin))
    guarded = [op for op in ops if not op.public]
    assert len(guarded) > 200
    garbage = {
        "content": b'{"name": \x01 not json',
        "headers": {"content-type": "application/json"},
    }
    for credentials in ({}, {"Authorization": "Bearer not.a.jwt"}):
        with server.client(headers=credentials) as anon:
            for op in guarded:
                query = {p["name"]: "\x01yes" for p in op.parameters("query")}
                response = anon.request(
                    op.method,
                    op.path(),
                    params=query,
                    **(garbage if op.has_body else {}),  # type: ignore[arg-type]
                )
                assert response.status_code == 401, (str(op), response.text)
                assert response.json()["code"] == 16, str(op)
                assert response.headers["www-authenticate"], str(op)
            for op in ops:  # the login endpoints need no credentials: OIDC is off here
                if op.public:
                    assert anon.request(op.method, op.path()).status_code != 401, str(op)


def _strings(schema: dict[str, Any], components: dict[str, Any], seen: set[str]) -> Iterator[Any]:
    """Every string schema (and map-key schema) a request body may hold, but
    inside a ``spec``: the Gateway API documents that the policy compiler's own
    models check (docs/api.md says what is left to state there)."""
    ref = schema.get("$ref")
    if ref is not None:
        name = ref.rsplit("/", 1)[-1]
        if name not in seen:
            seen.add(name)
            yield from _strings(components[name], components, seen)
        return
    if schema.get("type") == "string":
        yield schema
    if schema.get("type") == "object" and schema.get("additionalProperties", False) is not False:
        yield {"type": "string", **schema.get("propertyNames", {})}
    children = [schema.get("items"), schema.get("additionalProperties")]
    children += [v for k, v in schema.get("properties", {}).items() if k != "spec"]
    children += schema.get("anyOf", []) + schema.get("oneOf", []) + schema.get("allOf", [])
    for child in children:
        if isinstance(child, dict):
            yield from _strings(child, components, seen)


def test_openapi_states_what_the_server_enforces(admin: httpx.Client) -> None:
    """Etags on updates, DNS-1123 names, and no control characters: generated
    clients and fuzzers read these from the document."""
    spec = ok(admin.get("/v2/openapi.json"))
    components = spec["components"]["schemas"]
    updates = 0
    for op in operations(admin):
        for param in op.parameters("path"):
            if param["name"] != "keyId":  # a key's id, not a name
                assert "pattern" in param["schema"], (str(op), param["name"])
        if not op.has_body:
            continue
        body = op.spec["requestBody"]["content"]["application/json"]["schema"]
        model = components[body["$ref"].rsplit("/", 1)[-1]] if "$ref" in body else body
        if op.method == "put" and "etag" in model.get("properties", {}):
            updates += 1
            assert "etag" in model.get("required", []), str(op)
        if op.spec["operationId"].startswith("Create") and "name" in model.get("properties", {}):
            assert model["properties"]["name"]["pattern"].startswith("^[a-z0-9]"), str(op)
        for string in _strings(body, components, set()):
            assert string.keys() & {"pattern", "enum", "const"}, (str(op), string)
    assert updates > 40
